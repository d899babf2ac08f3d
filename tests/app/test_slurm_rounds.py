"""runner.app.slurm_rounds: the `run` that holds a Slurm job's rounds refuses to run outside an allocation, and starts
at the attempt after the rounds the run folder already has (a requeued job). Its rounds on a real cluster:
tests/e2e/test_lost_nodes_slurm.py."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_spec
from runner.app.slurm_rounds import hold
from runner.environments.process import ProcessEnvironment
from runner.spec.document import spec_yaml
from runner.spec.schema import TopologyConfig

pytestmark = pytest.mark.unit


def spec_file(tmp_path):
    spec = make_spec(devices=[1, 1, 1], launcher="slurm", global_batch_size=12)
    spec = dataclasses.replace(spec, run_id="r1", topology=TopologyConfig(nodes=3, devices_per_node=1, min_nodes=2),
                               launcher=dataclasses.replace(spec.launcher, max_restarts=2))
    path = tmp_path / "spec.yaml"
    path.write_text(spec_yaml(spec))
    return path


def test_outside_an_allocation_nothing_starts(tmp_path, capsys) -> None:
    assert hold(spec_file(tmp_path), ProcessEnvironment.read({})) == 2
    assert "not in a Slurm allocation (no SLURM_JOB_ID, SLURM_JOB_NODELIST)" in capsys.readouterr().err
    assert not list(tmp_path.glob("spec.round*.yaml"))


def test_an_allocation_with_fewer_nodes_than_hosts_is_refused(tmp_path, capsys) -> None:
    env = ProcessEnvironment.read({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert hold(spec_file(tmp_path), env) == 2
    assert "the allocation's nodes (n[1-2]) do not fit the spec's hosts: 3 host(s) in the spec, 2 node(s) in the allocation" in capsys.readouterr().err
