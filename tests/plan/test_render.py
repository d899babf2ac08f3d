"""runner.plan.render: the dry run's verdict line and plan table, and plan.json."""

from __future__ import annotations

import json

import pytest

from conftest import validate
from runner.launchers import plan_for
from runner.plan.render import TABLE_HEAD, batch_line, plan_document, plan_table, verdict, write_plan

pytestmark = pytest.mark.unit


def planned(*overrides: str):
    got = validate(("device=cpu", *overrides))
    assert got.valid, got.rendered()
    return plan_for(got.job)


def test_the_verdict_says_the_job_in_one_line() -> None:
    plan = planned("topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device", "init=env",
                   "recipe.global_batch_size=60", "preflight=true")
    assert verdict(plan) == (
        "valid: 3 process(es) on 2 host(s) (2+1); device cpu, backend gloo, init env (env://), ddp, sharding none, "
        "launcher slurm (per_device); preflight: each host's checks and one all-reduce, no recipe")


def test_the_batch_line_says_the_split_and_for_a_job_that_outlives_hosts_the_split_at_its_fewest() -> None:
    assert batch_line(planned("topology=1x3")) == "batch: 64 over 3 processes: 22, 21, 21"
    assert batch_line(planned("topology=1x3", "recipe.micro_batch_size=8")) == (
        "batch: 64 over 3 processes: 22, 21, 21; at most 8 through the model at once: 3 micro-batches a step")
    hosts = "topology.hosts=[{name: a, devices: 2}, {name: b, devices: 2}, {name: c, devices: 1}]"
    assert batch_line(planned("topology=custom", hosts, "launcher=ssh", "init=tcp", "topology.min_nodes=2",
                              "launcher.max_restarts=3")) == (
        "batch: 64 over 5 processes: 13, 13, 13, 13, 12\n"
        "       with hosts lost, down to topology.min_nodes=2: 64 over 3 processes: 22, 21, 21")
    script = validate(("device=cpu", "recipe=script", "recipe.path=train.py"), paths=frozenset({"train.py"}))
    assert batch_line(plan_for(script.job)) is None  # a script batches its own data


def test_the_table_has_a_row_per_process_with_its_variables() -> None:
    lines = plan_table(planned("topology=1x2")).splitlines()
    assert lines[0].split() == ["rank", "node", "local", "host", "device", "environment"]
    assert [line.split()[:5] for line in lines[1:]] == [["0", "0", "0", "node0", "cpu"], ["1", "0", "1", "node0", "cpu"]]
    assert lines[2].split()[5:9] == ["RANK=1", "LOCAL_RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2"]


def test_a_long_table_shows_both_ends_and_says_how_many_are_left_out() -> None:
    lines = plan_table(planned("topology=5x8", "launcher=slurm", "recipe.global_batch_size=40")).splitlines()
    assert len(lines) == 1 + 2 * TABLE_HEAD + 1
    assert lines[TABLE_HEAD + 1] == "  ... 8 more processes (every one is in plan.json) ..."
    assert (lines[TABLE_HEAD].split()[0], lines[TABLE_HEAD + 2].split()[0], lines[-1].split()[0]) == ("15", "24", "39")


def test_plan_json_has_every_process_with_its_environment(tmp_path) -> None:
    plan = planned("topology=custom", "topology.hosts=[{name: a, addr: 10.0.0.1, devices: 2, gpus: [2, 3]}]",
                   "recipe.global_batch_size=2")
    write_plan(plan, tmp_path / "plan.json")
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc == json.loads(json.dumps(plan_document(plan)))
    assert (doc["world_size"], doc["device"], doc["backend"]) == (2, "cpu", "gloo")
    assert doc["hosts"] == [{"node_rank": 0, "host": "a", "addr": "10.0.0.1", "devices": 2, "gpus": [2, 3]}]
    assert [p["env"]["RANK"] for p in doc["processes"]] == ["0", "1"]
    assert [p["global_rank"] for p in doc["processes"]] == [0, 1]
    assert set(doc["processes"][0]) == {"global_rank", "local_rank", "node_rank", "local_world_size", "host", "device",
                                        "device_ids", "env"}  # the world size once, at the top
