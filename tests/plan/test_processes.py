"""Properties of the rank plan over random topologies (hypothesis).

The specs are built from the dataclasses of runner/spec.py (no Hydra, for speed), validated against
a FixedProbe with plenty of GPUs, and planned with make_plan. The properties are the rank algorithm
of runner/plan.py's docstring: contiguous unique global ranks, local ranks 0..n-1 per host, global
rank = prefix sum of the hosts before + local rank, host blocks, and each process's environment.
"""

from __future__ import annotations

import pytest

from itertools import accumulate
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import environment, make_spec, validate
from runner.launchers import LAUNCHERS, Invocation
from runner.launchers import plan_for
from runner.plan.processes import PORT_BAND, Deferred, RunPort, port_for
from runner.records.paths import RunPaths
from runner.spec.pins import pinned
from runner.spec.probe import FixedProbe
from runner.spec.schema import DeviceKind, ParallelMode, TaskMode

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")
INVOCATION = Invocation(python="/venv/bin/python", cwd="/work/proj", overrides=(), config_dir=None)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def jobs(draw):
    """A valid spec: 1..50 hosts with 1..8 devices, named hosts, ddp (or dp on one host), cpu or cuda."""
    launcher = draw(st.sampled_from(["slurm", "manual", "mpi", "local"]))
    n_hosts = 1 if launcher == "local" else draw(st.integers(1, 50))
    devices = draw(st.lists(st.integers(1, 8), min_size=n_hosts, max_size=n_hosts))
    device = draw(st.sampled_from([DeviceKind.cpu, DeviceKind.cuda]))
    parallel = ParallelMode.dp if n_hosts == 1 and draw(st.booleans()) else ParallelMode.ddp
    uniform = len(set(devices)) == 1
    if launcher == "slurm" and not uniform:
        tasks = TaskMode.per_device  # per_host under slurm needs the same count on every node
    elif launcher == "mpi":
        tasks = draw(st.sampled_from([TaskMode.per_device, TaskMode.per_host]))
    elif launcher == "slurm":
        tasks = draw(st.sampled_from([TaskMode.per_device, TaskMode.per_host]))
    else:
        tasks = TaskMode.per_host
    if launcher == "local":
        names = ["thishost"]
    else:
        names = [f"node{i:03d}" for i in range(n_hosts)]
    use_addrs = launcher != "local" and draw(st.booleans())
    addrs = [f"10.0.{i // 256}.{i % 256}" for i in range(n_hosts)] if use_addrs else None
    gpus = None
    if device is DeviceKind.cuda and draw(st.booleans()):
        # explicit, distinct GPU indices per host, in any order
        gpus = [draw(st.permutations(range(16)))[:d] for d in devices]
    grid = launcher == "slurm" and uniform and not use_addrs and gpus is None and draw(st.booleans())
    if grid:
        spec = make_spec(nodes=n_hosts, devices_per_node=devices[0], launcher=launcher, tasks=tasks, device=device,
                         parallel=parallel)
    else:
        spec = make_spec(devices=devices, names=names, addrs=addrs, gpus=gpus, launcher=launcher, tasks=tasks,
                         device=device, parallel=parallel)
    return spec


def _plan(spec):
    got = validate(spec, FixedProbe(cuda_devices=64))
    assert got.valid, got.rendered()
    return got.job, plan_for(got.job, PATHS)


@SETTINGS
@given(jobs())
def test_ranks_are_contiguous_prefix_sums(spec) -> None:
    job, plan = _plan(spec)
    hosts = job.hosts
    dp = spec.parallel.mode is ParallelMode.dp
    per_host = [1 if dp else h.devices for h in hosts]
    world = sum(per_host)

    assert plan.world_size == world == job.world_size
    if not dp:
        assert world == sum(h.devices for h in hosts)
    assert [r.global_rank for r in plan.records] == list(range(world))

    starts = [0, *accumulate(per_host)]
    blocks = []
    for h in hosts:
        block = plan.host_records(h.index)
        blocks.extend(block)
        n = per_host[h.index]
        assert [r.local_rank for r in block] == list(range(n))
        for r in block:
            assert r.node_rank == h.index
            assert r.host == h.label
            assert r.local_world_size == n
            assert r.world_size == world
            assert r.global_rank == starts[h.index] + r.local_rank
    assert tuple(blocks) == plan.records


@SETTINGS
@given(jobs())
def test_env_matches_records(spec) -> None:
    job, plan = _plan(spec)
    cuda = job.device is DeviceKind.cuda
    slurm = spec.launcher.kind == "slurm"
    dp = spec.parallel.mode is ParallelMode.dp
    for r in plan.records:
        env = plan.env(r)
        host = job.hosts[r.node_rank]
        assert env["RANK"] == str(r.global_rank) == env["ROLE_RANK"]
        assert env["LOCAL_RANK"] == str(r.local_rank)
        assert env["WORLD_SIZE"] == str(plan.world_size) == env["ROLE_WORLD_SIZE"]
        assert env["LOCAL_WORLD_SIZE"] == str(r.local_world_size)
        assert env["GROUP_RANK"] == env["NODE_RANK"] == str(r.node_rank)
        assert env["MASTER_ADDR"] == plan.master_addr and env["MASTER_PORT"] == plan.master_port
        assert all(isinstance(v, str) for v in env.values())
        if cuda and not slurm:
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, host.gpus))
            if spec.topology.hosts and spec.topology.hosts[r.node_rank].gpus is not None:
                assert list(host.gpus) == spec.topology.hosts[r.node_rank].gpus
        else:
            assert "CUDA_VISIBLE_DEVICES" not in env
        if not cuda:
            assert (r.device, r.device_ids) == ("cpu", ())
        elif dp:
            assert (r.device, r.device_ids) == ("cuda:0", tuple(range(host.devices)))
        else:
            assert (r.device, r.device_ids) == (f"cuda:{r.local_rank}", (r.local_rank,))


@SETTINGS
@given(jobs())
def test_master_and_launch_requests_agree_with_plan(spec) -> None:
    job, _ = _plan(spec)
    kind = spec.launcher.kind
    job = pinned(job, LAUNCHERS[kind].pins(job, PATHS))  # as the launch pins it, before the plan
    plan = plan_for(job, PATHS)
    if len(job.hosts) == 1:
        assert plan.master_addr == "127.0.0.1"
    elif kind in ("manual", "mpi"):
        assert plan.master_addr == job.hosts[0].reach
    else:  # slurm: the first node of the allocation, known at launch
        assert plan.master_addr.startswith("<")
    launcher = LAUNCHERS[kind](plan=plan, paths=PATHS, invocation=INVOCATION, environment=environment())
    request = launcher.request()
    text = request.materialize()
    assert job.spec.run_id == "R1"
    per_host = spec.launcher.tasks is TaskMode.per_host
    if kind == "mpi":
        argv = request.commands[0].argv
        hosts = argv[argv.index("-H") + 1].split(",")
        slots = [int(h.rsplit(":", 1)[1]) for h in hosts]
        expected = [1] * len(job.hosts) if per_host else [len(plan.host_records(h.index)) for h in job.hosts]
        assert slots == expected
        assert argv[argv.index("-np") + 1] == str(sum(expected))
    elif kind == "slurm":
        ntasks = len(job.hosts) if per_host else plan.world_size
        assert f"--ntasks={ntasks}" in text and f"#SBATCH --nodes={len(job.hosts)}" in text
        if not per_host and not job.uniform:
            assert "--distribution=arbitrary" in text and "SLURM_HOSTFILE" in text
            if all(h.name for h in job.hosts):  # the hostfile names the hosts, in rank order
                names = [h.name for h in job.hosts for _ in plan.host_records(h.index)]
                assert f'printf "%s\\n" {" ".join(names)} >' in text
            else:
                counts = " ".join(str(len(plan.host_records(h.index))) for h in job.hosts)
                assert f"counts=({counts})" in text
    elif kind == "manual":
        assert len(request.commands) == len(job.hosts)
        port = [] if isinstance(plan.master_port, Deferred) else [f"init.master_port={plan.master_port}"]
        for h, c in zip(job.hosts, request.commands):
            assert c.argv[-1] == f"launcher.manual.host={h.index}"
            assert [a for a in c.argv if a.startswith(("run_id=", "init.master_port="))] == ["run_id=R1", *port]
            assert f"starts {len(plan.host_records(h.index))} process(es)" in c.note


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=2, max_size=20), st.integers(1, 1000))
def test_batch_rule_is_a_sample_for_every_process(devices, batch) -> None:
    """Any global batch runs, split exactly (runner.spec.batch), as long as every process takes a sample."""
    spec = make_spec(devices=devices, names=[f"h{i}" for i in range(len(devices))], launcher="mpi",
                     tasks=TaskMode.per_device, global_batch_size=batch)
    got = validate(spec)
    world = sum(devices)
    batch_errors = [p for p in got.errors if p.key == "recipe.global_batch_size"]
    assert bool(batch_errors) == (batch < world)
    if batch_errors:
        assert f"({batch} < {world}: " in batch_errors[0].message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=2, max_size=12))
def test_slurm_per_host_needs_uniform_hosts(devices) -> None:
    spec = make_spec(devices=devices, launcher="slurm", tasks=TaskMode.per_host,
                     global_batch_size=sum(devices) * 2)
    got = validate(spec)
    uniform = len(set(devices)) == 1
    assert got.valid is uniform, got.rendered()
    if not uniform:
        assert got.find("launcher.tasks", "+".join(map(str, devices)))


@given(run_id=st.text(min_size=1, max_size=12), attempts=st.integers(1, 50))
@SETTINGS
def test_a_runs_derived_ports_never_coincide(run_id, attempts) -> None:
    """Every use of a run's derived ports (the rendezvous of each attempt, etcd's clients and peers) gets a port of its
    own in the band, also where the run id's hash sits at the band's end."""
    uses = [RunPort.MASTER, RunPort.ETCD_CLIENTS, RunPort.ETCD_PEERS,
            *(RunPort.ATTEMPTS + n for n in range(1, attempts))]
    ports = [port_for(run_id, use) for use in uses]
    start, size = PORT_BAND
    assert len(set(ports)) == len(ports) and all(start <= p < start + size for p in ports)


def test_the_run_whose_etcd_ports_once_coincided_gets_two() -> None:
    """Run l32225b2c hashed its etcd's two ports to 24024 when each was a hash of its own (its members exited 1)."""
    assert port_for("l32225b2c", RunPort.ETCD_CLIENTS) != port_for("l32225b2c", RunPort.ETCD_PEERS)
