"""runner.worker.host_agent, the parts that need no process: how a host's ranks ended (HostEnding), what each rank's
setup gets (what the terminal shows of it, its environment, its notes), the master checked from another host, which
agent serves the store, and what a signal to the agent sends its ranks (ranks that record what they are sent). Whole
runs: tests/launchers/test_local_launcher.py, tests/e2e."""

from __future__ import annotations

import dataclasses
import functools
import signal
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from clocks import Clock
from conftest import make_spec, validate
from runner.common.polling import retry
from runner.environments.process import ProcessEnvironment
from runner.environments.slurm import SlurmEnvironment
from runner.launchers import plan_for
from runner.plan.processes import Plan
from runner.records.outcomes import ErrorRecord
from runner.records.paths import RunPaths
from runner.spec.probe import FixedProbe
from runner.spec.schema import BackendConfig, InitConfig, InitMethod, JobConfig, LogConfig, ScriptRecipeConfig
from runner.worker.host_agent import HostAgent, _master_unreachable, rank_setups
from runner.worker.host_ending import HostEnding
from runner.worker.network import NetworkError
from runner.worker.preflight import checks
from runner.worker.preflight.checks import Check, HostChecks
from runner.worker.rank_process import STACK_SIGNAL
from runner.worker.relay import Echo
from runner.worker.rendezvous import Rendezvous
from runner.worker.setup import RankSetup
from runner.worker.share import HostShare

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


def agent_of(plan: Plan, node_rank: int, paths: RunPaths, *, only: int | None = None) -> HostAgent:
    """The agent of host ``node_rank``'s share of ``plan`` (or of its one rank ``only``), not run."""
    return HostAgent(HostShare(plan=plan, node_rank=node_rank, paths=paths, environment=EIGHT_CPUS), only=only)


def setups_of(spec: JobConfig, paths: RunPaths, node_rank: int = 1, **kwargs: object) -> list[RankSetup]:
    return rank_setups(plan_of(spec, paths), node_rank, RDZV, paths, EIGHT_CPUS, **kwargs)


@dataclass
class Rank:
    """A rank's process as the agent sees it (runner.worker.rank_process.RankProcess), without one: what it was sent
    while it ran."""

    index: int
    code: int | None = None  # its exit status, once it has exited
    signalled: list[int] = field(default_factory=list)

    def send(self, signum: int, group: bool = False) -> None:
        if self.code is None:  # as RankProcess: an exited rank is sent nothing
            self.signalled.append(signum)


# -------------------------------------------------------------------------- how a host's ranks ended


def test_a_host_failed_when_any_rank_ended_badly_and_by_itself_only_when_the_agent_had_not_stopped_it() -> None:
    assert not HostEnding(codes={0: 0, 1: 0}, order=[0, 1]).failed
    stopped = HostEnding(codes={0: 0, 1: -signal.SIGTERM}, order=[0, 1], stopped={1})
    assert stopped.failed and not stopped.failed_by_itself() and stopped.first_failure() is None
    raised = HostEnding(codes={0: 1, 1: -signal.SIGTERM}, order=[0, 1], stopped={1})
    assert raised.failed and raised.failed_by_itself()


def test_the_first_failure_is_the_first_rank_to_exit_badly_by_itself_not_the_lowest_index() -> None:
    ending = HostEnding(codes={0: 1, 1: -signal.SIGTERM, 2: -signal.SIGKILL, 3: 0}, order=[3, 1, 2, 0], stopped={1})
    assert ending.first_failure() == 2


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
    return _master_unreachable(plan, node_rank, rdzv, rank_setups(plan, node_rank, rdzv, paths, EIGHT_CPUS))


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


# -------------------------------------------------------------------------- the agent


def test_an_agent_is_made_from_its_hosts_share_whole(paths) -> None:
    share = HostShare(plan=plan_of(two_hosts(), paths), node_rank=1, paths=paths, environment=EIGHT_CPUS, restarts=3)
    agent = HostAgent(share, announce=True)
    assert (agent.plan, agent.node_rank, agent.paths, agent.environment, agent.restarts, agent.announce) == \
        (share.plan, 1, paths, EIGHT_CPUS, 3, True)


@pytest.mark.parametrize("node_rank, only, serves", [(0, None, True), (0, 0, True), (0, 1, False), (1, None, False),
                                                     (1, 2, False)])
def test_the_agent_of_host_0_serves_the_store_or_with_a_task_per_process_global_rank_0s(paths, node_rank, only,
                                                                                         serves) -> None:
    agent = agent_of(plan_of(two_hosts(), paths), node_rank, paths, only=only)
    assert agent.serves is serves


# -------------------------------------------------------------------------- a collective that timed out


def failed(setup: RankSetup, timeout: bool) -> None:
    place = setup.place
    setup.outcome.record_error(ErrorRecord(rank=place.global_rank, local_rank=place.local_rank, host=place.host,
                                           machine="machine1", pid=4000, timestamp=100.0,
                                           exception="RuntimeError: Wait timeout" if timeout else "RuntimeError: boom",
                                           timeout=timeout))


def test_a_collective_timeout_asks_the_ranks_still_running_for_their_stacks(paths) -> None:
    plan = plan_of(make_spec(nodes=1, devices_per_node=3), paths)
    setups = rank_setups(plan, 0, RDZV, paths, EIGHT_CPUS)
    failed(setups[0], timeout=True)
    setups[2].outcome.mark_done(False)  # returned, not exited yet
    ranks = [Rank(0), Rank(1), Rank(2)]
    assert agent_of(plan, 0, paths)._ask_for_stacks_after_a_timeout(ranks, setups)
    assert [r.signalled for r in ranks] == [[], [STACK_SIGNAL], []]


def test_a_failure_that_is_no_timeout_asks_for_no_stacks(paths) -> None:
    plan = plan_of(two_hosts(), paths)
    setups = rank_setups(plan, 1, RDZV, paths, EIGHT_CPUS)
    failed(setups[0], timeout=False)
    ranks = [Rank(0), Rank(1)]
    assert not agent_of(plan, 1, paths)._ask_for_stacks_after_a_timeout(ranks, setups)
    assert [r.signalled for r in ranks] == [[], []]
