"""runner.common.errors: an error that carries what is wrong and what to do, both in its words."""

from __future__ import annotations

import pytest

from runner.common.errors import HintedError
from runner.worker.network import NetworkError
from runner.worker.rendezvous import RendezvousError

pytestmark = pytest.mark.unit


def test_the_message_and_the_hint_are_kept_and_said_together() -> None:
    e = HintedError("port 29500 is taken", "leave init.master_port=0")
    assert (e.message, e.hint, str(e)) == ("port 29500 is taken", "leave init.master_port=0",
                                           "port 29500 is taken; hint: leave init.master_port=0")
    assert str(HintedError("no hint")) == "no hint"
    assert issubclass(NetworkError, HintedError) and issubclass(RendezvousError, HintedError)
    assert not issubclass(NetworkError, RendezvousError)  # each is refused under its own name (network:, init:)
