"""An error that says what is wrong and what to do: the runner's refusals of a host's setup (its network, its
rendezvous) print both, ``error: <what>: <message>; hint: <hint>``."""

from __future__ import annotations


class HintedError(Exception):
    """What is wrong (``message``) and what to do (``hint``), both also in str()."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(f"{message}; hint: {hint}" if hint else message)
        self.message = message
        self.hint = hint
