"""launcher=local: this machine; `run` forks one process per device (and restarts them after a failure,
launcher.max_restarts)."""

from __future__ import annotations

from collections.abc import Iterator

from runner.launchers.base import HostCommand, Launcher, LaunchOutcome, LaunchRequest
from runner.launchers.capabilities import Capabilities
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem
from runner.spec.validation import gpus_of_this_machine


class LocalLauncher(Launcher):
    name = "local"
    capabilities = Capabilities(supports_restarts=True, forks_here=True,
                                lost_host_reason="one machine, this one: there is no other host to go on with")

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        hosts = job.hosts
        if len(hosts) > 1:
            yield Problem("launcher.kind", f"local starts one host's processes on this machine, but the topology has "
                                           f"{len(hosts)} hosts",
                          f"launcher=manual (one command per host, also for several 'hosts' on this machine), slurm or "
                          f"mpi; or run the same {job.world_size} processes here: topology.nodes=1 "
                          f"topology.devices_per_node={job.world_size}")
        yield from gpus_of_this_machine(job, probe)

    def request(self) -> LaunchRequest:
        commands = []
        for host in self.plan.job.hosts:
            records = self.plan.host_records(host.index)
            ranks = f"rank {records[0].global_rank}" if len(records) == 1 else \
                f"ranks {records[0].global_rank}..{records[-1].global_rank}"
            commands.append(HostCommand(
                host=host.label if host.name else "this machine", argv=None,
                note=f"`run` forks {len(records)} process(es) ({ranks}) from itself, torch already imported; "
                     f"MASTER_PORT is a free port on 127.0.0.1 chosen at launch",
            ))
        return LaunchRequest(launcher=self.name, commands=tuple(commands))

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        return LaunchOutcome(code=self.run_host(0))
