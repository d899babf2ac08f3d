"""runner.spec.problems: a problem says its key, what is wrong and what to do, and the worst come first."""

from __future__ import annotations

import pytest

from runner.spec.problems import Problem, Severity, errors, render_problems

pytestmark = pytest.mark.unit


def test_a_problem_renders_its_severity_key_message_and_hint() -> None:
    assert Problem("topology.nodes", "must be at least 1, got 0", "topology=1x2").render() == \
        "error: topology.nodes: must be at least 1, got 0\n    hint: topology=1x2"
    assert Problem("init", "the runner chose env", severity=Severity.notice).render() == "notice: init: the runner chose env"


def test_errors_first_then_warnings_then_notices_each_in_order() -> None:
    problems = [Problem("a", "n1", severity=Severity.notice), Problem("b", "w1", severity=Severity.warning),
                Problem("c", "e1"), Problem("d", "w2", severity=Severity.warning), Problem("e", "e2")]
    assert render_problems(problems).splitlines() == ["error: c: e1", "error: e: e2", "warning: b: w1", "warning: d: w2",
                                                      "notice: a: n1"]
    assert errors(problems) == [problems[2], problems[4]]
    assert render_problems([]) == ""
