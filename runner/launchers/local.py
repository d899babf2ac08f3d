"""launcher=local: this machine; the `run` process forks one process per device."""

from __future__ import annotations

from runner.launchers.base import HostCommand, Launcher, LaunchRequest


class LocalLauncher(Launcher):
    name = "local"

    def request(self) -> LaunchRequest:
        commands = []
        for host in self.plan.job.hosts:
            records = self.plan.host_records(host.index)
            ranks = f"rank {records[0].global_rank}" if len(records) == 1 else \
                f"ranks {records[0].global_rank}..{records[-1].global_rank}"
            commands.append(HostCommand(
                host.label if host.name else "this machine", None,
                f"`run` forks {len(records)} process(es) ({ranks}) from itself, torch already imported; "
                f"MASTER_PORT is a free port on 127.0.0.1 chosen at launch",
            ))
        return LaunchRequest(self.name, tuple(commands), pins=self.pins())

    def launch(self, request: LaunchRequest, recipe_cfg) -> int:
        return self.run_host(0, recipe_cfg)
