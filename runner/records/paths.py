"""One object names every file of a run's folder, as submitit's ``JobPaths`` does a job's: :class:`RunPaths`, and
:class:`RankPaths` (``paths.rank(r)``) for a rank's own files; :class:`SweepPaths` a sweep's folder. Nothing else
spells a file name of a run: what writes or reads one asks these, and a batch script gets its paths from them too.

Each accessor of a file or folder is marked (:func:`_file`, :func:`_folder`, :func:`_example`) so that
:meth:`RunPaths.entries` can list them all, each with its docstring's first paragraph: the table of docs/run-folder.md
("What a run leaves behind") lists the same paths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Path])


class _file(property):  # noqa: N801 (used as a decorator, like property)
    """A property that names a file of the folder (listed by :meth:`RunPaths.entries`)."""


class _folder(_file):  # noqa: N801
    """A property that names a folder of the folder."""


def _example(*args: str | None, folder: bool = False) -> Callable[[_F], _F]:
    """Marks a method that names a file (or ``folder``) from its arguments; ``args``: what the listing shows for
    them (``<job id>``)."""
    def mark(method: _F) -> _F:
        method.example = (args, folder)  # type: ignore[attr-defined]
        return method

    return mark


@dataclass(frozen=True)
class FolderEntry:
    """One file or folder of a run's folder, as :meth:`RunPaths.entries` lists it."""

    path: str  # relative to the run folder: "spec.yaml", "logs/rankNNNNN.log", "checkpoints/<name>.pt"; a folder ends in /
    what: str  # the first paragraph of its accessor's docstring, in one line
    per_rank: bool = False  # one per rank (NNNNN: the rank, five digits)


def _entries(cls: type, instance: Any, root: Path, per_rank: bool) -> list[FolderEntry]:
    found = []
    for name, member in vars(cls).items():
        if isinstance(member, _file):
            path, folder = member.fget(instance), isinstance(member, _folder)
        elif (example := getattr(member, "example", None)) is not None:
            path, folder = member(instance, *example[0]), example[1]
        else:
            continue
        shown = path.relative_to(root).as_posix() + ("/" if folder else "")
        what = " ".join((inspect.getdoc(member) or name).split("\n\n")[0].split())
        found.append(FolderEntry(shown, what, per_rank))
    return found


def _slurm_output(folder: Path, job: str) -> Path:
    return folder / f"slurm-{job}.out"



@dataclass(frozen=True)
class RankPaths:
    """The files of one rank, all in the run's ``logs/`` folder: ``rank<r>`` and a suffix, the rank in five digits.
    ``rank`` may be a pattern that stands for every rank (``*``, a glob; ``NNNNN``, as docs/run-folder.md writes it)."""

    logs: Path
    rank: int | str

    def _named(self, suffix: str) -> Path:
        number = f"{self.rank:05d}" if isinstance(self.rank, int) else self.rank
        return self.logs / f"rank{number}{suffix}"

    @_file
    def log(self) -> Path:
        """The rank's log: its stdout and stderr, complete."""
        return self._named(".log")

    @_file
    def error(self) -> Path:
        """Written by a rank that raised (rank, host, pid, time, traceback), or by its launcher for a rank killed by a
        signal (``"killed": true``): runner.records.outcomes.ErrorRecord."""
        return self._named(".error.json")

    @_file
    def elastic_error(self) -> Path:
        """Where torch elastic's ``@record`` writes the rank's failure (TORCHELASTIC_ERROR_FILE), for a script."""
        return self._named(".elastic-error.json")

    @_file
    def joined(self) -> Path:
        """The rank joined the default process group; it holds the group's backend."""
        return self._named(".joined")

    @_file
    def done(self) -> Path:
        """The rank's recipe returned: ``{"stopped": ..., "result": {...}}`` (asked to stop?, what it returned)."""
        return self._named(".done")

    @_file
    def dump(self) -> Path:
        """What the rank recorded of its collectives and where its main thread was, when asked and at its end
        (runner.records.dumps.RankDump)."""
        return self._named(".collectives.json")

    @_file
    def beat(self) -> Path:
        """When the rank last completed a collective or a progress step (its heartbeat, for the stall watchdog)."""
        return self._named(".beat")


@dataclass(frozen=True)
class RunPaths:
    """The files of one run, all below ``root`` (Hydra's run folder, unique per run) but the init file and the job's
    channel of an ``init.dir`` job, which are in that folder."""

    root: Path
    run_id: str
    attempt: int = 0  # restarts so far (a requeued Slurm job, max_restarts): files of one attempt are its own

    # -- what the launch writes ------------------------------------------------------------------------------
    @_file
    def spec(self) -> Path:
        """The composed spec, with what the launch pinned (run id, port, workdir, code_dir), as tasks load it."""
        return self.root / "spec.yaml"

    @_file
    def plan(self) -> Path:
        """Every process: host, node rank, local rank, global rank, device, and its full environment."""
        return self.root / "plan.json"

    @_file
    def launch(self) -> Path:
        """The exact commands (and scripts) the launcher runs."""
        return self.root / "launch.txt"

    @_file
    def provenance(self) -> Path:
        """What produced the run: git state, packages, torch, hosts, command line (runner.environments.provenance)."""
        return self.root / "provenance.json"

    @_folder
    def code(self) -> Path:
        """The run's copy of the job's code (launcher.snapshot_code)."""
        return self.root / "code"

    @_folder
    def hydra(self) -> Path:
        """Hydra's record of the config and the overrides."""
        return self.root / ".hydra"

    @_file
    def hydra_overrides(self) -> Path:
        """The overrides the run was composed with, as typed (a sweep's table shows them)."""
        return self.hydra / "overrides.yaml"

    @_file
    def hydra_log(self) -> Path:
        """Hydra's log of the launch (conf/job.yaml names the job ``run``)."""
        return self.root / "run.log"

    # -- Slurm ------------------------------------------------------------------------------------------------
    @_file
    def sbatch_script(self) -> Path:
        """launcher=slurm: the batch script."""
        return self.root / "job.sbatch"

    @_file
    def step_script(self) -> Path:
        """launcher=slurm inside an allocation: the srun step's script."""
        return self.root / "step.sh"

    @_example("<job id>")
    def slurm_output(self, job: str) -> Path:
        """The Slurm job's output (its batch script's; a sweep's job: ``<array id>_<n>``); ``%j`` in an sbatch line."""
        return _slurm_output(self.root, job)

    @_file
    def slurm_job_id(self) -> Path:
        """The id of the Slurm job `run` submitted (a sweep's job: ``<array id>_<n>``)."""
        return self.root / "slurm_job_id"

    @_example("<job id>")
    def hostfile(self, job: str) -> Path:
        """Uneven hosts under Slurm: the srun step's SLURM_HOSTFILE, one line per task in rank order."""
        return self.root / f"hostfile.{job}"

    def hostfile_in_batch_script(self) -> str:
        """:meth:`hostfile` as a batch script names it: quoted, then the job id from Slurm (``$SLURM_JOB_ID``)."""
        return shlex.quote(str(self.hostfile(""))) + "$SLURM_JOB_ID"

    @_example("<N>")
    def round_spec(self, attempt: int | str) -> Path:
        """A Slurm job that outlives its nodes: the spec of round (attempt) N, on the nodes it ran on, as its tasks
        load it (runner.launchers.slurm.rounds)."""
        return self.root / f"spec.round{attempt}.yaml"

    @_file
    def rounds_beat(self) -> Path:
        """A Slurm job that outlives its nodes: the round the holding `run` is at, rewritten every moment it runs;
        a task whose round is over, or whose holder fell silent, stops its share."""
        return self.root / "rounds.beat"

    @_file
    def user_stop(self) -> Path:
        """Written by `run` when it is sent the stop signal while it follows the run's Slurm job, before it passes
        the signal on: the batch script then ends the job after the ranks checkpoint, where after Slurm's
        time-limit signal it requeues it (launcher.slurm.requeue). Removed before each submission."""
        return self.root / "user_stop"

    def in_shell_variable(self, name: str) -> RunPaths:
        """These paths below ``$name`` rather than the root, for a batch script that sets the folder itself (put
        them in double quotes there)."""
        return dataclasses.replace(self, root=Path(f"${name}"))

    # -- what the ranks write ---------------------------------------------------------------------------------
    @_folder
    def logs(self) -> Path:
        """The ranks' logs and records (one set per rank: the rows below)."""
        return self.root / "logs"

    def rank(self, rank: int | str) -> RankPaths:
        """The files of rank ``rank`` (or of every rank: ``*``, a glob)."""
        return RankPaths(self.logs, rank)

    def rank_files(self, pick: Callable[[RankPaths], Path]) -> tuple[str, list[Path]]:
        """One kind of rank file (``pick``: ``lambda r: r.log``) of every rank there is: how it is shown
        (``logs/rank*.log``) and the files, in rank order."""
        pattern = pick(self.rank("*"))
        found = sorted(self.logs.glob(pattern.name)) if self.logs.is_dir() else []
        return pattern.relative_to(self.root).as_posix(), found

    @_file
    def dump_request(self) -> Path:
        """A request for every rank's dump (its time and reason): the ranks watch for it."""
        return self.logs / "diagnose.request"

    @_file
    def diagnosis(self) -> Path:
        """What a hang was, in words and facts, as the failure report or the stall watchdog said it."""
        return self.logs / "diagnosis.json"

    @_file
    def hangs(self) -> Path:
        """Host 0's record of each attempt that hung, one JSON object per line: the hosts of the ranks behind."""
        return self.logs / "hangs.jsonl"

    @_file
    def metrics(self) -> Path:
        """Metrics logged by the recipe (``ctx.log``, rank 0), one JSON object per line."""
        return self.root / "metrics.jsonl"

    @_file
    def membership(self) -> Path:
        """Each change of the job's hosts (a host lost, a spare taken: topology.min_nodes, topology.spares), one JSON
        object per line: when, the attempt, the hosts before and after, the cause, the seconds to the next attempt's
        first step and the steps lost since the checkpoint."""
        return self.root / "membership.jsonl"

    @_folder
    def checkpoints(self) -> Path:
        """The recipe's checkpoints (``ctx.save_checkpoint``)."""
        return self.root / "checkpoints"

    @_example("<name>")
    def checkpoint(self, name: str) -> Path:
        """A checkpoint of the recipe (``last``: consolidated, in plain torch format, under every sharding mode)."""
        return checkpoint_file(self.checkpoints, name)

    @_example("<name>")
    def checkpoint_commit(self, name: str) -> Path:
        """The commit record of this host's copy of a checkpoint: the save's number among the run's saves and its
        step, and which file it is (runner.training.copies): the newest complete copy any host holds is resumed."""
        return commit_file(checkpoint_file(self.checkpoints, name))

    def scratch(self, rank: int) -> Path:
        """Rank ``rank``'s temporary files of this attempt (its TMPDIR: Python's ``tempfile`` folder, and the programs
        it starts), removed after it: a folder of its own in this machine's temporary folder, short, not in the run
        folder, where a Unix socket's path (multiprocessing's, a DataLoader's workers') could pass the 107 bytes Linux
        allows and a DataLoader's workers then hang (seen in a run folder 70 characters deep)."""
        digest = hashlib.sha1(f"{self.root.resolve()}".encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"runner-{digest}-{self.attempt}-{rank}"

    # -- how it ended -----------------------------------------------------------------------------------------
    @_file
    def summary(self) -> Path:
        """How the run ended, as the end-of-run summary says it: status, exit code, wall time, the first failure,
        the hang, the slow rank, final metrics, paths."""
        return self.root / "run_summary.json"

    @_file
    def exit_status(self) -> Path:
        """A sweep's job: `run`'s exit status for it (the sweep's table reads it)."""
        return self.root / "exit_status"

    # -- the rendezvous, in init.dir or here ------------------------------------------------------------------
    @_example(None, folder=True)
    def rendezvous_folder(self, init_dir: str | None) -> Path:
        """init=file: the run's private folder (0700) of init files, ``attempt<k>`` a fresh one per attempt; in
        ``init.dir``, else here."""
        return (Path(init_dir) if init_dir else self.root) / f"{self.run_id}.rdzv"

    def rendezvous_file(self, init_dir: str | None) -> Path:
        """A fresh file per run and attempt, in a folder of the run's own that only the user may enter
        (see :meth:`make_private`): ``<init.dir or run folder>/<run id>.rdzv/attempt<k>``."""
        return self.rendezvous_folder(init_dir) / f"attempt{self.attempt}"

    @_example(None, folder=True)
    def channel_folder(self, init_dir: str | None) -> Path:
        """init=file: the job's channel (runner.worker.channel), a folder every host sees; in ``init.dir``, else
        here."""
        return (Path(init_dir) if init_dir else self.root) / f"{self.run_id}.job"

    # -- making and listing -----------------------------------------------------------------------------------
    @staticmethod
    def make_private(folder: Path) -> None:
        """Create ``folder`` readable by the user only (0700), unless a host of the run made it already."""
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            return
        os.chmod(folder, 0o700)  # whatever the umask

    def make(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)

    @classmethod
    def entries(cls) -> tuple[FolderEntry, ...]:
        """Every file and folder this object names, run-level first, then a rank's (``logs/rankNNNNN.<kind>``), in
        the order they are declared; the table of docs/run-folder.md lists the same paths."""
        example = cls(Path("run"), "<run id>")
        return tuple(_entries(cls, example, example.root, False)
                     + _entries(RankPaths, example.rank("NNNNN"), example.root, True))


def checkpoint_file(checkpoints: Path, name: str) -> Path:
    """The checkpoint ``name`` in a checkpoints folder (:attr:`RunPaths.checkpoints`; a recipe's context holds the
    folder alone)."""
    return checkpoints / f"{name}.pt"


def commit_file(checkpoint: Path) -> Path:
    """The commit record beside a checkpoint file (:meth:`RunPaths.checkpoint_commit`)."""
    return checkpoint.with_name(checkpoint.name + ".commit")


@dataclass(frozen=True)
class SweepPaths:
    """The files of a sweep's own folder (``outputs/multirun/<date>/<time>_<random>/``); its jobs' folders are
    ``<n>/`` below it, each a run folder (:class:`RunPaths`)."""

    root: Path

    @_file
    def summary_csv(self) -> Path:
        """The sweep's table: a row per job (status, throughput, speedup, efficiency, slowest rank, final metrics)."""
        return self.root / "summary.csv"

    @_file
    def summary_md(self) -> Path:
        """The same table in Markdown, as `run` prints it at the sweep's end."""
        return self.root / "summary.md"

    @_file
    def scaling_plot(self) -> Path:
        """Throughput (or speedup) and efficiency against world size (the extra ``plots``)."""
        return self.root / "scaling.png"

    @_example("<k>")
    def array_script(self, k: int | str) -> Path:
        """launcher=slurm: the batch script of the sweep's ``k``-th job array (jobs that ask for the same resources)."""
        return self.root / f"array{k}.sbatch"

    @_example("<array id>", "<n>")
    def array_output(self, array_id: str, task: int | str) -> Path:
        """What an array's task said before it entered its job's folder (``%A``, ``%a`` in the sbatch line)."""
        return _slurm_output(self.root, f"{array_id}_{task}")

    def job_folders(self) -> list[Path]:
        """The sweep's jobs' run folders (those Hydra composed: they have their overrides), in job order."""
        overrides = RunPaths(Path(), "").hydra_overrides  # relative to a job's folder
        found = (p.parents[len(overrides.parts) - 1] for p in self.root.glob(f"*/{overrides.as_posix()}"))
        return sorted(found, key=lambda p: (len(p.name), p.name))

    @classmethod
    def entries(cls) -> tuple[FolderEntry, ...]:
        """Every file this object names (see :meth:`RunPaths.entries`)."""
        example = cls(Path("sweep"))
        return tuple(_entries(cls, example, example.root, False))
