"""runner.launchers.elastic.rounds: the rounds of an ssh job that outlives its hosts, decided without processes: a fake
launch whose rounds end as each test says (the real ones, on namespace hosts: tests/e2e/test_lost_hosts.py)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from conftest import make_spec
from runner.common import exits
from runner.launchers.elastic.rounds import AttemptsOnHosts, _RoundReports
from runner.launchers.ssh.session import Ended
from runner.records.paths import RunPaths
from runner.spec.schema import HostConfig, JobConfig
from runner.worker.agent_reports import AttemptBegan, StepReached

pytestmark = pytest.mark.unit


def spec_of(names: list[str], *, min_nodes: int | None = 2, spares: tuple[str, ...] = (),
            max_restarts: int = 3) -> JobConfig:
    spec = make_spec(devices=[1] * len(names), names=names, launcher="ssh")
    topology = dataclasses.replace(spec.topology, min_nodes=min_nodes,
                                   spares=[HostConfig(name=n, devices=1) for n in spares])
    return dataclasses.replace(spec, topology=topology, run_id="r1",
                               launcher=dataclasses.replace(spec.launcher, max_restarts=max_restarts))


@dataclass
class Round:
    """What a round does: the reports its hosts send, then how its sessions end."""

    reports: list = field(default_factory=list)
    lost: tuple[int, ...] = ()
    code: int = exits.OK
    signalled: int | None = None
    back: tuple[str, ...] = ()  # lost hosts that answered again meanwhile: the round stopped at a checkpoint for them
    spares_ready: tuple[str, ...] = ()  # spares not ready at the start that answered meanwhile


@dataclass
class FakeLaunch:
    """An ssh launch whose rounds are :class:`Round` s: it records the hosts of each round and whether it was checked."""

    spec: JobConfig
    paths: RunPaths
    rounds: list[Round]
    seen: list[tuple[tuple[str, ...], int]] = field(default_factory=list)  # (hosts, attempt) of each round run
    failing: dict[int, dict[str, str]] = field(default_factory=dict)  # attempt -> the hosts failing its check, and why
    replaced: list[list[str]] = field(default_factory=list)  # what each round was to replace of the round before
    tried: list[tuple[tuple[str, float], ...]] = field(default_factory=list)  # the lost hosts each round may take back

    @property
    def plan(self) -> SimpleNamespace:
        """What the rounds read of a plan: its job's spec and hosts, its world size (one process a host)."""
        hosts = tuple(SimpleNamespace(label=h.name) for h in self.spec.topology.hosts)
        return SimpleNamespace(job=SimpleNamespace(spec=self.spec, hosts=hosts), world_size=len(hosts))

    def sessions(self, on_report=None, replacing=(), returns=None) -> tuple[Ended, list[str]]:
        self.seen.append((tuple(h.name for h in self.spec.topology.hosts), self.paths.attempt))
        now = self.rounds.pop(0)
        for report in now.reports:
            on_report(0, report)
        lost = frozenset(now.lost)
        self.replaced.append(list(replacing))
        back = now.back if returns is not None else ()
        ended = Ended(exits.FAILED if lost else now.code, now.signalled, f"host {min(lost)} was lost" if lost else None,
                      lost, 1000.0 if lost else None, {i: "ssh exited 255" for i in lost}, joining=back,
                      joining_at=2000.0 if back else None)
        return ended, [f"logs/rank{len(self.seen)}.log"]  # what this round "took back"

    def returns(self, candidates):
        self.tried.append(tuple((c.host.name, c.due) for c in candidates))
        return _NoReturns(self.rounds[0].spares_ready) if candidates else None

    def on(self, spec: JobConfig, attempt: int) -> FakeLaunch:
        return FakeLaunch(spec, dataclasses.replace(self.paths, attempt=attempt), self.rounds, self.seen,
                          self.failing, self.replaced, self.tried)

    def left_out(self):
        failing = self.failing.get(self.paths.attempt, {})
        return {i: why for i, h in enumerate(self.spec.topology.hosts) if (why := failing.get(h.name)) is not None}


@dataclass
class _NoReturns:
    """A watch of lost hosts for the fake launch: what came back is the round's to say (Round.back, spares_ready)."""

    spares_ready: tuple[str, ...] = ()

    def start(self):
        return self

    def ready(self) -> tuple[str, ...]:
        return ()

    def spares(self) -> tuple[str, ...]:
        return self.spares_ready

    def close(self) -> None:
        pass


def changes(paths: RunPaths) -> list[dict]:
    return [json.loads(line) for line in paths.membership.read_text().splitlines()] if paths.membership.exists() \
        else []


def launch(tmp_path, spec: JobConfig, rounds: list[Round]) -> tuple[FakeLaunch, object]:
    first = FakeLaunch(spec, RunPaths(tmp_path, "r1"), rounds)
    return first, AttemptsOnHosts(first).run()


def steps(attempt: int, resumed: int, *at: int) -> list:
    return [AttemptBegan(attempt=attempt, at=0.0), *(StepReached(attempt=attempt, step=s, resumed=resumed, at=0.0)
                                                      for s in at)]


def test_a_round_without_a_loss_is_the_jobs_end(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"]), [Round(reports=steps(0, 0, 1, 2))])
    assert (outcome.code, first.seen, changes(first.paths)) == (exits.OK, [(("a", "b", "c"), 0)], [])


def test_a_lost_host_starts_the_next_attempt_on_the_others_and_records_the_change(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"]), [
        Round(reports=steps(0, 0, 10, 20, 28), lost=(1,)), Round(reports=steps(1, 20, 21, 22, 40))])
    assert outcome.code == exits.OK and outcome.plan.world_size == 2
    assert first.seen == [(("a", "b", "c"), 0), (("a", "c"), 1)]
    assert first.replaced == [[], ["logs/rank1.log"]]  # the second round's records replace the first's
    (change,) = changes(first.paths)
    assert {k: change[k] for k in ("attempt", "next_attempt", "before", "after", "lost", "cause", "last_step",
                                   "resumed_from", "steps_lost", "world_size_before", "world_size_after")} == {
        "attempt": 0, "next_attempt": 1, "before": ["a", "b", "c"], "after": ["a", "c"], "lost": ["b"],
        "cause": "b: ssh exited 255", "last_step": 28, "resumed_from": 20, "steps_lost": 8, "world_size_before": 3,
        "world_size_after": 2}
    assert change["to_first_step_s"] is not None


def test_restarts_inside_a_round_count_and_the_next_attempt_follows_the_last(tmp_path) -> None:
    """The hosts restarted once by themselves (a rank failed) before the loss: the next round is attempt 2."""
    first, _ = launch(tmp_path, spec_of(["a", "b", "c"]), [
        Round(reports=[*steps(0, 0, 5), *steps(1, 4, 6)], lost=(2,)), Round()])
    assert [attempt for _, attempt in first.seen] == [0, 2]
    assert changes(first.paths)[0]["resumed_from"] is None  # the round said no step: nothing to tell


def test_a_spare_takes_the_lost_hosts_place(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"], min_nodes=None, spares=("s",)),
                            [Round(lost=(0,)), Round()])
    assert first.seen == [(("a", "b", "c"), 0), (("b", "c", "s"), 1)]
    assert changes(first.paths)[0]["spares"] == ["s"] and outcome.plan.world_size == 3


def test_fewer_hosts_than_min_nodes_end_the_job_with_that_cause(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"]), [Round(lost=(1, 2))])
    assert outcome.code == exits.FAILED
    assert outcome.cause == "host 1 was lost; 1 host(s) left of 3, fewer than topology.min_nodes=2 (no spare left)"
    (change,) = changes(first.paths)
    assert (change["next_attempt"], change["after"], change["lost"]) == (None, [], ["b", "c"])


def test_the_restarts_used_end_the_job(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c", "d"], max_restarts=1),
                            [Round(lost=(3,)), Round(lost=(2,))])
    assert [attempt for _, attempt in first.seen] == [0, 1]
    assert outcome.code == exits.FAILED and outcome.cause.endswith("; launcher.max_restarts=1 used")
    assert [c["next_attempt"] for c in changes(first.paths)] == [1, None]


def test_a_signal_ends_the_job_whatever_was_lost(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"]), [Round(lost=(2,), signalled=2)])
    assert outcome.signalled == 2 and first.seen == [(("a", "b", "c"), 0)] and changes(first.paths) == []


def test_a_host_that_fails_the_check_before_the_next_round_is_left_out_and_the_job_goes_on(tmp_path) -> None:
    """d lost in attempt 0; b then fails the check before attempt 1 (its data network, say): attempt 1 runs on a and
    c, and the one change recorded names both, and why."""
    first = FakeLaunch(spec_of(["a", "b", "c", "d"]), RunPaths(tmp_path, "r1"), [
        Round(reports=steps(0, 0, 10), lost=(3,)), Round(reports=steps(1, 10, 11))],
        failing={1: {"b": "it failed the check: host 0's rendezvous: no answer"}})
    outcome = AttemptsOnHosts(first).run()
    assert outcome.code == exits.OK and first.seen == [(("a", "b", "c", "d"), 0), (("a", "c"), 1)]
    (change,) = changes(first.paths)
    assert (change["before"], change["after"], change["lost"], change["world_size_after"]) == (
        ["a", "b", "c", "d"], ["a", "c"], ["d", "b"], 2), change
    assert change["cause"] == ("d: ssh exited 255; b: it failed the check: host 0's rendezvous: no answer (before "
                               "attempt 2)")


def test_too_few_hosts_passing_the_check_end_the_job_with_that_cause(tmp_path) -> None:
    first = FakeLaunch(spec_of(["a", "b", "c"]), RunPaths(tmp_path, "r1"), [Round(lost=(2,))],
                       failing={1: {"b": "it failed the check: ssh could not log in"}})
    outcome = AttemptsOnHosts(first).run()
    assert outcome.code == exits.FAILED and outcome.cause.endswith("fewer than topology.min_nodes=2 (no spare left)")
    assert "b: it failed the check: ssh could not log in (before attempt 2)" in outcome.cause
    (change,) = changes(first.paths)
    assert (change["next_attempt"], change["after"], change["lost"]) == (None, [], ["c", "b"]), change


def test_what_a_round_heard() -> None:
    heard = _RoundReports(attempt=0)
    for report in (*steps(0, 0, 1, 2), *steps(1, 2, 2, 3)):
        heard.heard(0, report)
    assert (heard.attempt, heard.last_step, heard.resumed) == (1, {0: 2, 1: 3}, {0: 0, 1: 2})
    assert set(heard.first_step_at) == {0, 1}  # attempt 1's first step is 3 (step 2 is where it resumed)


def test_a_lost_host_that_answers_again_joins_after_the_others_at_the_next_checkpoint(tmp_path) -> None:
    """b lost in attempt 0; while attempt 1 runs on a and c, b answers: that round stops at a checkpoint (step 30) and
    attempt 2 runs on a, c, b, the world size back to 3; each change a line of membership.jsonl."""
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"]), [
        Round(reports=steps(0, 0, 10, 20, 28), lost=(1,)), Round(reports=steps(1, 20, 21, 30), back=("b",)),
        Round(reports=steps(2, 30, 31, 40))])
    assert outcome.code == exits.OK and outcome.plan.world_size == 3
    assert first.seen == [(("a", "b", "c"), 0), (("a", "c"), 1), (("a", "c", "b"), 2)]
    assert [[name for name, _ in tried] for tried in first.tried] == [[], ["b"], []]  # only while b is lost
    lost, joined = changes(first.paths)
    assert (lost["lost"], lost["joined"], lost["world_size_after"]) == (["b"], [], 2)
    assert {k: joined[k] for k in ("attempt", "next_attempt", "before", "after", "lost", "joined", "cause",
                                   "last_step", "resumed_from", "steps_lost", "world_size_before",
                                   "world_size_after", "time")} == {
        "attempt": 1, "next_attempt": 2, "before": ["a", "c"], "after": ["a", "c", "b"], "lost": [], "joined": ["b"],
        "cause": "b: answered again (launcher.ssh.rejoin_s)", "last_step": 30, "resumed_from": 30, "steps_lost": 0,
        "world_size_before": 2, "world_size_after": 3, "time": 2000.0}


def test_no_host_is_tried_again_without_a_restart_left_to_take_it_with(tmp_path) -> None:
    first, outcome = launch(tmp_path, spec_of(["a", "b", "c"], max_restarts=1), [
        Round(lost=(1,)), Round(back=("b",))])
    assert outcome.code == exits.OK and first.seen == [(("a", "b", "c"), 0), (("a", "c"), 1)]
    assert first.tried == [()]  # attempt 1 is the last the restarts allow: no watch


def test_a_spare_not_ready_at_the_start_is_kept_once_it_answers_and_takes_a_lost_hosts_place(tmp_path) -> None:
    """s failed the check of the start: tried while attempt 0 runs, it answers (kept ready), and b's loss takes it."""
    spec = spec_of(["a", "b", "c"], min_nodes=None, spares=("s",))
    first = FakeLaunch(spec, RunPaths(tmp_path, "r1"), [Round(lost=(1,), spares_ready=("s",)), Round()])
    outcome = AttemptsOnHosts(first, unready=["s"]).run()
    assert outcome.code == exits.OK and first.seen == [(("a", "b", "c"), 0), (("a", "c", "s"), 1)]
    assert [name for name, _ in first.tried[0]] == ["s"] and changes(first.paths)[0]["spares"] == ["s"]


def test_a_spare_never_ready_leaves_a_lost_hosts_place_empty(tmp_path) -> None:
    spec = spec_of(["a", "b", "c"], min_nodes=2, spares=("s",))
    first = FakeLaunch(spec, RunPaths(tmp_path, "r1"), [Round(lost=(1,)), Round()])
    outcome = AttemptsOnHosts(first, unready=["s"]).run()
    assert outcome.code == exits.OK and first.seen == [(("a", "b", "c"), 0), (("a", "c"), 1)]


def test_a_ready_spare_grows_the_job_where_max_nodes_leaves_room(tmp_path) -> None:
    spec = spec_of(["a", "b"], min_nodes=1, spares=("s",))
    spec = dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, max_nodes=3))
    first, outcome = launch(tmp_path, spec, [Round(reports=steps(0, 0, 5), back=("s",)), Round()])
    assert outcome.code == exits.OK and first.seen == [(("a", "b"), 0), (("a", "b", "s"), 1)]
    assert [name for name, _ in first.tried[0]] == ["s"]
    (change,) = changes(first.paths)
    assert (change["joined"], change["cause"]) == (["s"], "s: a spare, topology.max_nodes leaving room "
                                                          "(launcher.ssh.rejoin_s)")
