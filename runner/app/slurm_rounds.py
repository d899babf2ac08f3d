"""The `run` that holds a Slurm job which outlives its nodes: ``python -P -m runner.app.slurm_rounds <run
folder>/spec.yaml``, run by the batch script (on the allocation's first node) or by `run` inside salloc. It runs the
job's rounds (runner.launchers.slurm.rounds) on the allocation's nodes, each an srun step whose tasks are the rounds'
host-side shares (runner.app.task --round N), and exits with the job's status. It validates the spec it pinned to the
allocation's nodes as those shares do (runner.app.host_entry.validated: with what the launching `run` found).

A requeued job starts again at the attempt after the last round it ran (its round specs are in the run folder), so
that no attempt's files are written twice.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runner.app.host_entry import Refused, validated
from runner.common import exits
from runner.environments.process import ProcessEnvironment
from runner.environments.slurm import expand_hostnames
from runner.launchers.elastic.membership import Membership
from runner.launchers.elastic.rounds import AttemptsOnHosts
from runner.launchers.slurm.launcher import SlurmLauncher
from runner.launchers.slurm.rounds import SlurmRound, pinned_to_nodes, rounds_run
from runner.records.paths import RunPaths
from runner.spec.document import load_spec

USAGE = "usage: python -P -m runner.app.slurm_rounds <run folder>/spec.yaml  (in a Slurm allocation)"


def hold(spec_path: Path, environment: ProcessEnvironment) -> int:
    """The job's rounds on this allocation's nodes; the job's exit status."""
    slurm = environment.slurm
    if slurm.job_id is None or not slurm.job_nodelist:
        print(f"error: not in a Slurm allocation (no SLURM_JOB_ID, SLURM_JOB_NODELIST); {USAGE}", file=sys.stderr)
        return exits.INVALID
    pinned = load_spec(spec_path)
    try:
        spec = pinned_to_nodes(pinned, expand_hostnames(slurm.job_nodelist))
    except ValueError as e:
        print(f"error: the allocation's nodes ({slurm.job_nodelist}) do not fit the spec's hosts: {e}", file=sys.stderr)
        return exits.INVALID
    done = rounds_run(RunPaths(spec_path.parent, spec.run_id or spec_path.parent.name))
    attempt = max(slurm.restart_count, done[-1] + 1 if done else 0)
    spec = Membership.of(spec).spec(spec, attempt)
    try:
        job = validated(spec)  # as a host's share validates it (runner.app.host_entry): with what the launch found
    except Refused as e:
        print(e, file=sys.stderr)
        return exits.INVALID
    paths = RunPaths(spec_path.parent, spec.run_id or spec_path.parent.name, attempt)
    first = SlurmRound.of(spec, paths, job, python=sys.executable, job_id=slurm.job_id,
                          planner=SlurmLauncher.plan_for, cwd=os.getcwd())
    return AttemptsOnHosts(first).run().code


def main() -> None:
    if len(sys.argv) != 2:
        print(USAGE, file=sys.stderr)
        raise SystemExit(exits.INVALID)
    code = hold(Path(sys.argv[1]).resolve(), ProcessEnvironment.read())
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
