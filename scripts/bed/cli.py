"""The command line: up, down, env, exec (the module docstring of scripts/bed/__init__.py says what they do)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import bed
from bed import common
from bed.common import TestbedError, machine_lock, say
from bed.layout import DATA_IF, DECOY_IF, MAX_HOSTS, SAFE_PATH_RE, Paths, check_prefix, find_host, load_plan, make_plan
from bed.lifecycle import build, teardown
from bed.network import create_bridge, delete_network


def check_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("run as root: namespaces, links and /etc/hosts need it")


def state_dir(raw: str) -> Path:
    path = Path(raw).absolute()
    if not SAFE_PATH_RE.fullmatch(str(path)):
        raise TestbedError(f"--state {str(path)!r}: use letters, digits and ._/+- only (the path goes into "
                           f"slurm.conf and command lines)")
    return path


def cmd_up(args: argparse.Namespace) -> int:
    check_root()
    if not 1 <= args.hosts <= MAX_HOSTS:
        raise TestbedError(f"--hosts {args.hosts}: between 1 and {MAX_HOSTS}")
    if args.cpus < 1:
        raise TestbedError(f"--cpus {args.cpus}: at least 1")
    check_prefix(args.prefix, args.hosts)
    paths = Paths(state_dir(args.state))
    if paths.plan.exists():
        raise TestbedError(f"{paths.root} holds a bed already: run `down --state {paths.root}` first")
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(exist_ok=True)
    paths.pids.mkdir(exist_ok=True)
    started = time.monotonic()
    with machine_lock():
        plan = make_plan(args, paths.root)
        paths.plan.write_text(json.dumps(plan.to_json(), indent=2) + "\n")
        try:
            create_bridge(plan)  # claims the subnets: the next bed's used_networks() sees them
        except BaseException:
            delete_network(plan)
            paths.plan.unlink(missing_ok=True)
            raise
    try:
        description = build(plan, paths)
    except BaseException as e:
        say(f"up {'interrupted' if isinstance(e, (SystemExit, KeyboardInterrupt)) else 'failed'}: "
            f"tearing down what was made")
        try:
            teardown(plan, paths)
        except TestbedError as cleanup:
            print(f"testbed up: {cleanup}", file=sys.stderr)  # the first failure is the one to raise
        raise
    say(f"bed {plan.tag} up in {time.monotonic() - started:.1f} s (state {paths.root})")
    print(json.dumps(description, indent=2))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    check_root()
    paths = Paths(state_dir(args.state))
    plan = load_plan(paths)
    if plan is None:
        say(f"nothing to take down in {paths.root}")
        return 0
    started = time.monotonic()
    teardown(plan, paths)
    say(f"bed {plan.tag} down in {time.monotonic() - started:.1f} s")
    return 0


def running_description(paths: Paths) -> dict:
    try:
        return json.loads(paths.description.read_text())
    except FileNotFoundError:
        raise TestbedError(f"no bed is up in {paths.root} (no {paths.description.name})") from None


def cmd_env(args: argparse.Namespace) -> int:
    paths = Paths(state_dir(args.state))
    desc = running_description(paths)
    print(f"# test bed {desc['tag']}: hosts {' '.join(h['name'] for h in desc['hosts'])}")
    if not desc["env"]:
        print("# (no Slurm cluster in this bed)")
    for k, v in desc["env"].items():
        print(f"export {k}={shlex.quote(v)}")
    print(f"export TESTBED_STATE={shlex.quote(desc['state'])}")
    print(f"export TESTBED_MPIRUN_ARGS={shlex.quote(shlex.join(desc['mpirun_args']))}")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    paths = Paths(state_dir(args.state))
    plan = load_plan(paths)
    if plan is None:
        raise TestbedError(f"no bed is up in {paths.root}")
    host = find_host(plan, args.host)
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise TestbedError("exec: give a command after --")
    os.execvp("nsenter", ["nsenter", f"--net={host.netns_path}", "--", *argv])
    return 127  # not reached


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=bed.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="create a bed, print its JSON description")
    up.add_argument("--state", required=True, help="directory for everything of this bed")
    up.add_argument("--hosts", type=int, default=2, help="number of namespace hosts (default 2)")
    up.add_argument("--cpus", type=int, default=8, help="CPUs each Slurm node claims (default 8)")
    up.add_argument("--slurm", action="store_true", help="run a Slurm cluster (munged, slurmctld, slurmd per host)")
    up.add_argument("--slurmd-timeout", type=int, default=30,
                    help="Slurm's SlurmdTimeout: seconds before a silent node is marked down (default 30)")
    up.add_argument("--sshd", action="store_true", help="an sshd in every host, keys and an ssh_config (bed.sshd)")
    up.add_argument("--decoy", action="store_true", help=f"give each host a {DECOY_IF} that routes nowhere")
    up.add_argument("--data-network", action="store_true",
                    help=f"a second network: a bridge of its own and a {DATA_IF} in every host, for cutting a host's "
                         f"data link while its lan still answers")
    up.add_argument("--prefix", default="tb", help="start of every name (default tb)")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="take the bed in --state down (idempotent)")
    down.add_argument("--state", required=True)
    down.set_defaults(func=cmd_down)

    env = sub.add_parser("env", help="print export lines for using the bed from a shell")
    env.add_argument("--state", required=True)
    env.set_defaults(func=cmd_env)

    ex = sub.add_parser("exec", help="run a command in a host's network namespace")
    ex.add_argument("--state", required=True)
    ex.add_argument("host", help="host name, address or h<i>")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command...")
    ex.set_defaults(func=cmd_exec)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    common.VERBOSE = not args.quiet
    # SIGTERM/SIGHUP during `up` must still tear down: turn them into an exception
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        return args.func(args)
    except TestbedError as e:
        print(f"testbed {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"testbed {args.command}: interrupted", file=sys.stderr)
        return 130
