"""runner.app.host_entry: the one path of a host's share in a process a launch started, with a mode of made-up
answers: a refusal at any step is printed and nothing is made; the spec is validated with what the launching `run`
found (a target is not tried again, this host's folders are); the share restarts in place only where the mode's
does; the mode gets the one self-stop, after the share's hard stop; that self-stop ends the process once, whoever
calls it first. The modes themselves: tests/app/test_ssh_host.py, tests/app/test_task.py."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from children import CHILD_S, in_child
from conftest import environment, make_spec
from runner.app.host_entry import HolderGone, Placed, Refused, run_share, validated
from runner.common.signals import StopRequest
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.schema import JobConfig
from runner.worker.share import HostShare, hard_stop_s

UNKNOWN_TARGET = "no_such_package.train:main"


def spec_in(folder: Path, **changes: object) -> JobConfig:
    spec = make_spec(devices=[1, 1], names=["a", "b"], launcher="ssh", target=UNKNOWN_TARGET)
    spec.workdir, spec.run_id = str(folder), "R1"
    spec.launcher = dataclasses.replace(spec.launcher, max_restarts=2, grace_s=4.0)
    return dataclasses.replace(spec, **changes)


@dataclass
class Mode:
    """A mode of made-up answers, recording what the entry gave it."""

    given: JobConfig | None = None
    refuse_place: bool = False
    restarts_itself: bool = True
    ran: list[tuple[HostShare, int | None, HolderGone]] = field(default_factory=list)
    placed_at: list[Job] = field(default_factory=list)

    def spec(self) -> JobConfig:
        if self.given is None:
            raise Refused("error: expected the spec on stdin")
        return self.given

    def place(self, job: Job, environment: ProcessEnvironment) -> Placed:
        self.placed_at.append(job)
        if self.refuse_place:
            raise Refused("error: --ssh-host 5: the spec has hosts 0..1")
        paths = RunPaths(Path(job.spec.workdir) / "runs", job.spec.run_id, 1)
        return Placed(plan_for(job, paths), 1, paths, only=None)

    def run(self, share: HostShare, only: int | None, early_stop: StopRequest | None, gone: HolderGone) -> int:
        self.ran.append((share, only, gone))
        return 7


@pytest.mark.unit
@pytest.mark.parametrize("mode, said", [
    (Mode(), "error: expected the spec on stdin\n"),
    (Mode(refuse_place=True), "error: --ssh-host 5: the spec has hosts 0..1\n"),
], ids=["no spec", "no place"])
def test_a_refusal_is_said_and_nothing_is_made(tmp_path, capsys, mode, said) -> None:
    if mode.refuse_place:
        mode.given = spec_in(tmp_path)
    assert run_share(mode, environment()) == 2
    assert capsys.readouterr().err == said
    assert mode.ran == [] and not (tmp_path / "runs").exists()


@pytest.mark.unit
def test_a_spec_that_does_not_validate_here_is_refused_with_its_problems_before_its_place(tmp_path, capsys) -> None:
    mode = Mode(given=spec_in(tmp_path / "elsewhere"))  # a workdir not on this host
    assert run_share(mode, environment()) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: workdir: ") and "is not a folder here" in err, err
    assert mode.placed_at == [] and mode.ran == []


@pytest.mark.unit
def test_the_launching_runs_word_on_the_target_is_taken_and_this_hosts_folders_are_checked(tmp_path) -> None:
    """The target does not import anywhere: the launching `run` found it did (it pinned the spec), so it is not
    tried again; the job's folder is this host's to have."""
    assert validated(spec_in(tmp_path)).spec.recipe.target == UNKNOWN_TARGET
    with pytest.raises(Refused, match=r"^error: workdir: '/no/such/folder' is not a folder here"):
        validated(spec_in(Path("/no/such/folder")))


@pytest.mark.unit
@pytest.mark.parametrize("restarts_itself, preflight, restarts", [(True, False, 2), (True, True, 0), (False, False, 0)])
def test_the_share_restarts_in_place_only_where_the_mode_does(tmp_path, restarts_itself, preflight, restarts) -> None:
    spec = spec_in(tmp_path, preflight=preflight)
    mode = Mode(given=spec, restarts_itself=restarts_itself)
    assert run_share(mode, environment(HOME="/home/u")) == 7  # the mode's share's status
    ((share, only, gone),) = mode.ran
    assert (share.node_rank, share.paths.attempt, share.restarts, only) == (1, 1, restarts, None)
    assert share.paths.root.is_dir() and share.environment == environment(HOME="/home/u")
    assert gone.hard_stop_s == hard_stop_s(spec.launcher) > spec.launcher.grace_s


def test_the_holder_gone_stops_the_share_and_ends_the_process_once() -> None:
    """The first call says why, sends SIGTERM (the agent stops the ranks), and ends the process with SIGTERM's status
    after the hard stop; a second call meanwhile (here: from the SIGTERM handler) returns at once."""
    def body() -> None:
        gone = HolderGone(hard_stop_s=0.3)

        def on_sigterm(_s: int, _f: object) -> None:
            gone("a second time")
            print("SIGTERM; the second call returned", file=sys.stderr, flush=True)

        signal.signal(signal.SIGTERM, on_sigterm)
        threading.Thread(target=gone, args=("no beat from the holder",), daemon=True).start()
        threading.Event().wait(CHILD_S)

    assert in_child(body) == (128 + signal.SIGTERM, "no beat from the holder\nSIGTERM; the second call returned\n")
