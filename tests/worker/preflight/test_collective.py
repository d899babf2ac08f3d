"""runner.worker.preflight.collective: a process's all-reduce (a real gloo group of one process, in this one) and the
line it prints or raises, each failure in words (a timeout, a connection, anything else). How a host's preflight
ended: test_outcome.py. Every process of a job together: tests/worker/test_preflight.py."""

from __future__ import annotations

import dataclasses
import re

import pytest

from conftest import environment, make_spec, validate
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.spec.schema import ScriptRecipeConfig
from runner.worker.preparation import rank_setups
from runner.worker.preflight.checks import Check, HostChecks, PreflightFailed
from runner.worker.preflight.collective import _explain, collective
from runner.worker.rendezvous import Rendezvous
from runner.worker.setup import RankSetup

HOST_LINE = HostChecks("preflight node0 (tb1)", (Check("2 CPU process(es) as the spec says"),))


def setups_of(paths: RunPaths, processes: int, init_method: str, report: HostChecks | None = HOST_LINE,
              env: dict[str, str] | None = None) -> list[RankSetup]:
    """The setups of a host's ``processes`` as its agent makes them, its local rank 0 the one that prints the host's
    line (``report``)."""
    spec = make_spec(nodes=1, devices_per_node=processes)
    got = validate(dataclasses.replace(spec, recipe=ScriptRecipeConfig(path="train.py")), paths=frozenset({"train.py"}))
    assert got.valid, got.rendered()
    setups = rank_setups(plan_for(got.job, paths), 0, Rendezvous(init_method, "29500", False), paths, environment(),
                         report)
    return [dataclasses.replace(s, env={**s.env, **(env or {})}) for s in setups]


def raised(setup: RankSetup, line: str, at: float) -> None:
    """The error record a preflight process writes when its check fails (runner.worker.rank), at time ``at``."""
    record = setup.error_record(PreflightFailed(line))
    setup.outcome.record_error(dataclasses.replace(record, timestamp=at))


# -------------------------------------------------------------------------- one process's all-reduce (torch: not unit)


def test_the_reporting_process_ends_its_hosts_line_with_the_sum_and_the_others_print_nothing(paths, capsys) -> None:
    import torch

    (reporting,) = setups_of(paths, 1, f"file://{paths.root}/init-a")
    collective(reporting, torch.device("cpu"))
    out = capsys.readouterr().out
    assert re.fullmatch(r"preflight node0 \(tb1\): 2 CPU process\(es\) as the spec says · gloo all-reduce over 1 "
                        r"process\(es\) ok \(sum 1, \d+\.\d\d s\)\n", out), out
    (silent,) = setups_of(paths, 1, f"file://{paths.root}/init-b", report=None)
    collective(silent, torch.device("cpu"))
    assert capsys.readouterr().out == ""


def test_a_group_that_cannot_form_raises_the_line_with_the_backend_the_world_and_the_error(paths) -> None:
    import torch

    (setup,) = setups_of(paths, 1, "nowhere://", report=None)
    with pytest.raises(PreflightFailed) as failed:
        collective(setup, torch.device("cpu"))
    cause = failed.value.__cause__  # torch's own error, in torch's words
    assert isinstance(cause, RuntimeError)
    assert str(failed.value) == (f"preflight node0 rank 0: FAILED: gloo all-reduce over 1 process(es): RuntimeError: "
                                 f"{cause} — hint: the traceback is in {paths.logs}/rank00000.log")


# -------------------------------------------------------------------------- a failure, in words


@pytest.mark.unit
@pytest.mark.parametrize("init_method, shared", [
    ("file:///shared/r1.rdzv/attempt0", "; init=file: is init.dir shared by every host?"),
    ("env://", ""),
])
def test_a_timeout_says_the_processes_did_not_all_meet_and_asks_about_the_other_hosts(paths, init_method,
                                                                                      shared) -> None:
    (setup,) = setups_of(paths, 1, init_method)
    assert _explain(RuntimeError("Wait timeout"), setup, 30.0) == Check.failed(
        "the processes did not all meet within 30 s (RuntimeError: Wait timeout)",
        f"is every host started (each prints its own preflight line)? a firewall between the hosts?{shared}")


@pytest.mark.unit
@pytest.mark.parametrize("env, on", [
    ({"GLOO_SOCKET_IFNAME": "lan0", "NCCL_SOCKET_IFNAME": "ib0"}, " (this host's processes use lan0)"),
    ({"NCCL_SOCKET_IFNAME": "ib0"}, " (this host's processes use ib0)"),
    ({}, ""),
])
def test_a_connection_failure_names_the_interface_and_points_to_the_firewall(paths, env, on) -> None:
    (setup,) = setups_of(paths, 1, "env://", env=env)
    assert _explain(RuntimeError("Connection reset by peer\n(at pair.cc:598)"), setup, 30.0) == Check.failed(
        f"the processes could not connect to each other{on}: RuntimeError: Connection reset by peer",
        "firewall or interface: gloo/NCCL connect the processes directly, on ports besides init.master_port: open "
        "them between the hosts; check the interface on every host (backend.socket_ifname)")


@pytest.mark.unit
def test_any_other_error_is_its_first_line_cut_at_300_characters_and_points_to_the_log(paths) -> None:
    (setup,) = setups_of(paths, 1, "env://")
    check = _explain(ValueError("x" * 400 + "\nsecond line"), setup, 30.0)
    assert check == Check.failed("ValueError: " + "x" * 288, f"the traceback is in {paths.logs}/rank00000.log")


@pytest.mark.unit
def test_an_error_without_a_message_is_its_name_alone(paths) -> None:
    (setup,) = setups_of(paths, 1, "env://")
    assert _explain(RuntimeError(), setup, 30.0) == Check.failed("RuntimeError",
                                                                 f"the traceback is in {paths.logs}/rank00000.log")
