"""runner.launchers.manual, without processes: its rules, the command it gives each host (request) and which host
this machine is (this_host). The commands as text are golden files (test_golden_commands.py); two hosts launched by
hand for real are in test_multihost.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TARGET, compose, environment, hosts_override, validate
from runner.launchers import Invocation, plan_for
from runner.launchers.manual import ManualLauncher
from runner.launchers.manual.launcher import NotOneHost
from runner.records.paths import RunPaths
from runner.plan.processes import Deferred, port_for
from runner.spec.pins import pinned

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")
NAMED = hosts_override({"name": "gpu-a", "addr": "10.0.0.1", "devices": 2}, {"name": "gpu-b", "addr": "10.0.0.2",
                                                                             "devices": 1})
NAMED_ALIKE = hosts_override({"name": "gpu-a", "addr": "10.0.0.1", "devices": 2},
                             {"name": "gpu-b", "addr": "10.0.0.2", "devices": 2})  # (hosts of one size: spares fit)
ON_ONE = ("topology.min_nodes=1", "launcher.max_restarts=3", "launcher.manual.etcd=[10.0.0.5:2379]")  # (an etcd of
# the user's: the job goes on with one host)


def launcher(*overrides: str, invocation: Invocation | None = None) -> ManualLauncher:
    """launcher=manual on ``overrides``, pinned and planned as the launch does it."""
    got = validate(("launcher=manual", "device=cpu", "recipe.global_batch_size=6", *overrides))
    assert got.valid, got.rendered()
    job = pinned(got.job, ManualLauncher.pins(got.job, PATHS))
    invocation = invocation or Invocation(python="/venv/bin/python", cwd="/work/proj")
    return ManualLauncher(plan=plan_for(job, PATHS), paths=PATHS, invocation=invocation, environment=environment())


def test_each_host_gets_the_users_command_with_the_run_pinned_and_its_own_index() -> None:
    typed = ("--x", "run_id=old", "launcher.manual.host=1", "init.master_port=7", "dry_run=true", "recipe.epochs=3")
    chosen = launcher(*NAMED, "recipe.epochs=3", "init.master_port=29400",
                      invocation=Invocation(python="/venv/bin/python", cwd="/work/proj", overrides=typed, config_dir="/cfg",
                                            config_name="myjob", run_command="/venv/bin/run"))
    request = chosen.request()
    assert request.launcher == "manual" and request.files == {}
    assert [(c.host, c.note, c.cwd) for c in request.commands] == [
        ("host 0 (10.0.0.1)", "starts 2 process(es)", "/work/proj"), ("host 1 (10.0.0.2)", "starts 1 process(es)",
                                                                      "/work/proj")]
    for i, command in enumerate(request.commands):  # the pinned keys typed are replaced, the rest repeated in order
        assert command.argv == ("/venv/bin/run", "--config-dir", "/cfg", "--config-name", "myjob", "--x",
                                "recipe.epochs=3", "run_id=R1", "init.master_port=29400", f"launcher.manual.host={i}")


def test_without_a_port_in_the_spec_the_hosts_agree_on_the_run_ids() -> None:
    several = launcher(*NAMED)
    assert several.plan.job.spec.init.master_port == port_for("R1")  # pinned: every host's command carries it
    assert [c.argv[-2:] for c in several.request().commands] == [
        (f"init.master_port={port_for('R1')}", f"launcher.manual.host={i}") for i in range(2)]
    job = several.plan.job
    assert ManualLauncher.master_port(job, PATHS) == str(port_for("R1"))
    assert ManualLauncher.master_port(job, None) == Deferred.of("port derived from the run id")
    one = launcher("topology=1x2").plan.job  # one host: a free port, chosen when it starts
    assert ManualLauncher.master_port(one, PATHS) == Deferred.of("free port chosen at launch")


@pytest.mark.parametrize("chosen, node", [("1", 1), ("gpu-b", 1), ("10.0.0.1", 0), ("0", 0)])
def test_the_host_named_on_the_command_line_wins(chosen, node) -> None:
    assert launcher(*NAMED, f"launcher.manual.host={chosen}").this_host(frozenset({"gpu-a", "10.0.0.1"})) == node


def test_this_host_is_the_one_whose_name_or_address_is_this_machines() -> None:
    hosts = launcher(*NAMED)
    assert hosts.this_host(frozenset({"gpu-b", "192.168.1.9"})) == 1
    assert hosts.this_host(frozenset({"other", "10.0.0.1"})) == 0  # by address
    assert launcher("topology=1x2").this_host(frozenset()) == 0  # one host: this one, whatever its names


def test_no_host_or_several_hosts_of_this_machine_is_said_with_the_way_out() -> None:
    with pytest.raises(NotOneHost) as none:
        launcher(*NAMED).this_host(frozenset({"laptop", "127.0.0.1", "192.168.1.9"}))
    assert str(none.value) == ("no host matches this machine (192.168.1.9, laptop); hint: add "
                               "launcher.manual.host=<index> (the dry run prints each host's command)")
    with pytest.raises(NotOneHost) as both:
        launcher(*NAMED).this_host(frozenset({"gpu-a", "gpu-b"}))
    assert str(both.value).startswith("several hosts match this machine (gpu-a, gpu-b); hint: add "
                                      "launcher.manual.host=<index>")
    # loopback names are every machine's: they never tell which host this is
    loopback = launcher(*hosts_override({"name": "localhost", "devices": 1}, {"name": "127.0.0.2", "devices": 1}),
                        "init=file", "init.dir=/shared", "recipe.global_batch_size=2")
    with pytest.raises(NotOneHost) as neither:
        loopback.this_host(frozenset({"localhost", "127.0.0.2"}))
    assert str(neither.value).startswith("no host matches this machine ()")


def test_a_chosen_host_that_is_no_host_is_refused() -> None:
    past = validate(("launcher=manual", *NAMED, "launcher.manual.host=2", "recipe.global_batch_size=6"))
    assert past.find("launcher.manual.host", "index 2 is past the last host (the topology has 2: 0..1)")
    unknown = validate(("launcher=manual", *NAMED, "launcher.manual.host=gpu-c", "recipe.global_batch_size=6"))
    assert unknown.find("launcher.manual.host", "'gpu-c' is none of the hosts ['10.0.0.1', '10.0.0.2']")


def test_a_host_the_spec_does_not_list_may_arrive_only_where_the_job_has_room_above_its_hosts() -> None:
    """launcher.manual.host=<a name the spec does not list>: a host that arrives, in a job that outlives its hosts with
    topology.max_nodes above them; its launch is the job's with it as the last spare, its devices the hosts'."""
    elastic = ("launcher=manual", *NAMED_ALIKE, *ON_ONE)
    no_room = validate((*elastic, "launcher.manual.host=gpu-c"))
    assert no_room.find("launcher.manual.host", "'gpu-c' is none of the hosts ['10.0.0.1', '10.0.0.2']"), \
        no_room.rendered()
    assert "topology.max_nodes=3" in no_room.rendered()
    bad = validate((*elastic, "topology.max_nodes=3", "launcher.manual.host=gpu-c", "launcher.manual.addr='a b'"))
    assert bad.find("launcher.manual.addr", "'a b' is not a host name or IP address"), bad.rendered()
    listed = validate((*elastic, "launcher.manual.host=gpu-a", "launcher.manual.addr=10.0.0.7"))
    assert listed.find("launcher.manual.addr", "'10.0.0.7' for 'gpu-a', a machine the spec lists"), listed.rendered()
    arriving = launcher(*NAMED_ALIKE, *ON_ONE, "topology.max_nodes=3", "launcher.manual.host=gpu-c",
                        "launcher.manual.addr=10.0.0.3")._arriving()
    assert arriving is not None and arriving._listed is not None
    assert [(h.name, h.addr, h.devices) for h in arriving.plan.job.spares] == [("gpu-c", "10.0.0.3", 2)]
    assert [h.label for h in arriving._listed.spares] == []  # (the job's own etcd: the spec's machines' members)
    assert launcher(*NAMED_ALIKE, *ON_ONE, "topology.max_nodes=3", "launcher.manual.host=gpu-a")._arriving() is None


def test_a_non_ascii_digit_as_the_host_is_a_problem_not_a_crash() -> None:
    """``'²'.isdigit()`` is True, and ``int('²')`` raises: `run` ended in a traceback (exit 1) instead of exit 2 with
    a message. The host is an index only in ASCII digits (this_host reads it so too)."""
    spec = compose(f"recipe.target={TARGET}", *hosts_override({"name": "a", "devices": 1}, {"name": "b", "devices": 1}),
                   "launcher=manual", "launcher.manual.host='²'")
    assert validate(spec).find("launcher.manual.host", "'²' is none of the hosts")


def test_several_hosts_need_names_and_a_master() -> None:
    unnamed = validate(("launcher=manual", "topology=2x1", "recipe.global_batch_size=2"))
    assert unnamed.find("topology.hosts", "launcher=manual must know every host, but host(s) [0, 1] have no name")


def test_the_dry_run_says_how_a_job_that_outlives_its_hosts_goes_on_where_it_decides_and_finds_a_host_lost() -> None:
    """With topology.min_nodes: the commands, then what each host's `run` does (runner.launchers.manual.rounds), in
    the job's own etcd or in the user's."""
    from runner.launchers.elastic.etcd_member import OwnCluster

    overrides = (*hosts_override(*({"name": n, "devices": 1} for n in "abc")), "init=tcp", "topology.min_nodes=2",
                 "launcher.max_restarts=3", "launcher.manual.keepalive_s=3")
    chosen = launcher(*overrides)
    own = OwnCluster.of(chosen.plan.job)
    said = [c.host for c in chosen.request().commands if c.argv is None]
    assert said == [
        "a lost host ends the attempt; the job restarts from the last checkpoint on the hosts that remain, while at "
        "least 2 of 3 do (topology.min_nodes)",
        f"who goes on after a loss is decided in the job's own etcd: a member started by each host's and spare's `run` "
        f"(3: a, b, c; clients on port {own.client_port}, peers on {own.peer_port}, derived from the run id), one "
        f"decision per attempt, made once (a compare-and-swap), which every host follows; it decides while 2 of its 3 "
        f"members are up, so the job goes on down to 2 host(s)",
        "each host's `run` keeps a lease in etcd alive every 3 s (launcher.manual.keepalive_s): a host whose lease "
        "expires (12 s without a keepalive: its `run`, machine or network gone) and whose key stays gone 6 s more is "
        "lost, and its peers end the attempt"]
    users = [c.host for c in launcher(*overrides, "launcher.manual.etcd=[10.0.0.9:2379]").request().commands
             if c.argv is None]
    assert users[1].startswith("who goes on after a loss is decided in your etcd (10.0.0.9:2379): one decision per "
                               "attempt")
    assert not [c for c in launcher(*NAMED).request().commands if c.argv is None]  # without it: the commands alone


def test_the_job_s_own_etcd_sets_the_floor_and_needs_its_program() -> None:
    """Two hosts, topology.min_nodes=1: the job's own etcd needs both of its members, so it cannot go on with one:
    refused with the numbers (an etcd of the user's lets it); no etcd program here: refused with the way out."""
    two = (*hosts_override({"name": "a", "devices": 1}, {"name": "b", "devices": 1}), "launcher=manual", "device=cpu",
           "init=tcp", "topology.min_nodes=1", "launcher.max_restarts=1")
    problem = validate(two).find("topology.min_nodes", "with the job's own etcd")
    assert problem is not None and problem.message == (
        "1 with the job's own etcd: it has a member on each of the 2 host(s) and spare(s) and decides while 2 of 2 are "
        "up (2 // 2 + 1), so the job cannot go on with fewer than 2 host(s)")
    assert "launcher.manual.etcd=[host:port]" in problem.hint
    assert validate((*two, "launcher.manual.etcd=[10.0.0.9:2379]")).valid
    three = (*hosts_override(*({"name": n, "devices": 1} for n in "abc")), "launcher=manual", "device=cpu", "init=tcp",
             "topology.min_nodes=2", "launcher.max_restarts=1")
    missing = validate(three, programs=frozenset())
    assert missing.find("launcher.manual.etcd", "needs the `etcd` program on every host") is not None
    assert validate((*two, "launcher.manual.etcd=[not a host:x]")).find("launcher.manual.etcd[0]", "is not host:port")


def test_a_spare_gets_a_command_of_its_own_and_is_a_host_this_machine_may_be() -> None:
    spared = launcher(*hosts_override(*({"name": n, "devices": 1} for n in "ab")), "init=tcp",
                      "topology.spares=[{name: s1, devices: 1}]", "launcher.max_restarts=1")
    commands = [c for c in spared.request().commands if c.argv is not None]
    assert [(c.host, c.argv[-1], c.note) for c in commands] == [
        ("host 0 (a)", "launcher.manual.host=0", "starts 1 process(es)"),
        ("host 1 (b)", "launcher.manual.host=1", "starts 1 process(es)"),
        ("spare s1", "launcher.manual.host=s1", "waits, ready to take a lost host's place")]
    assert spared.this_host(frozenset({"s1"})) == 2  # a spare's index follows the hosts'
    past = validate(("launcher=manual", "device=cpu", "init=tcp", "recipe.global_batch_size=6",
                     *hosts_override(*({"name": n, "devices": 1} for n in "ab")),
                     "topology.spares=[{name: s1, devices: 1}]", "launcher.max_restarts=1", "launcher.manual.host=3"))
    problem = past.find("launcher.manual.host", "past the last host")
    assert problem is not None and "the topology has 2 and 1 spare(s): 0..2" in problem.message, past.rendered()
    assert validate(("launcher=manual", "device=cpu", "init=tcp", "recipe.global_batch_size=6",
                     *hosts_override(*({"name": n, "devices": 1} for n in "ab")),
                     "topology.spares=[{name: s1, devices: 1}]", "launcher.max_restarts=1",
                     "launcher.manual.host=s1")).valid
