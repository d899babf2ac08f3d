"""runner.worker.preparation: what each rank's setup gets (what the terminal shows of it, its environment, its
notes), the master checked from another host, and an attempt prepared as a value: Prepared, or Refused with the line
that says why (a failed preflight check, a refused rendezvous, an unreachable master). Whole runs:
tests/launchers/test_local_launcher.py, tests/e2e."""

from __future__ import annotations

import dataclasses
import functools
import signal
from types import SimpleNamespace

import pytest

from clocks import Clock
from conftest import make_spec, validate
from runner.common.polling import retry
from runner.environments.process import ProcessEnvironment
from runner.environments.slurm import SlurmEnvironment
from runner.launchers import plan_for
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.probe import FixedProbe
from runner.spec.schema import BackendConfig, InitConfig, InitMethod, JobConfig, LogConfig, ScriptRecipeConfig
from runner.common import exits
from runner.worker import preparation
from runner.worker.preparation import Preparation, Prepared, Refused, master_unreachable, rank_setups
from runner.worker.share import AgentRole
from runner.worker.network import NetworkError
from runner.worker.preflight import checks
from runner.worker.preflight.checks import Check, HostChecks
from runner.worker.relay import Echo
from runner.worker.rendezvous import Rendezvous
from runner.worker.setup import RankSetup

pytestmark = pytest.mark.unit

EIGHT_CPUS = ProcessEnvironment(slurm=SlurmEnvironment.read({}), mpi=None, cpu_count=8)  # nothing set by the user
RDZV = Rendezvous("env://", "29500", True, notes=["init: the store of host 0"])


def two_hosts(*, script: bool = False, console: str = "main", ifname: str | None = None,
              init: InitConfig | None = None) -> JobConfig:
    """Hosts a (ranks 0, 1) and b (ranks 2, 3) of this machine, started by hand; the digits recipe, or a script."""
    spec = make_spec(devices=[2, 2], names=["a", "b"], addrs=["127.0.0.1", "127.0.0.2"], launcher="manual", init=init,
                     backend=BackendConfig(pick_interface=False, socket_ifname=ifname))  # no route asked
    return dataclasses.replace(spec, log=LogConfig(console=console),
                               recipe=ScriptRecipeConfig(path="train.py") if script else spec.recipe)


class Probe(FixedProbe):
    """FixedProbe's machine, where every recipe target imports (trying one takes a process: tests/spec/
    test_targets.py) and train.py is there."""

    def target_problem(self, target: str, workdir: str | None) -> None:
        return None


def plan_of(spec: JobConfig, paths: RunPaths) -> Plan:
    got = validate(spec, Probe(paths=frozenset({"train.py"})))
    assert got.valid, got.rendered()
    return plan_for(got.job, paths)


def setups_of(spec: JobConfig, paths: RunPaths, node_rank: int = 1, **kwargs: object) -> list[RankSetup]:
    return rank_setups(plan_of(spec, paths), node_rank, RDZV, paths, EIGHT_CPUS, **kwargs)


# -------------------------------------------------------------------------- what each rank's setup gets


def test_log_console_main_shows_each_hosts_first_process_and_draws_rank_0s_bar_live_on_a_terminal(paths) -> None:
    spec = two_hosts()
    assert [s.echo for s in setups_of(spec, paths, 0, terminal_is_tty=True)] == [
        Echo(shown=True, progress=True, live_bar=True), Echo()]
    assert [s.echo for s in setups_of(spec, paths, 0)] == [Echo(shown=True, progress=True), Echo()]
    assert [s.echo for s in setups_of(spec, paths, 1, terminal_is_tty=True)] == [Echo(shown=True), Echo()]


def test_log_console_all_shows_every_rank_prefixed_with_its_rank_and_host(paths) -> None:
    assert [s.echo for s in setups_of(two_hosts(console="all"), paths)] == [
        Echo(shown=True, prefix="[rank 2 b] ", progress=True), Echo(shown=True, prefix="[rank 3 b] ", progress=True)]


def test_log_console_listing_ranks_shows_those_global_ranks_only(paths) -> None:
    assert [s.echo for s in setups_of(two_hosts(console="1,3"), paths)] == [
        Echo(), Echo(shown=True, prefix="[rank 3 b] ", progress=True)]
    assert [s.echo for s in setups_of(two_hosts(console="1,3"), paths, 0)] == [
        Echo(), Echo(shown=True, prefix="[rank 1 a] ", progress=True)]


def test_a_ranks_environment_is_the_plans_with_the_port_and_store_of_the_rendezvous_and_the_runs_scratch(paths) -> None:
    setup = setups_of(two_hosts(), paths)[1]
    assert setup.env == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default", "RANK": "3", "LOCAL_RANK": "1", "ROLE_RANK": "3", "TORCHELASTIC_RUN_ID": "r1",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_ERROR_FILE": f"{paths.logs}/rank00003.elastic-error.json",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "4",
        "TORCH_FR_BUFFER_SIZE": "200", "TMPDIR": str(paths.scratch(3))}


def test_every_rank_gets_the_rendezvous_the_plans_stop_signal_and_the_notes_on_its_interface(paths) -> None:
    for setup in setups_of(two_hosts(ifname="lo"), paths):
        assert (setup.init_method, setup.stop_signal, setup.backend) == ("env://", signal.SIGUSR1, "gloo")
        assert setup.notes == ("init: the store of host 0", "network: interface lo (backend.socket_ifname)")
        assert (setup.env["GLOO_SOCKET_IFNAME"], setup.env["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    left = setups_of(two_hosts(), paths)[0]
    assert left.notes == ("init: the store of host 0",
                          "network: backend.pick_interface=false: gloo and NCCL choose their interface")
    assert "GLOO_SOCKET_IFNAME" not in left.env


def test_the_hosts_preflight_goes_to_its_first_process_which_prints_the_line(paths) -> None:
    report = HostChecks("preflight b", (Check("2 CPU process(es) as the spec says"),))
    assert [s.preflight for s in setups_of(two_hosts(), paths, preflight=report)] == [report, None]


def test_a_master_whose_name_does_not_resolve_is_a_network_error_before_any_setup(paths) -> None:
    with pytest.raises(NetworkError) as refused:
        setups_of(make_spec(devices=[1, 1], names=["no-such-host.invalid", "b"], launcher="manual"), paths)
    assert refused.value.message.startswith("master address 'no-such-host.invalid' does not resolve (")
    assert refused.value.hint == "use an address, or fix name resolution (/etc/hosts, DNS) on every host"


# -------------------------------------------------------------------------- the master, from another host


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The clock a refused port is tried again on: made up, so that a window of init.timeout_s takes no time."""
    clock = Clock()
    monkeypatch.setattr(checks, "retry", functools.partial(retry, clock=clock, sleep=clock.sleep))
    monkeypatch.setattr(checks, "time", SimpleNamespace(monotonic=clock))
    return clock


def unreachable(spec: JobConfig, paths: RunPaths, node_rank: int, port: int) -> str | None:
    plan = plan_of(spec, paths)
    rdzv = Rendezvous("env://", str(port), True)
    return master_unreachable(plan, node_rank, rdzv, rank_setups(plan, node_rank, rdzv, paths, EIGHT_CPUS))


def test_the_master_is_not_dialled_from_host_0_with_file_init_or_before_the_launch_knows_it(paths, closed_port,
                                                                                            clock) -> None:
    assert unreachable(two_hosts(), paths, 0, closed_port) is None
    assert unreachable(two_hosts(init=InitConfig(method=InitMethod.file, dir="/shared")), paths, 1, closed_port) is None
    slurm = make_spec(nodes=2, devices_per_node=1, launcher="slurm")  # the master: the allocation's first node
    assert unreachable(slurm, paths, 1, closed_port) is None


def test_a_listening_master_is_reachable(paths, listening_port, clock) -> None:
    assert unreachable(two_hosts(), paths, 1, listening_port) is None


def test_an_unreachable_master_is_tried_for_init_timeout_s_and_named_with_its_port_and_interface(
        paths, closed_port, clock) -> None:
    """Host 0 may start later: a refused port is tried again until init.timeout_s."""
    said = unreachable(two_hosts(ifname="lo", init=InitConfig(timeout_s=2.0)), paths, 1, closed_port)
    assert said == (f"the master 127.0.0.1:{closed_port} cannot be reached from this host: port {closed_port} on "
                    f"127.0.0.1 (reached via lo) refused the connection for 2 s: nothing listens there; hint: is host "
                    f"0 started, and is init.master_addr host 0's address? a firewall that rejects?")
    assert clock.now == 2.0




# -------------------------------------------------------------------------- an attempt prepared, or refused


def preparation_of(node_rank: int = 0, only: int | None = None, stopping: bool = False) -> Preparation:
    """An agent's preparation with no zygote: these tests serve no store and reach none."""
    return Preparation(role=AgentRole(node_rank=node_rank, only=only), environment=EIGHT_CPUS,
                       zygote=None, stopping=lambda: stopping)  # type: ignore[arg-type]


def one_host_file_init(paths: RunPaths) -> Plan:
    return plan_of(make_spec(nodes=1, devices_per_node=2, init=InitConfig(method=InitMethod.file)), paths)


def test_an_attempt_is_prepared_as_a_value_with_its_setups_channel_and_attempt(paths) -> None:
    plan = one_host_file_init(paths)
    prepared = preparation_of().prepare(plan, paths)
    assert isinstance(prepared, Prepared)
    assert (prepared.plan, prepared.paths, prepared.report) == (plan, paths, None)
    assert [s.place.global_rank for s in prepared.setups] == [0, 1] and isinstance(prepared.setups, tuple)
    assert prepared.channel is not None and prepared.channel.attempt() == 0  # host 0 opened its attempt
    assert prepared.rdzv.init_method == f"file://{paths.rendezvous_file(None)}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.plan = plan  # type: ignore[misc]


def test_a_task_per_process_prepares_its_one_rank(paths) -> None:
    prepared = preparation_of(only=1).prepare(one_host_file_init(paths), paths)
    assert isinstance(prepared, Prepared) and [s.place.global_rank for s in prepared.setups] == [1]


def test_a_stale_init_file_is_refused_as_invalid_with_the_rendezvous_error(paths) -> None:
    plan = one_host_file_init(paths)
    stale = paths.rendezvous_file(None)
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("")
    refused = preparation_of().prepare(plan, paths)
    assert refused == Refused(code=exits.INVALID, line=f"error: init: init file {stale} already exists (a stale file "
                                                          f"from an earlier run?); it is never reused; hint: remove it or "
                                                          f"start a new run")


def test_a_master_that_does_not_resolve_is_refused_as_a_network_error(paths) -> None:
    plan = plan_of(make_spec(devices=[1, 1], names=["no-such-host.invalid", "b"], launcher="manual"), paths)
    refused = preparation_of(node_rank=1).prepare(plan, paths)
    assert isinstance(refused, Refused) and refused.code == exits.INVALID and not refused.stdout
    assert refused.line.startswith("error: network: master address 'no-such-host.invalid' does not resolve (")


def test_a_failed_preflight_check_is_refused_with_its_report_line_on_stdout(paths, monkeypatch) -> None:
    plan = plan_of(dataclasses.replace(make_spec(nodes=1, devices_per_node=2), preflight=True), paths)
    report = HostChecks("preflight a", (Check.failed("no GPU", "use device=cpu"),))
    monkeypatch.setattr(preparation.preflight_host, "host_checks", lambda *_args: (report, None))
    refused = preparation_of().prepare(plan, paths)
    assert refused == Refused(code=exits.FAILED, line=report.line(), stdout=True)


def test_the_port_preflight_tested_is_the_prepared_plans_and_the_plan_given_stays_as_it_was(paths, monkeypatch) -> None:
    plan = plan_of(dataclasses.replace(make_spec(nodes=1, devices_per_node=2), preflight=True), paths)
    report = HostChecks("preflight a", (Check("2 CPU process(es) as the spec says"),))
    monkeypatch.setattr(preparation.preflight_host, "host_checks", lambda *_args: (report, 29877))
    served: list[Plan] = []

    def rendezvous(plan: Plan, *_args: object, **_kwargs: object) -> Rendezvous:
        served.append(plan)
        return Rendezvous("env://", str(plan.master_port), True)

    monkeypatch.setattr(preparation, "prepare_rendezvous", rendezvous)
    prepared = preparation_of().prepare(plan, paths)
    assert isinstance(prepared, Prepared) and prepared.report == report
    assert prepared.plan.master_port == "29877" and served == [prepared.plan]
    assert plan.master_port != "29877"  # a value: the agent's plan is not changed
    assert {s.env["MASTER_PORT"] for s in prepared.setups} == {"29877"}


# -------------------------------------------------------------------------- the data-network check of every pair


def test_the_pair_check_runs_between_the_hosts_of_a_job_on_several_and_a_passing_one_refuses_nothing(paths,
                                                                                                       tmp_path) -> None:
    """Hosts a and b, each a thread here, over one channel (a folder): each listens and dials the other, host 0 makes
    the verdict, nobody is named. One host, a task per process, init=file, or backend.pair_check_s=0: no check."""
    import threading

    from runner.worker.channel import JobChannel

    plan = plan_of(two_hosts(), paths)
    channel = JobChannel.in_folder(tmp_path / "channel")
    setups = {n: rank_setups(plan, n, RDZV, paths, EIGHT_CPUS) for n in (0, 1)}
    got: dict[int, Refused | None] = {}
    both = [threading.Thread(target=lambda n=n: got.update({n: preparation_of(n)._check_pairs(
        plan, channel, paths, setups[n])})) for n in (0, 1)]
    for t in both:
        t.start()
    for t in both:
        t.join(60)
    assert got == {0: None, 1: None}
    assert channel.pairs("0/verdict") == {"named": None, "failed": [], "hung": ""}
    assert channel.pairs("0/heard/1") == {"0": ""}
    off = dataclasses.replace(plan.job.spec, backend=dataclasses.replace(plan.job.spec.backend, pair_check_s=0))
    for quiet, prep in ((plan_of(off, paths), preparation_of(0)), (plan, preparation_of(0, only=0)),
                        (one_host_file_init(paths), preparation_of(0))):
        assert prep._check_pairs(quiet, JobChannel.in_folder(tmp_path / "quiet"), paths, setups[0]) is None
    assert not (tmp_path / "quiet").exists() or not any((tmp_path / "quiet").iterdir())


def test_a_host_the_check_names_is_refused_as_leaving_and_the_others_refused_naming_it(paths, monkeypatch) -> None:
    from runner.worker.channel import JobChannel
    from runner.worker.pair_check import Verdict

    named = Verdict(failed={(0, 1): "0 -> 1: no answer from 10.0.0.2:4000 within 5 s"}, named=1)
    monkeypatch.setattr(preparation, "check_pairs", lambda *_a, **_k: named)
    plan = plan_of(two_hosts(), paths)
    why = ("host 1 (b) failed the data-network check before attempt 1 (1 of the failed pair(s): host 0 (a) and host 1 "
           "(b): 0 -> 1: no answer from 10.0.0.2:4000 within 5 s)")
    for node, leaving in ((0, None), (1, why)):
        refused = preparation_of(node)._check_pairs(plan, JobChannel.in_folder(paths.root / "c"), paths,
                                                    rank_setups(plan, node, RDZV, paths, EIGHT_CPUS))
        assert isinstance(refused, Refused) and refused.code == exits.FAILED and refused.leaving == leaving
        assert refused.line.startswith(f"error: network: {why}; hint: check that host's data interface")


def test_a_host_behind_in_the_two_hangs_before_is_refused_as_leaving_and_the_others_refused_naming_it(
        paths, tmp_path) -> None:
    """Host 0's run folder holds the hangs of attempts 1 and 2 (b's ranks behind, a's waiting): before attempt 3,
    with every pair answering, host 0's agent names b (runner.worker.hung_hosts), and b leaves."""
    import json
    import threading

    from runner.worker.channel import JobChannel
    from runner.worker.hung_hosts import Hang

    third = dataclasses.replace(paths, attempt=2)
    third.logs.mkdir(parents=True, exist_ok=True)
    third.hangs.write_text("".join(json.dumps(Hang(k, "stall", f"all_reduce #{20 + k}", ("b",), ("a",)).document())
                                   + "\n" for k in (0, 1)))
    plan = plan_of(two_hosts(), third)
    channel = JobChannel.in_folder(tmp_path / "channel")
    got: dict[int, Refused | None] = {}
    both = [threading.Thread(target=lambda n=n: got.update({n: preparation_of(n)._check_pairs(
        plan, channel, third, rank_setups(plan, n, RDZV, third, EIGHT_CPUS))})) for n in (0, 1)]
    for t in both:
        t.start()
    for t in both:
        t.join(60)
    why = ("host 1 (b) hung the job in attempts 1 and 2: its ranks never entered the collective the other hosts' ranks "
           "waited in (all_reduce #20, stall; then all_reduce #21, stall)")
    assert [(r.leaving, r.code) if isinstance(r, Refused) else r for r in (got[0], got[1])] == [
        (None, exits.FAILED), (why, exits.FAILED)]
    assert got[0].line.startswith(f"error: hang: {why}; hint: look at that host before it rejoins")
