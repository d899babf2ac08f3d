"""launcher=manual: one `run` command per host, typed by hand on each host.

Each command repeats the user's overrides and pins what the hosts must agree on (run id, master
port), plus the host it is for; run on that host, it starts that host's share like launcher=local.
"""

from __future__ import annotations

import sys

from runner.launchers.base import HostCommand, Launcher, LaunchRequest
from runner.spec.probe import LocalProbe
from runner.spec.topology import is_loopback

_PINNED = ("launcher.manual.host=", "run_id=", "init.master_port=", "dry_run=")


class ManualLauncher(Launcher):
    name = "manual"

    def request(self) -> LaunchRequest:
        inv = self.invocation
        pins = self.pins(port=True)
        base = [inv.run_command]
        if inv.config_dir:
            base += ["--config-dir", inv.config_dir]
        if inv.config_name:
            base += ["--config-name", inv.config_name]
        base += [o for o in inv.overrides if not o.startswith(_PINNED)]
        base += [f"{k}={v}" for k, v in pins.items()]
        commands = []
        for host in self.plan.job.hosts:
            n = len(self.plan.host_records(host.index))
            argv = (*base, f"launcher.manual.host={host.index}")
            where = host.reach or host.label
            commands.append(HostCommand(f"host {host.index} ({where})", argv, f"starts {n} process(es)", cwd=inv.cwd))
        return LaunchRequest(self.name, tuple(commands), pins=pins)

    def this_host(self, names: frozenset[str]) -> int | str:
        """This machine's node rank: launcher.manual.host, else the one host whose name/address is ours."""
        hosts = self.plan.job.hosts
        chosen = self.plan.job.spec.launcher.manual.host
        if chosen is not None:
            return int(chosen) if chosen.isascii() and chosen.isdigit() else next(h.index for h in hosts if chosen in (h.name, h.addr))
        if len(hosts) == 1:
            return 0
        mine = [h.index for h in hosts if any(v in names and not is_loopback(v) for v in (h.name, h.addr) if v)]
        if len(mine) == 1:
            return mine[0]
        found = "several hosts match" if mine else "no host matches"
        return (f"{found} this machine ({', '.join(sorted(n for n in names if not is_loopback(n))[:6])}); "
                f"hint: add launcher.manual.host=<index> (the dry run prints each host's command)")

    def launch(self, request: LaunchRequest, recipe_cfg) -> int:
        node = self.this_host(LocalProbe().host_names())
        if isinstance(node, str):
            print(f"error: launcher.manual.host: {node}", file=sys.stderr)
            return 2
        if len(self.plan.job.hosts) > 1 and self.plan.job.spec.run_id is None:
            print("error: run_id: several hosts must share one run id and port, but none is pinned; "
                  "hint: run with dry_run=true and use the command it prints for each host", file=sys.stderr)
            return 2
        return self.run_host(node, recipe_cfg)
