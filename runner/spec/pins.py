"""What one launch fixes in a job's spec for every process of the run, applied once, to the one typed spec.

A process meets its job's spec in one of three ways: in `run`'s memory (launcher=local, and each host of
launcher=manual), from the run's ``spec.yaml`` (a task that Slurm or mpirun started: runner.spec.document), or from
the command line a manual host's `run` was started with (launcher=manual prints it). All must agree on the run id,
the master port and where the code comes from, so the launch applies its :class:`Pins` to the spec before anything
plans, writes or prints it (runner.app.launch), and each of the other views is made from that one spec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from runner.spec.job import Job
from runner.spec.schema import JobConfig, ScriptRecipeConfig, TopologyConfig


@dataclass(frozen=True)
class Pins:
    """The spec keys one launch fixes for every process of the run."""

    run_id: str  # the run's id (its folder, its rendezvous files, TORCHELASTIC_RUN_ID)
    master_port: int | None = None  # a port every host agrees on (launcher=manual, mpi); None: the spec's (0: a free
    # port chosen at launch, or one derived from the Slurm job id)
    code_dir: str | None = None  # the run's copy of the code (launcher.snapshot_code); None: none was taken
    script_path: str | None = None  # recipe=script: the script in that copy; None: the spec's
    host_addrs: tuple[str | None, ...] = ()  # topology.hosts[i].addr the launch found (launcher=ssh: ssh -G); None or
    # (): the spec's

    def apply(self, spec: JobConfig) -> JobConfig:
        """``spec`` with these pins, as a new spec (``spec`` is left as it is)."""
        recipe = spec.recipe
        if self.script_path is not None:
            if not isinstance(recipe, ScriptRecipeConfig):
                raise TypeError(f"a script path is pinned, but the recipe is not recipe=script: {type(recipe).__name__}")
            recipe = dataclasses.replace(recipe, path=self.script_path)
        init = spec.init if self.master_port is None else dataclasses.replace(spec.init, master_port=self.master_port)
        return dataclasses.replace(spec, run_id=self.run_id, init=init, recipe=recipe, topology=self._topology(spec),
                                   code_dir=self.code_dir if self.code_dir is not None else spec.code_dir)

    def _topology(self, spec: JobConfig) -> TopologyConfig:
        listed = spec.topology.hosts
        if not any(a is not None for a in self.host_addrs):
            return spec.topology
        if listed is None or len(listed) != len(self.host_addrs):
            raise ValueError(f"{len(self.host_addrs)} host addresses pinned for topology.hosts of "
                             f"{len(listed or ())} host(s)")
        hosts = [h if a is None else dataclasses.replace(h, addr=a) for h, a in zip(listed, self.host_addrs)]
        return dataclasses.replace(spec.topology, hosts=hosts)


def pinned(job: Job, pins: Pins) -> Job:
    """``job`` with ``pins`` applied to its spec. What validation resolved (device, backend) does not depend on the
    keys a launch pins, so it is kept as it is; the hosts take the addresses pinned for them, and host 0's becomes
    the master address unless the spec names one (init.master_addr)."""
    spec = pins.apply(job.spec)
    if not any(a is not None for a in pins.host_addrs):
        return dataclasses.replace(job, spec=spec)
    hosts = tuple(h if a is None else dataclasses.replace(h, addr=a) for h, a in zip(job.hosts, pins.host_addrs))
    master = job.master_addr if spec.init.master_addr is not None else hosts[0].reach
    return dataclasses.replace(job, spec=spec, hosts=hosts, master_addr=master)
