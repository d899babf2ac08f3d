"""launcher=manual: one `run` command per host, typed by hand on each host.

Each command repeats the user's overrides and pins what the hosts must agree on (run id, master
port), plus the host it is for; run on that host, it starts that host's share like launcher=local.
"""

from __future__ import annotations

from runner.launchers.base import HostCommand, Launcher, LaunchRequest

_PINNED = ("launcher.manual.host=", "run_id=", "init.master_port=", "dry_run=")


class ManualLauncher(Launcher):
    name = "manual"

    def request(self) -> LaunchRequest:
        inv = self.invocation
        pins = {"run_id": self.paths.run_id, "init.master_port": self.pinned_port()}
        base = ["run"]
        if inv.config_dir:
            base += ["--config-dir", inv.config_dir]
        base += [o for o in inv.overrides if not o.startswith(_PINNED)]
        base += [f"{k}={v}" for k, v in pins.items()]
        commands = []
        for host in self.plan.job.hosts:
            n = len(self.plan.host_records(host.index))
            argv = (*base, f"launcher.manual.host={host.index}")
            where = host.reach or host.label
            commands.append(HostCommand(f"host {host.index} ({where})", argv, f"starts {n} process(es)", cwd=inv.cwd))
        return LaunchRequest(self.name, tuple(commands), pins=pins)
