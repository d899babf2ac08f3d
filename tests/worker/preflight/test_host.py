"""runner.worker.preflight.host: a host's checks together, before its processes start (which checks a host makes, in
which order, where it stops, the port host 0 holds meanwhile, the window a refused port is tried for), its line's
header and the GPUs it must see; with composed plans, on this machine's loopback (no process started). The checks one
by one: test_checks.py; a whole preflight: tests/worker/test_preflight.py."""

from __future__ import annotations

import dataclasses
import functools
import socket
from types import SimpleNamespace

import pytest

from clocks import Clock
from conftest import environment, make_spec, validate
from runner.common.polling import retry
from runner.launchers import plan_for
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.probe import FixedProbe
from runner.spec.schema import BackendConfig, InitConfig, InitMethod, JobConfig, ScriptRecipeConfig
from runner.spec.topology import Host
from runner.worker.preflight import checks
from runner.worker.preflight.checks import Check, HostChecks
from runner.worker.preflight.host import _gpus_needed, _header, _one_machine, _peer, host_checks

pytestmark = pytest.mark.unit

SCRIPT = "train.py"  # recipe=script: validation asks the probe whether it exists, and tries no import
ON_TB1 = environment(SLURMD_NODENAME="tb1")  # the machine as Slurm names it, shown in place of its host name
HINT_REFUSED = "is host 0 started, and is init.master_addr host 0's address? a firewall that rejects?"


def plan_of(spec: JobConfig, paths: RunPaths, probe: FixedProbe | None = None) -> Plan:
    got = validate(dataclasses.replace(spec, recipe=ScriptRecipeConfig(path=SCRIPT)),
                   probe or FixedProbe(paths=frozenset({SCRIPT})))
    assert got.valid, got.rendered()
    return plan_for(got.job, paths)


def two_hosts_here(paths: RunPaths, port: int, timeout_s: float = 300.0) -> Plan:
    """Two hosts started by hand, both this machine's loopback, meeting on ``port`` (gloo left to itself: no route
    to choose)."""
    return plan_of(make_spec(devices=[2, 2], addrs=["127.0.0.1", "127.0.0.2"], launcher="manual",
                             init=InitConfig(master_port=port, timeout_s=timeout_s),
                             backend=BackendConfig(pick_interface=False)), paths)


# -------------------------------------------------------------------------- what a host's line says of it


def test_every_host_is_this_machine_when_each_is_reached_by_loopback_or_one_of_its_names() -> None:
    here = frozenset({"thishost", "10.0.0.11"})
    assert _one_machine((Host(0, None, "127.0.0.1", 1, (0,)), Host(1, "thishost", None, 1, (0,)),
                         Host(2, None, "10.0.0.11", 1, (0,))), here)
    assert not _one_machine((Host(0, None, "127.0.0.1", 1, (0,)), Host(1, "other", None, 1, (0,))), here)
    assert not _one_machine((Host(0, None, None, 1, (0,)),), here)  # a host the launcher finds is not known to be


def test_the_peer_is_the_first_other_host_with_an_address_that_is_not_loopback() -> None:
    hosts = (Host(0, "a", "127.0.0.1", 1, (0,)), Host(1, "b", "10.0.0.12", 1, (0,)),
             Host(2, "no-such-host.invalid", None, 1, (0,)),
             Host(3, None, "10.0.0.14", 1, (0,)))
    assert _peer(hosts, 0) == ("10.0.0.12", "10.0.0.12")
    assert _peer(hosts, 1) == ("10.0.0.14", "10.0.0.14")  # not itself, not loopback, not a name that resolves nowhere
    assert _peer(hosts[:1], 0) is None and _peer(hosts[:2], 1) is None


def test_the_header_names_the_host_then_the_machine_and_the_address_on_the_route(paths) -> None:
    plan = plan_of(make_spec(devices=[1, 1], names=["a", "b"], addrs=["10.0.0.11", "10.0.0.12"], launcher="manual"),
                   paths)
    assert _header(plan, 1, ON_TB1, "10.0.0.12") == "preflight b (tb1, 10.0.0.12)"
    assert _header(plan, 1, environment(), "10.0.0.12") == "preflight b (10.0.0.12)"  # its name, said once
    assert _header(plan, 0, environment(), None) == "preflight a"


def test_an_unnamed_host_is_shown_by_this_machines_name(paths) -> None:
    plan = plan_of(make_spec(nodes=1, devices_per_node=1), paths)
    assert _header(plan, 0, environment(), None) == f"preflight node0 ({socket.gethostname()})"


def test_the_gpus_a_host_must_see_are_the_specs_indices_unless_the_scheduler_sets_cuda_visible_devices(paths) -> None:
    """Host 1 runs on GPUs 2 and 3: the runner gives each rank CUDA_VISIBLE_DEVICES from them (4 must be visible
    here); Slurm sets the variable itself and shows the task its node's GPUs (2)."""
    spec = make_spec(devices=[2, 2], names=["a", "b"], gpus=[[0, 1], [2, 3]], device="cuda", launcher="manual")
    probe = FixedProbe(cuda_devices=4, paths=frozenset({SCRIPT}))
    assert _gpus_needed(plan_of(spec, paths, probe), 1) == 4
    slurm = dataclasses.replace(spec, launcher=dataclasses.replace(spec.launcher, kind="slurm"))
    assert _gpus_needed(plan_of(slurm, paths, probe), 1) == 2


# -------------------------------------------------------------------------- a host's checks, in order


def test_one_host_with_file_init_checks_the_init_files_folder_and_its_devices_and_has_no_port(paths) -> None:
    plan = plan_of(make_spec(nodes=1, devices_per_node=2, init=InitConfig(method=InitMethod.file)), paths)
    assert host_checks(plan, 0, ON_TB1) == (HostChecks("preflight node0 (tb1)", (
        Check(f"init file folder {paths.root} writable"), Check("2 CPU process(es) as the spec says"))), None)


def test_an_init_dir_missing_on_this_host_ends_the_line_before_the_devices(paths, tmp_path) -> None:
    gone = tmp_path / "shared"  # there when the spec was validated (another host), not here
    spec = make_spec(nodes=1, devices_per_node=2, init=InitConfig(method=InitMethod.file, dir=str(gone)))
    plan = plan_of(spec, paths, FixedProbe(dirs=frozenset({str(gone)}), paths=frozenset({SCRIPT})))
    report, port = host_checks(plan, 0, ON_TB1)
    assert port is None and report.failed
    assert report.line() == (f"preflight node0 (tb1): FAILED: the init file's folder {gone} does not exist on this "
                             f"host — hint: shared storage: init.dir must be a folder every host sees at the same "
                             f"path (mkdir -p {gone} there, or mount it here)")


def test_host_0_holds_a_free_port_where_the_launch_picks_it_and_gives_it_back_after_its_checks(paths) -> None:
    plan = plan_of(make_spec(nodes=1, devices_per_node=2), paths)
    report, port = host_checks(plan, 0, ON_TB1)
    assert port != 0 and report == HostChecks("preflight node0 (tb1, 127.0.0.1)", (
        Check("master 127.0.0.1 (loopback: one host)"), Check("route via lo (127.0.0.1)"),
        Check(f"port {port} free and served here"), Check("2 CPU process(es) as the spec says")))
    with socket.socket() as store:  # the store binds it next, as runner.worker.rendezvous does
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", port))


def test_host_0_whose_port_is_taken_says_so_after_the_route(paths, listening_port) -> None:
    plan = plan_of(make_spec(nodes=1, devices_per_node=2, init=InitConfig(master_port=listening_port)), paths)
    report, port = host_checks(plan, 0, ON_TB1)
    assert port == listening_port
    assert report.line() == (
        f"preflight node0 (tb1, 127.0.0.1): master 127.0.0.1 (loopback: one host) · route via lo (127.0.0.1) · "
        f"FAILED: port {port} is not free on this host (host 0): cannot listen on 127.0.0.1:{port} (Address already "
        f"in use) — hint: another job holds the port; leave init.master_port=0 (a free port per run), or pick "
        f"another")


def test_another_host_of_this_machine_checks_the_master_the_route_the_interface_and_the_port(paths,
                                                                                              listening_port) -> None:
    report, port = host_checks(two_hosts_here(paths, listening_port), 1, environment(SLURMD_NODENAME="tb2"))
    assert port == listening_port
    assert report == HostChecks("preflight node1 (tb2, 127.0.0.1)", (
        Check("master 127.0.0.1 (loopback: every host is this machine)"), Check("route via lo (127.0.0.1)"),
        Check("loopback between the processes (every host is this machine)"), Check(f"port {port} reachable"),
        Check("2 CPU process(es) as the spec says")))


def test_a_refused_port_is_tried_again_for_init_timeout_s_when_that_is_shorter_than_the_window(
        paths, closed_port, monkeypatch) -> None:
    """Host 0 may start later: another host tries its port for CONNECT_WINDOW_S at most, within init.timeout_s (on a
    made-up clock: real refusals, no wait)."""
    clock = Clock()
    monkeypatch.setattr(checks, "retry", functools.partial(retry, clock=clock, sleep=clock.sleep))
    monkeypatch.setattr(checks, "time", SimpleNamespace(monotonic=clock))
    report, _ = host_checks(two_hosts_here(paths, closed_port, timeout_s=5.0), 1, environment(SLURMD_NODENAME="tb2"))
    assert report.checks[-1] == Check.failed(
        f"port {closed_port} on 127.0.0.1 (reached via lo) refused the connection for 5 s: nothing listens there",
        HINT_REFUSED)
    assert len(report.checks) == 4 and clock.now == 5.0  # the devices are not checked after it
    assert checks.MANUAL_CONNECT_WINDOW_S > 5.0
