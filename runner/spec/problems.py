"""Problems found in a spec, and how they are shown."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Severity(str, Enum):
    error = "error"  # the job cannot work: nothing is started
    warning = "warning"  # the job can run, but probably not as meant
    notice = "notice"  # the runner decided something the user should know


@dataclass(frozen=True)
class Problem:
    """One finding about a spec: which key, what is wrong (with the arithmetic), what to do."""

    key: str
    message: str
    hint: str = ""
    severity: Severity = Severity.error

    def render(self) -> str:
        text = f"{self.severity.value}: {self.key}: {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity is Severity.error]


_ORDER = {Severity.error: 0, Severity.warning: 1, Severity.notice: 2}


def render_problems(problems: list[Problem]) -> str:
    """Errors first, then warnings, then notices (stable within each)."""
    return "\n".join(p.render() for p in sorted(problems, key=lambda p: _ORDER[p.severity]))
