"""runner.app.launch, the phases before anything starts, in this process: which spec is refused and how (`run`'s
exit status 2, the message), which run folder a launch opens, what it pins (the run id, a port the hosts agree on, the
copy of the code and the script in it), when the launch agent is dismissed, a stale rendezvous file, the dry run's
layout. Whole launches: tests/app/test_cli.py, tests/launchers, tests/e2e."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from conftest import environment, make_spec, validate
from runner.app.launch import _open_run_folder, _pin, _Refused, _refuse_a_stale_rendezvous_file, _show_dry_run, run_job
from runner.common import exits
from runner.launchers import LAUNCHERS, Invocation, plan_for
from runner.launchers.local import LocalLauncher
from runner.launchers.manual import ManualLauncher
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.probe import FixedProbe
from runner.spec.problems import Problem, Severity
from runner.spec.schema import InitConfig, InitMethod, JobConfig, RecipeConfig, ScriptRecipeConfig
from runner.spec.targets import TargetProblem

pytestmark = pytest.mark.unit

WRITTEN = ("spec.yaml", "plan.json", "launch.txt", "provenance.json")  # what a launch writes before it starts anything


class Agent:
    """`run`'s launch agent (runner.app.agent) without its process: it answers validation's question about the
    recipe target, and records whether it was dismissed."""

    def __init__(self, problem: TargetProblem | None = None) -> None:
        self.problem = problem
        self.asked: list[str] = []
        self.dismissed = False

    def target_problem(self, target: str, workdir: str | None) -> TargetProblem | None:
        self.asked.append(target)
        return self.problem

    def dismiss(self) -> None:
        self.dismissed = True

    def run_host(self, share: object) -> int:
        raise AssertionError("nothing is launched in these tests")


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The job's folder: a script, as `run ... -- train.py` names it."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    return folder


def script_spec(folder: Path, *, devices: list[int] | None = None, launcher: str = "local",
                **keys: object) -> JobConfig:
    """train.py on hosts of ``devices`` processes (named h0, h1, ...); ``keys``: the spec's own keys, and the
    launcher's (``launcher_<key>``)."""
    devices = devices or [2]
    spec = make_spec(devices=devices, names=[f"h{i}" for i in range(len(devices))] if len(devices) > 1 else None,
                     launcher=launcher)
    options = {k.removeprefix("launcher_"): v for k, v in keys.items() if k.startswith("launcher_")}
    own = {k: v for k, v in keys.items() if not k.startswith("launcher_")}
    return dataclasses.replace(spec, **{"recipe": ScriptRecipeConfig(path="train.py"), "workdir": str(folder), **own},
                               launcher=dataclasses.replace(spec.launcher, **options))


def launched(spec: JobConfig, out: Path, agent: Agent | None = None, zygote: object = None) -> int:
    return run_job(spec, out=out, run_id="20240101-000000-abc", invocation=Invocation(python=sys.executable,
                                                                                      cwd=str(out.parent)),
                   environment=environment(), agent=agent, zygote=zygote)  # type: ignore[arg-type]


def job_of(spec: JobConfig) -> Job:
    folders = frozenset(f for f in (spec.workdir, spec.init.dir) if f is not None)
    got = validate(spec, FixedProbe(dirs=folders, paths=frozenset({f"{spec.workdir}/train.py"})))
    assert got.valid, got.rendered()
    return got.job


# -------------------------------------------------------------------------- refused before anything starts


@pytest.mark.parametrize("named", [True, False])
def test_a_spec_with_errors_is_refused_with_its_problems_and_their_count(workdir, tmp_path, monkeypatch, capsys,
                                                                        named) -> None:
    """The job's folder is the spec's workdir, else the folder `run` was started in (as an absolute path: every
    process on every host reads the job's code from there)."""
    monkeypatch.chdir(workdir)
    spec = script_spec(workdir, recipe=ScriptRecipeConfig(path="missing.py"), workdir=str(workdir) if named else None)
    assert launched(spec, tmp_path / "out") == exits.INVALID
    assert spec.workdir == str(workdir)
    assert capsys.readouterr().err == (
        f"error: recipe.path: 'missing.py' does not exist (seen from {workdir})\n"
        f"    hint: give the training script's path, relative to the folder you start `run` from, or absolute\n"
        f"\nthe spec has 1 error(s); nothing was started.\n")
    assert not (tmp_path / "out").exists()


def test_the_launch_agent_is_asked_whether_the_recipe_target_loads(workdir, tmp_path, capsys) -> None:
    agent = Agent(TargetProblem("module 'mypkg' not found", "put mypkg/ in the job's folder"))
    spec = script_spec(workdir, recipe=RecipeConfig(target="mypkg.train:main", global_batch_size=8))
    assert launched(spec, tmp_path / "out", agent) == exits.INVALID
    assert agent.asked == ["mypkg.train:main"] and not agent.dismissed  # validation failed: nothing to dismiss it for
    assert capsys.readouterr().err == ("error: recipe.target: module 'mypkg' not found\n    hint: put mypkg/ in the "
                                       "job's folder\n\nthe spec has 1 error(s); nothing was started.\n")


def test_without_an_agent_the_target_is_tried_in_runs_zygote_started_once_for_every_job(workdir, tmp_path,
                                                                                          capsys) -> None:
    """A sweep's jobs (`run -m` has no launch agent): each job's target is tried in a child of `run`'s one zygote,
    started at the first question (runner.cli.JobTask.zygote), not in a child of `run` that imports torch again."""
    started = []

    def zygote() -> Agent:  # what validation asks of a zygote: its target_problem
        if not started:
            started.append(Agent(TargetProblem("module 'mypkg' not found", "put mypkg/ in the job's folder")))
        return started[0]

    spec = script_spec(workdir, recipe=RecipeConfig(target="mypkg.train:main", global_batch_size=8))
    for out in ("0", "1"):
        assert launched(spec, tmp_path / out, zygote=zygote) == exits.INVALID
    assert len(started) == 1 and started[0].asked == ["mypkg.train:main"] * 2
    assert capsys.readouterr().err.count("error: recipe.target: module 'mypkg' not found") == 2


def test_hosts_started_apart_without_a_run_id_are_refused_before_a_run_folder_is_made(workdir, tmp_path,
                                                                                      capsys) -> None:
    agent = Agent()
    assert launched(script_spec(workdir, devices=[1, 1], launcher="manual"), tmp_path / "out", agent) == exits.INVALID
    assert capsys.readouterr().err == ("error: run_id: several hosts must share one run id and port, but none is "
                                       "pinned; hint: run with dry_run=true and use the command it prints for each "
                                       "host\n")
    assert not (tmp_path / "out").exists() and not agent.dismissed  # its processes would start from here


@pytest.mark.parametrize("launcher, dry_run, dismissed", [
    ("slurm", False, True),  # Slurm starts the processes
    ("local", True, True),  # nothing starts
    ("local", False, False),  # the agent forks this host's processes
])
def test_the_agent_is_dismissed_unless_it_will_fork_this_hosts_processes(workdir, tmp_path, capsys, launcher,
                                                                          dry_run, dismissed) -> None:
    """Each launch is refused at its code snapshot (over a cap of one byte), after the agent's fate is decided."""
    agent = Agent()
    spec = script_spec(workdir, launcher=launcher, dry_run=dry_run, launcher_snapshot_code=True,
                       launcher_snapshot_files=["*.py"], launcher_snapshot_max_mb=1e-6)
    assert launched(spec, tmp_path / "out", agent) == exits.INVALID
    assert agent.dismissed is dismissed
    assert capsys.readouterr().err == (
        "error: launcher.snapshot_code: the code to copy (launcher.snapshot_files) is 0.0 MB, over "
        "launcher.snapshot_max_mb=1e-06 (largest: train.py (0.0 MB)); hint: keep data out of git or copy only the "
        "code: launcher.snapshot_files=['**/*.py','**/*.yaml'], or raise the cap\n\nnothing was started.\n")
    assert not any((tmp_path / "out" / name).exists() for name in WRITTEN)


def test_a_batch_job_copies_the_code_by_default_and_a_job_in_an_allocation_does_not(workdir, tmp_path) -> None:
    spec = script_spec(workdir, launcher="slurm", launcher_snapshot_files=["*.py"])  # snapshot_code left to the launch
    job = job_of(spec)
    pinned, copy = _pin(job, LAUNCHERS["slurm"], RunPaths(tmp_path / "submitted", "r1"), environment())
    assert (copy.folder, copy.files, pinned.spec.code_dir) == (tmp_path / "submitted" / "code", 1,
                                                               str(tmp_path / "submitted" / "code"))
    in_allocation = RunPaths(tmp_path / "in-allocation", "r1")
    assert _pin(job, LAUNCHERS["slurm"], in_allocation, environment(SLURM_JOB_ID="12")) == (
        dataclasses.replace(job, spec=dataclasses.replace(spec, run_id="r1")), None)
    assert not in_allocation.code.exists()


# -------------------------------------------------------------------------- the run folder, and what is pinned


def test_the_run_folder_is_named_by_the_specs_run_id_else_by_this_runs(workdir, tmp_path) -> None:
    job = job_of(script_spec(workdir))
    assert _open_run_folder(job, LocalLauncher, tmp_path / "a", "20240101-000000-abc") == \
        RunPaths(tmp_path / "a", "20240101-000000-abc")
    pinned = job_of(script_spec(workdir, run_id="exp1"))
    paths = _open_run_folder(pinned, LocalLauncher, tmp_path / "b", "20240101-000000-abc")
    assert paths == RunPaths(tmp_path / "b", "exp1") and paths.logs.is_dir()


def test_a_run_id_whose_folder_holds_a_run_continues_it_and_says_so(workdir, tmp_path, capsys) -> None:
    job = job_of(script_spec(workdir, run_id="exp1"))
    paths = _open_run_folder(job, LocalLauncher, tmp_path / "runs" / "exp1", "x")
    assert capsys.readouterr().err == ""
    paths.spec.write_text("{}\n")  # the first launch's
    assert _open_run_folder(job, LocalLauncher, paths.root, "y") == paths
    assert capsys.readouterr().err == (f"notice: run_id=exp1: {paths.root}/ holds this run already; this launch "
                                       f"continues it (a recipe resumes from its checkpoint there)\n")
    dry = job_of(script_spec(workdir, run_id="exp1", dry_run=True))
    _open_run_folder(dry, LocalLauncher, paths.root, "z")
    assert capsys.readouterr().err == ""  # a dry run continues nothing


def test_hosts_started_apart_are_pinned_the_run_id_and_the_port_derived_from_it(workdir, tmp_path) -> None:
    job = job_of(script_spec(workdir, devices=[1, 1], launcher="manual", run_id="exp1"))
    paths = RunPaths(tmp_path, "exp1")
    pinned, copy = _pin(job, ManualLauncher, paths, environment())
    assert copy is None
    assert (pinned.spec.run_id, pinned.spec.init.master_port, pinned.spec.code_dir) == ("exp1", 21241, None)
    given = job_of(script_spec(workdir, devices=[1, 1], launcher="manual", run_id="exp1",
                               init=InitConfig(master_port=29400)))
    assert _pin(given, ManualLauncher, paths, environment())[0].spec.init.master_port == 29400


def test_a_copy_of_the_code_is_pinned_as_code_dir_with_the_script_in_it(workdir, tmp_path) -> None:
    job = job_of(script_spec(workdir, launcher_snapshot_code=True, launcher_snapshot_files=["*.py"]))
    paths = RunPaths(tmp_path / "out", "r1")
    paths.make()
    pinned, copy = _pin(job, LocalLauncher, paths, environment())
    assert (copy.folder, copy.files, copy.source) == (paths.code, 1, "launcher.snapshot_files")
    assert (pinned.spec.code_dir, pinned.spec.recipe.path) == (str(paths.code), str(paths.code / "train.py"))
    assert (paths.code / "train.py").read_text() == "print('hi')\n"
    assert job.spec.code_dir is None and job.spec.recipe.path == "train.py"  # the validated spec is left as it was


def test_no_copy_is_taken_where_the_spec_says_so_whatever_the_launcher_does_by_default(workdir, tmp_path) -> None:
    job = job_of(script_spec(workdir, launcher="slurm", launcher_snapshot_code=False, launcher_snapshot_files=["*.py"]))
    pinned, copy = _pin(job, LAUNCHERS["slurm"], RunPaths(tmp_path, "r1"), environment())
    assert copy is None and pinned.spec.code_dir is None and not (tmp_path / "code").exists()


# -------------------------------------------------------------------------- a stale rendezvous file


def file_init_plan(workdir: Path, paths: RunPaths, launcher: str = "local", devices: list[int] | None = None) -> Plan:
    init = InitConfig(method=InitMethod.file, dir=str(paths.root))
    return plan_for(job_of(script_spec(workdir, devices=devices, launcher=launcher, init=init)), paths)


def test_a_rendezvous_file_left_by_an_earlier_run_is_refused(workdir, paths, capsys) -> None:
    plan = file_init_plan(workdir, paths)
    _refuse_a_stale_rendezvous_file(plan, paths)  # none yet
    stale = paths.rendezvous_file(str(paths.root))
    stale.parent.mkdir()
    stale.write_text("")
    with pytest.raises(_Refused) as refused:
        _refuse_a_stale_rendezvous_file(plan, paths)
    assert refused.value.code == exits.INVALID
    assert capsys.readouterr().err == (f"error: init: init file {stale} already exists (a stale file from an earlier "
                                       f"run?); it is never reused; hint: remove it or start a new run\n")


def test_hosts_started_by_hand_may_find_the_file_another_host_made(workdir, paths) -> None:
    plan = file_init_plan(workdir, paths, launcher="manual", devices=[1, 1])
    made = paths.rendezvous_file(str(paths.root))
    made.parent.mkdir()
    made.write_text("")
    _refuse_a_stale_rendezvous_file(plan, paths)


# -------------------------------------------------------------------------- the dry run


def test_the_dry_run_shows_the_spec_the_verdict_with_its_problems_the_plan_and_the_launch(workdir, paths,
                                                                                         capsys) -> None:
    plan = plan_for(job_of(script_spec(workdir)), paths)
    launcher = LocalLauncher(plan=plan, paths=paths, invocation=Invocation(python=sys.executable, cwd=str(workdir)),
                             environment=environment())
    request = launcher.request()
    warning = Problem("launcher.grace_s", "is short", "raise it", Severity.warning)
    _show_dry_run(launcher, request, [warning])
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("== ")]
    assert headers == ["== spec ==", "== verdict ==", "== plan ==", "== launch (local) =="]
    verdict = out.split("== verdict ==\n")[1].split("\n\n== plan ==")[0]
    assert verdict.splitlines()[1:] == ["warning: launcher.grace_s: is short", "    hint: raise it"]  # under its line
    assert out.split("== launch (local) ==\n")[1] == (f"{request.materialize().rstrip()}\n\ndry run: nothing was "
                                                      f"started. Spec, plan and commands are in {paths.root}/\n")
