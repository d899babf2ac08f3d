"""Every rule of runner/topology.py and runner/validation.py, as a table of specs and verdicts.

Each row is a spec (Hydra overrides, composed exactly as `run` composes them, optionally edited
afterwards for values the override grammar cannot express), a machine (FixedProbe keyword
arguments) and what `check` must say: valid or not, and which problems (severity, exact key, a
fragment of the message or hint) it must report. For invalid rows the set of error keys must be
exactly the expected one, so a rule that fires where it should not fails the row too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pytest

from conftest import TARGET, compose, hosts_override, validate
from runner.common import extras
from runner.spec.problems import Severity
from runner.spec.schema import JobConfig

pytestmark = pytest.mark.unit

E, W, N = Severity.error, Severity.warning, Severity.notice
BASE = (f"recipe.target={TARGET}",)


@dataclass
class Row:
    id: str
    overrides: tuple[str, ...]
    valid: bool
    expect: list[tuple[Severity, str, str]] = field(default_factory=list)  # (severity, key, fragment)
    probe: dict = field(default_factory=dict)
    edit: Callable[[JobConfig], None] | None = None


def row(id: str, *overrides: str, valid: bool, expect=(), probe=None, edit=None) -> Row:
    flat: list[str] = []
    for o in overrides:
        flat.extend(o if isinstance(o, tuple) else (o,))
    return Row(id, tuple(flat), valid, list(expect), probe or {}, edit)


H = hosts_override
AB = H({"name": "a", "devices": 2}, {"name": "b", "devices": 2})
AB_HETERO = H({"name": "a", "devices": 2}, {"name": "b", "devices": 1})

ROWS = [
    # ------------------------------------------------------------ shipped topologies, valid
    row("topo-1x1-local", "topology=1x1", "device=cpu", valid=True),
    row("topo-1x2-local", "topology=1x2", valid=True),
    row("topo-1x4-local-cuda", "topology=1x4", "device=cuda", valid=True, probe={"cuda_devices": 4}),
    row("topo-1x8-local-auto-cuda", "topology=1x8", valid=True, probe={"cuda_devices": 8},
        expect=[(N, "device", "this machine has 8 CUDA GPU(s)")]),
    row("topo-1x8-mpi-single-unnamed-host", "topology=1x8", "launcher=mpi", "device=cpu", valid=True),
    row("topo-2x2-slurm-per-host", "topology=2x2", "launcher=slurm", valid=True,
        expect=[(N, "device", "asks Slurm for CPU processes")]),
    row("topo-2x2-slurm-per-device", "topology=2x2", "launcher=slurm", "launcher.tasks=per_device", "device=cpu",
        valid=True),
    row("topo-2x8-slurm-cuda", "topology=2x8", "launcher=slurm", "device=cuda", valid=True),
    row("topo-hetero_2_1-slurm-per-device", "topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device",
        "device=cpu", "recipe.global_batch_size=60", valid=True),
    row("topo-hetero-mpi-named", AB_HETERO, "launcher=mpi", "device=cpu", "recipe.global_batch_size=60", valid=True),
    row("topo-hetero-manual-named", AB_HETERO, "launcher=manual", "device=cpu", "recipe.global_batch_size=60",
        valid=True),
    row("topo-custom-host-list", "topology=custom", "topology.hosts=[{name: a, devices: 2}, {name: b, devices: 2}]",
        "launcher=mpi", "device=cpu", valid=True),
    row("topo-any-shape-3x4-slurm", "topology=3x4", "launcher=slurm", "device=cuda", "recipe.global_batch_size=96",
        valid=True),
    row("devices-from-devices_per_node", "topology.nodes=null", "topology.devices_per_node=2",
        "topology.hosts=[{name: a}, {name: b}]", "launcher=mpi", "device=cpu", valid=True),

    # ------------------------------------------------------------ uniform vs heterogeneous under slurm
    row("slurm-hetero-per-host", "topology=hetero_2_1", "launcher=slurm", "device=cpu",
        "recipe.global_batch_size=60", valid=False,
        expect=[(E, "launcher.tasks", "the hosts have 2+1 devices"), (E, "launcher.tasks", "launcher.tasks=per_device")]),

    # ------------------------------------------------------------ master address
    row("loopback-master-with-remote-host",
        H({"name": "localhost", "devices": 2}, {"name": "b", "devices": 2}), "launcher=manual", "device=cpu",
        valid=False, expect=[(E, "topology.hosts[0]", "'localhost' is loopback"),
                             (E, "topology.hosts[0]", "'b' is another machine")]),
    row("loopback-master-addr-explicit", "topology=2x2", "launcher=slurm", "device=cpu", "init.master_addr=127.0.0.1",
        valid=False, expect=[(E, "init.master_addr", "'127.0.0.1' is loopback")]),
    row("loopback-name-and-addr-manual-ok",
        H({"name": "localhost", "devices": 1}, {"name": "127.0.0.2", "devices": 1}), "launcher=manual",
        "device=cpu", valid=True),
    row("loopback-all-hosts-manual-ok",
        H({"name": "localhost", "devices": 2}, {"addr": "127.0.0.1", "devices": 2}), "launcher=manual",
        "device=cpu", valid=True),
    row("hosts-named-as-this-machine-manual-ok",
        H({"name": "thishost", "devices": 1}, {"name": "localhost", "devices": 1}), "launcher=manual",
        "device=cpu", valid=True),
    row("manual-unnamed-hosts", "topology=2x2", "launcher=manual", "device=cpu", valid=False,
        expect=[(E, "topology.hosts", "must know every host"),
                (E, "init.master_addr", "needs to know host 0's address")]),
    row("mpi-unnamed-hosts", "topology=2x2", "launcher=mpi", "device=cpu", valid=False,
        expect=[(E, "topology.hosts", "launcher=mpi must know every host")]),
    row("mpi-export-not-a-name", AB_HETERO, "launcher=mpi", "device=cpu", "recipe.global_batch_size=60",
        "launcher.mpi.export=['A;B']", valid=False,
        expect=[(E, "launcher.mpi.export[0]", "'A;B' is not a variable name")]),
    # ------------------------------------------------------------ launcher=ssh: its options reach a command line
    row("ssh-hetero-named", AB_HETERO, "launcher=ssh", "device=cpu", "recipe.global_batch_size=60", "init=tcp",
        "launcher.ssh.options=['ProxyJump=bastion']", "launcher.ssh.export=[HF_HOME]", "launcher.max_restarts=1",
        valid=True),
    row("ssh-unnamed-hosts", "topology=2x2", "launcher=ssh", "device=cpu", valid=False,
        expect=[(E, "topology.hosts", "launcher=ssh must know every host"),
                (E, "init.master_addr", "ssh launch on several hosts needs to know host 0's address")]),
    row("ssh-host-with-shell-characters", H({"name": "a;reboot", "devices": 1}, {"name": "b", "devices": 1}),
        "launcher=ssh", "device=cpu", "recipe.global_batch_size=2", valid=False,
        expect=[(E, "topology.hosts[0].name", "'a;reboot'")]),
    row("ssh-one-unnamed-host", "topology=1x2", "launcher=ssh", "device=cpu", valid=False,
        expect=[(E, "topology.hosts", "logs in to every host by its name")]),
    row("ssh-export-not-a-name", AB, "launcher=ssh", "device=cpu", "launcher.ssh.export=['A B']", valid=False,
        expect=[(E, "launcher.ssh.export[0]", "'A B' is not a variable name")]),
    row("ssh-option-not-key-value", AB, "launcher=ssh", "device=cpu", "launcher.ssh.options=[-v]", valid=False,
        expect=[(E, "launcher.ssh.options[0]", "'-v' is not an ssh option as KEY=VALUE")]),
    row("ssh-user-port-timeouts", AB, "launcher=ssh", "device=cpu", "launcher.ssh.user='root;id'",
        "launcher.ssh.port=70000", "launcher.ssh.connect_timeout_s=0", "launcher.ssh.keepalive_s=-1", valid=False,
        expect=[(E, "launcher.ssh.user", "'root;id' is not a user name"), (E, "launcher.ssh.port", "got 70000"),
                (E, "launcher.ssh.connect_timeout_s", "must be positive"),
                (E, "launcher.ssh.keepalive_s", "must be 0 or more")]),
    row("ssh-command-not-a-command", AB, "launcher=ssh", "device=cpu", "launcher.ssh.run=-c", valid=False,
        expect=[(E, "launcher.ssh.run", "'-c' is not a command")]),
    row("ssh-snapshot-refused", AB, "launcher=ssh", "device=cpu", "launcher.snapshot_code=true", valid=False,
        expect=[(E, "launcher.snapshot_code", "the other hosts do not see")]),
    row("ssh-restarts-need-a-store", AB, "launcher=ssh", "device=cpu", "init=file", "init.dir=/shared",
        "launcher.max_restarts=1", valid=False, expect=[(E, "launcher.max_restarts", "init=file has none")]),
    row("ssh-file-init-needs-a-shared-dir", AB, "launcher=ssh", "device=cpu", "init=file", valid=False,
        expect=[(E, "init.dir", "launcher=ssh on several hosts")]),
    row("bad-master-addr", "init.master_addr='a b'", valid=False,
        expect=[(E, "init.master_addr", "'a b' is not a host name")]),

    # ------------------------------------------------------------ file init
    row("file-init-dir-missing", "init=file", "init.dir=/nope/rdzv", valid=False,
        expect=[(E, "init.dir", "'/nope/rdzv' does not exist"), (E, "init.dir", "mkdir -p /nope/rdzv")]),
    row("file-init-dir-relative", "init=file", "init.dir=rdzv", valid=False,
        expect=[(E, "init.dir", "'rdzv' is relative")]),
    row("file-init-dir-is-a-file", "init=file", "init.dir=/shared/afile", valid=False,
        probe={"paths": frozenset({"/shared/afile"})}, expect=[(E, "init.dir", "'/shared/afile' is a file")]),
    row("file-init-dir-shared-ok", "init=file", "init.dir=/shared", "topology=2x2", "launcher=slurm", valid=True),
    row("file-init-no-dir-multi-host-notice", "init=file", "topology=2x2", "launcher=slurm", "device=cpu", valid=True,
        expect=[(N, "init.dir", "every host must see at the same path")]),
    row("file-init-manual-multi-host-no-dir", AB, "init=file", "launcher=manual", "device=cpu", valid=False,
        expect=[(E, "init.dir", "launcher=manual on several hosts"), (E, "init.dir", "init.dir=/shared/path")]),
    row("file-init-manual-multi-host-with-dir", AB, "init=file", "init.dir=/shared", "launcher=manual", "device=cpu",
        valid=True),
    row("init-dir-without-file-init", "init.dir=/shared", valid=True,
        expect=[(W, "init.dir", "only used with init=file (init=env)")]),
    row("file-init-with-master-addr", "init=file", "init.master_addr=10.0.0.1", valid=True,
        expect=[(W, "init.master_addr", "not used with init=file")]),

    # ------------------------------------------------------------ backends
    row("nccl-on-cpu", "backend=nccl", "device=cpu", valid=False,
        expect=[(E, "backend.name", "nccl needs CUDA GPUs, but device=cpu")]),
    row("nccl-auto-chose-cpu", "backend=nccl", valid=False,
        expect=[(E, "backend.name", "device=auto chose cpu")]),
    row("nccl-on-cuda-ok", "backend=nccl", "device=cuda", valid=True, probe={"cuda_devices": 2}),
    row("mpi-backend-without-mpi", "backend=mpi", "launcher=mpi", "device=cpu", valid=False,
        expect=[(E, "backend.name", "not built with MPI")]),
    row("mpi-backend-with-mpi-ok", "backend=mpi", "launcher=mpi", "device=cpu", valid=True,
        probe={"mpi_backend": True}),
    row("mpi-backend-non-mpi-launcher", "backend=mpi", "launcher=local", "device=cpu", valid=False,
        probe={"mpi_backend": True}, expect=[(E, "backend.name", "launcher=local")]),
    row("mpi-backend-per-host-tasks", "backend=mpi", "launcher=mpi", "launcher.tasks=per_host", "device=cpu",
        valid=False, probe={"mpi_backend": True}, expect=[(E, "launcher.tasks", "tasks=per_host forks them")]),
    row("socket-ifname-shell", "backend.socket_ifname='eth0;reboot'", valid=False,
        expect=[(E, "backend.socket_ifname", "'eth0;reboot' is not an interface name")]),
    row("socket-ifname-too-long", "backend.socket_ifname=abcdefghijklmnop", valid=False,
        expect=[(E, "backend.socket_ifname", "15 characters at most")]),
    row("socket-ifname-ok", "backend.socket_ifname=eth0", valid=True),
    row("backend-env-bad-name", "+backend.env={BAD-NAME: x}", valid=False,
        expect=[(E, "backend.env.BAD-NAME", "not a valid environment variable name")]),
    row("backend-env-digit-first", valid=False, edit=lambda s: s.backend.env.update({"1BAD": "x"}),
        expect=[(E, "backend.env.1BAD", "not starting with a digit")]),

    # ------------------------------------------------------------ GPUs
    row("too-many-gpus-grid", "topology=1x4", "device=cuda", valid=False, probe={"cuda_devices": 2},
        expect=[(E, "topology.devices_per_node", "this machine has 2"), (E, "topology.devices_per_node", "highest index 1")]),
    row("too-many-gpus-listed", H({"name": "thishost", "devices": 2, "gpus": [1, 3]}), "device=cuda", valid=False,
        probe={"cuda_devices": 2}, expect=[(E, "topology.hosts[0].gpus", "asks for GPUs [1, 3]")]),
    row("cuda-without-gpus", "topology=1x2", "device=cuda", valid=False,
        expect=[(E, "device", "this machine has no CUDA GPU")]),
    row("gpus-listed-on-cuda-ok", H({"name": "thishost", "devices": 2, "gpus": [3, 1]}), "device=cuda", valid=True,
        probe={"cuda_devices": 4}),
    row("gpus-wrong-length", H({"name": "a", "devices": 2, "gpus": [0]}), valid=False,
        expect=[(E, "topology.hosts[0].gpus", "lists 1 GPU(s) [0] for 2 device(s)")]),
    row("gpus-duplicates", H({"name": "a", "devices": 2, "gpus": [1, 1]}), valid=False,
        expect=[(E, "topology.hosts[0].gpus", "has duplicates: [1, 1]")]),
    row("gpus-negative", H({"name": "a", "devices": 2, "gpus": [-1, 0]}), valid=False,
        expect=[(E, "topology.hosts[0].gpus", "negative indices")]),
    row("gpus-listed-on-cpu", H({"name": "thishost", "devices": 2, "gpus": [2, 3]}), "device=cpu", valid=True,
        expect=[(W, "topology.hosts", "gpus are listed but the devices are CPU processes")]),
    row("slurm-cuda-not-counted-here", "topology=2x8", "launcher=slurm", "device=cuda", valid=True,
        probe={"cuda_devices": 0}),

    # ------------------------------------------------------------ parallel mode, sharding, batch
    row("dp-across-hosts", "parallel=dp", "topology=2x2", "launcher=slurm", "device=cuda", valid=False,
        expect=[(E, "parallel.mode", "the topology has 2 hosts"), (E, "parallel.mode", "parallel=ddp")]),
    row("dp-with-sharding", "parallel=dp", "sharding=oss", "topology=1x2", "device=cuda", valid=False,
        probe={"cuda_devices": 2}, expect=[(E, "sharding.mode", "oss shards across processes, but dp is one process")]),
    row("dp-single-host-cuda-ok", "parallel=dp", "topology=1x4", "device=cuda", valid=True, probe={"cuda_devices": 4}),
    row("dp-on-cpu-notice", "parallel=dp", "topology=1x2", "device=cpu", valid=True,
        expect=[(N, "parallel.mode", "2 CPU devices become 1 process")]),
    row("sharding-world-size-1-notice", "sharding=fsdp", "topology=1x1", "device=cpu", valid=True,
        expect=[(N, "sharding.mode", "fsdp with world size 1 shards nothing")]),
    row("sharding-zero-ok", "sharding=zero", "topology=1x4", "device=cpu", valid=True),
    row("sharding-oss-cpu-ok", "sharding=oss", "topology=1x2", "device=cpu", valid=True),
    row("sharding-sdp-cpu-ok", "sharding=sdp", "topology=1x4", "device=cpu", "sharding.reduce_buffer_size=8388608",
        valid=True),
    row("sharding-fsdp-cpu-ok", "sharding=fsdp", "topology=1x2", "device=cpu", "sharding.reshard_after_forward=false",
        valid=True),
    row("sharding-sdp-cuda-ok", "sharding=sdp", "topology=1x2", "device=cuda", valid=True, probe={"cuda_devices": 2}),
    row("sharding-fsdp-multi-host-ok", "sharding=fsdp", "topology=2x8", "launcher=slurm", "device=cuda", valid=True),
    row("dp-with-sharding-one-device", "parallel=dp", "sharding=zero", "topology=1x1", "device=cpu",
        valid=False, expect=[(E, "sharding.mode", "zero shards across processes, but dp is one process")]),
    row("fairscale-fsdp-on-cpu", "sharding=fairscale_fsdp", "topology=1x2", "device=cpu", valid=False,
        expect=[(E, "sharding.mode", "fairscale's FullyShardedDataParallel needs CUDA"),
                (E, "sharding.mode", "this job's devices are CPU processes"),
                (E, "sharding.mode", "sharding=fsdp (torch FSDP2")]),
    row("fairscale-fsdp-on-cuda", "sharding=fairscale_fsdp", "topology=1x2", "device=cuda", valid=False,
        probe={"cuda_devices": 2}, expect=[(E, "sharding.mode", "is not offered: it was upstreamed into torch"),
                                           (E, "sharding.mode", "sharding=fsdp")]),
    row("fairscale-fsdp-world-size-1", "sharding=fairscale_fsdp", "topology=1x1", "device=cpu", valid=False,
        expect=[(E, "sharding.mode", "needs CUDA")]),
    row("sharding-oss-without-fairscale", "sharding=oss", "topology=1x2", "device=cpu", valid=False,
        probe={"missing_extras": frozenset({"fairscale"})},
        expect=[(E, "sharding.mode", "oss: sharding=oss and sharding=sdp (fairscale's OSS and ShardedDDP) needs "
                                     "fairscale, which is not installed here (the extra torch-jobspec[fairscale])"),
                (E, "sharding.mode", "pip install 'torch-jobspec[fairscale]'; or torch's own: sharding=zero")]),
    row("sharding-sdp-without-fairscale", "sharding=sdp", "topology=1x2", "device=cpu", valid=False,
        probe={"missing_extras": frozenset({"fairscale"})}, expect=[(E, "sharding.mode", "sdp: sharding=oss and")]),
    row("sharding-fsdp-without-fairscale-ok", "sharding=fsdp", "topology=1x2", "device=cpu", valid=True,
        probe={"missing_extras": frozenset({"fairscale"})}),
    row("digits-without-the-examples-extra", "recipe=digits", "topology=1x2", "device=cpu", valid=False,
        probe={"missing_extras": frozenset({"examples"})},
        expect=[(E, "recipe.target", "runner.recipes.digits:main: the bundled digits recipe (scikit-learn's digits "
                                     "data) needs scikit-learn, which is not installed here (the extra "
                                     "torch-jobspec[examples])"),
                (E, "recipe.target", "pip install 'torch-jobspec[examples]'")]),
    row("sharding-with-script-recipe", "recipe=script", "recipe.path=train.py", f"recipe.target={TARGET}",
        "sharding=sdp", "topology=1x2", "device=cpu", valid=False, probe={"paths": frozenset({"train.py"})},
        expect=[(E, "sharding.mode", "recipe=script runs a torchrun-style script that never sees the run context"),
                (E, "sharding.mode", "sharding=none with recipe=script")]),
    row("sharding-reduce-buffer-negative", "sharding=sdp", "sharding.reduce_buffer_size=-1", valid=False,
        expect=[(E, "sharding.reduce_buffer_size", "must be 0 or more, got -1")]),
    row("sharding-reduce-buffer-without-sdp", "sharding=oss", "sharding.reduce_buffer_size=1024", valid=True,
        expect=[(W, "sharding.reduce_buffer_size", "only used by sharding=sdp (sharding=oss)")]),
    row("sharding-reshard-without-fsdp", "sharding=zero", "sharding.reshard_after_forward=false", valid=True,
        expect=[(W, "sharding.reshard_after_forward", "only used by sharding=fsdp (sharding=zero)")]),
    row("sharding-sdp-ignores-ddp-options", "sharding=sdp", "parallel.find_unused_parameters=true",
        "parallel.bucket_cap_mb=50", valid=True,
        expect=[(W, "parallel.find_unused_parameters", "sharding=sdp does not use"),
                (W, "parallel.bucket_cap_mb", "sharding.reduce_buffer_size")]),
    row("sharding-fsdp-ignores-ddp-options", "sharding=fsdp", "parallel.find_unused_parameters=true", valid=True,
        expect=[(W, "parallel.find_unused_parameters", "FSDP2 exchanges the gradients")]),
    row("sharding-zero-keeps-ddp-options", "sharding=zero", "parallel.find_unused_parameters=true", valid=True),
    # a global batch that does not divide is split exactly (runner.spec.batch): 22, 21, 21
    row("batch-not-divisible-runs", "topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device",
        "device=cpu", "recipe.global_batch_size=64", valid=True),
    row("batch-not-divisible-grid-runs", "topology=1x8", "device=cpu", "recipe.global_batch_size=100", valid=True),
    row("batch-smaller-than-world", "topology=1x8", "device=cpu", "recipe.global_batch_size=6", valid=False,
        expect=[(E, "recipe.global_batch_size", "6 over world size 8 leaves ranks 6-7 without a sample"),
                (E, "recipe.global_batch_size", "recipe.global_batch_size=8 or more")]),
    row("micro-batch-larger-than-global", "recipe.micro_batch_size=128", valid=False,
        expect=[(E, "recipe.micro_batch_size", "128 is larger than the global batch 64"),
                (E, "recipe.micro_batch_size", "recipe.micro_batch_size=64 or less")]),
    row("micro-batch-zero", "recipe.micro_batch_size=0", valid=False,
        expect=[(E, "recipe.micro_batch_size", "must be a whole number of at least 1, got 0")]),
    row("micro-batch-fits", "topology=1x3", "recipe.micro_batch_size=5", valid=True),
    row("batch-zero", "recipe.global_batch_size=0", valid=False,
        expect=[(E, "recipe.global_batch_size", "must be at least 1, got 0")]),

    # ------------------------------------------------------------ host lists
    row("host-name-semicolon", H({"name": "a;reboot", "devices": 1}, {"name": "b", "devices": 1}), "launcher=manual",
        valid=False, expect=[(E, "topology.hosts[0].name", "'a;reboot' is not a host name or IP address")]),
    row("host-addr-subshell", H({"name": "a", "devices": 1}, {"name": "b", "addr": "$(id)", "devices": 1}),
        "launcher=mpi", valid=False, expect=[(E, "topology.hosts[1].addr", "'$(id)' is not a host name")]),
    row("host-name-space-and-backtick", H({"name": "a b`x`", "devices": 1}), valid=False,
        expect=[(E, "topology.hosts[0].name", "no spaces or shell characters")]),
    row("host-ipv6-ok", H({"name": "thishost", "addr": "::1", "devices": 1}), valid=True),
    row("duplicate-hosts", H({"name": "a", "devices": 2}, {"name": "a", "devices": 2}), "launcher=manual", valid=False,
        expect=[(E, "topology.hosts[1]", "'a' is listed twice (also topology.hosts[0])")]),
    row("duplicate-addr", H({"name": "a", "addr": "10.0.0.1", "devices": 1}, {"name": "b", "addr": "10.0.0.1", "devices": 1}),
        "launcher=mpi", valid=False, expect=[(E, "topology.hosts[1]", "'10.0.0.1' is listed twice")]),
    row("nodes-mismatch-hosts", *AB[1:], "topology.nodes=3", "launcher=manual", valid=False,
        expect=[(E, "topology.nodes", "is 3 but topology.hosts lists 2 host(s)")]),
    row("nodes-zero", "topology.nodes=0", valid=False, expect=[(E, "topology.nodes", "must be at least 1, got 0")]),
    row("devices-per-node-negative", "topology.devices_per_node=-2", valid=False,
        expect=[(E, "topology.devices_per_node", "must be at least 1, got -2")]),
    row("nodes-and-devices-bad", "topology.nodes=-1", "topology.devices_per_node=0", valid=False,
        expect=[(E, "topology.nodes", "got -1"), (E, "topology.devices_per_node", "got 0")]),
    row("grid-incomplete", "topology.devices_per_node=null", valid=False,
        expect=[(E, "topology.devices_per_node", "missing: devices_per_node")]),
    row("host-devices-zero", H({"name": "a", "devices": 0}), valid=False,
        expect=[(E, "topology.hosts[0].devices", "must be at least 1, got 0")]),
    row("host-devices-missing", H({"name": "a"}), valid=False,
        expect=[(E, "topology.hosts[0].devices", "topology.devices_per_node is not set either")]),
    row("hosts-empty", "topology.hosts=[]", valid=False, expect=[(E, "topology.hosts", "is an empty list")]),

    # ------------------------------------------------------------ options
    row("port-too-big", "init.master_port=70000", valid=False,
        expect=[(E, "init.master_port", "70000 is not a TCP port (1..65535)")]),
    row("port-negative", "init.master_port=-1", valid=False, expect=[(E, "init.master_port", "-1 is not a TCP port")]),
    row("port-privileged", "init.master_port=80", valid=True,
        expect=[(W, "init.master_port", "80 is a privileged port")]),
    row("port-fixed-ok", "init.master_port=29500", valid=True),
    row("timeout-zero", "init.timeout_s=0", valid=False, expect=[(E, "init.timeout_s", "must be positive, got 0.0")]),
    row("timeout-negative", "init.timeout_s=-5", valid=False, expect=[(E, "init.timeout_s", "got -5.0")]),
    row("run-id-path", "run_id='../etc'", valid=False, expect=[(E, "run_id", "'../etc' is not a safe run id")]),
    row("slurm-time-bad", "launcher=slurm", "launcher.slurm.time=1h", valid=False,
        expect=[(E, "launcher.slurm.time", "'1h' is not a Slurm time")]),
    row("slurm-time-days-ok", "launcher=slurm", "launcher.slurm.time=2-12:00:00", valid=True),
    row("slurm-signal-bad", "launcher=slurm", "launcher.slurm.signal='USR1 90'", valid=False,
        expect=[(E, "launcher.slurm.signal", "'USR1 90' is not a Slurm --signal value")]),
    row("slurm-signal-batch-ok", "launcher=slurm", "launcher.slurm.signal=B:SIGUSR2@120", valid=True),
    row("slurm-gpu-request-bad", "launcher=slurm", "launcher.slurm.gpu_request=gpus", valid=False,
        expect=[(E, "launcher.slurm.gpu_request", "'gpus' is not one of gpus-per-node, gres")]),
    row("slurm-cpus-per-task-zero", "launcher=slurm", "launcher.slurm.cpus_per_task=0", valid=False,
        expect=[(E, "launcher.slurm.cpus_per_task", "must be at least 1, got 0")]),
    row("slurm-extra-not-an-option", "launcher=slurm", "launcher.slurm.extra=['constraint=a100','--qos=high']",
        valid=False, expect=[(E, "launcher.slurm.extra[0]", "'constraint=a100' is not an sbatch option")]),
    row("slurm-options-ignored-by-local", "launcher=local", "launcher.slurm.time=1h", "launcher.slurm.gpu_request=x",
        valid=True),

    # ------------------------------------------------------------ manual host selection
    row("manual-host-index-out-of-range", AB, "launcher=manual", "launcher.manual.host=2", valid=False,
        expect=[(E, "launcher.manual.host", "index 2 is past the last host (the topology has 2: 0..1)")]),
    row("manual-host-unknown-name", AB, "launcher=manual", "launcher.manual.host=c", valid=False,
        expect=[(E, "launcher.manual.host", "'c' is none of the hosts ['a', 'b']")]),
    row("manual-host-by-index-ok", AB, "launcher=manual", "launcher.manual.host=1", valid=True),
    row("manual-host-by-name-ok", AB, "launcher=manual", "launcher.manual.host=b", valid=True),
    row("manual-host-by-addr-ok", H({"name": "a", "addr": "10.0.0.1", "devices": 1},
                                     {"name": "b", "addr": "10.0.0.2", "devices": 1}),
        "launcher=manual", "launcher.manual.host=10.0.0.2", valid=True),

    # ------------------------------------------------------------ local launcher
    row("local-several-hosts-grid", "topology=2x2", "launcher=local", valid=False,
        expect=[(E, "launcher.kind", "the topology has 2 hosts"),
                (E, "launcher.kind", "topology.nodes=1 topology.devices_per_node=4")]),
    row("local-several-remote-hosts", AB, "launcher=local", valid=False,
        expect=[(E, "launcher.kind", "local starts one host's processes on this machine")]),

    # ------------------------------------------------------------ recipe
    row("recipe-unimportable", "recipe.target=no_such_pkg_x.train:main", valid=False,
        expect=[(E, "recipe.target", "module 'no_such_pkg_x.train' cannot be imported")]),
    row("recipe-unimportable-submodule", "recipe.target=runner.recipes.no_such_module_x", valid=False,
        expect=[(E, "recipe.target", "'runner.recipes.no_such_module_x' cannot be imported")]),
    row("recipe-malformed-colons", "recipe.target='recipes.x:main:y'", valid=False,
        expect=[(E, "recipe.target", "is not 'package.module:function' or 'package.module'")]),
    row("recipe-malformed-digit", "recipe.target=1abc", valid=False,
        expect=[(E, "recipe.target", "'1abc' is not 'package.module:function'")]),
    row("recipe-module-function-ok", "recipe.target=operator:add", valid=True),  # any module that imports
    row("recipe-function-wrong-arity", "recipe.target=json:loads", valid=False,
        expect=[(E, "recipe.target", "cannot be called as loads(ctx, cfg)")]),
    row("recipe-not-a-function", "recipe.target=json:__all__", valid=False,
        expect=[(E, "recipe.target", "json:__all__ (")]),
    row("recipe-module-raises-at-import", "recipe.target=this:main", valid=False,  # `this` prints, then has no main
        expect=[(E, "recipe.target", "module 'this'")]),
    row("recipe-old-bundled-name", "recipe.target=recipes.digits:main", valid=False,
        expect=[(E, "recipe.target", "recipe.target=runner.recipes.digits:main")]),
    row("script-local-rank-arg-ok", "recipe=script", "recipe.path=train.py", "recipe.local_rank_arg=--local-rank",
        valid=True, probe={"paths": frozenset({"train.py"})}),
    row("script-local-rank-arg-unknown", "recipe=script", "recipe.path=train.py", "recipe.local_rank_arg=--rank",
        valid=False, probe={"paths": frozenset({"train.py"})},
        expect=[(E, "recipe.local_rank_arg", "'--rank' is neither of --local_rank or --local-rank")]),
    row("workdir-relative", "workdir=jobs", valid=False, expect=[(E, "workdir", "'jobs' is not an absolute path")]),
    row("console-all-ok", "log.console=all", valid=True),
    row("console-ranks-ok", "topology=1x4", "log.console='0,3'", valid=True),
    row("console-rank-past-the-last", "topology=1x2", "log.console='0,3'", valid=False,
        expect=[(E, "log.console", "rank(s) 3 past the last rank (world size 2: ranks 0..1)")]),
    row("console-not-a-choice", "log.console=some", valid=False,
        expect=[(E, "log.console", "'some' is not main, all or a list of ranks")]),
    row("collectives-negative", "log.collectives=-1", valid=False, expect=[(E, "log.collectives", "must be 0 or more")]),
    row("stall-timeout-zero", "launcher.stall_timeout_s=0", valid=False,
        expect=[(E, "launcher.stall_timeout_s", "must be positive, got 0")]),
    row("grace-negative", "launcher.grace_s=-3", valid=False,
        expect=[(E, "launcher.grace_s", "must be 0 or more, got -3.0")]),
    row("grace-zero-ok", "launcher.grace_s=0", valid=True),
    row("stop-signal-unknown", "launcher.stop_signal=NOPE", valid=False,
        expect=[(E, "launcher.stop_signal", "'NOPE' is not a signal")]),
    row("workdir-missing", "workdir=/no/such/folder", valid=False,
        expect=[(E, "workdir", "'/no/such/folder' is not a folder here")]),
    row("recipe-custom-untyped-ok", "recipe=custom", f"recipe.target={TARGET}", "+recipe.lr=0.1", valid=True),
    row("recipe-custom-batch-not-a-number", "recipe=custom", f"recipe.target={TARGET}",
        "recipe.global_batch_size=abc", valid=False,
        expect=[(E, "recipe.global_batch_size", "must be a whole number, got 'abc'")]),
    row("recipe-custom-batch-not-divisible-runs", "recipe=custom", f"recipe.target={TARGET}", "topology=1x4",
        "recipe.global_batch_size=10", valid=True),
    row("recipe-custom-batch-too-small", "recipe=custom", f"recipe.target={TARGET}", "topology=1x4",
        "recipe.global_batch_size=3", valid=False, expect=[(E, "recipe.global_batch_size", "leaves rank 3 without a sample (3 < 4")]),
    row("recipe-custom-micro-without-global", "recipe=custom", f"recipe.target={TARGET}",
        "recipe.global_batch_size=null", "recipe.micro_batch_size=8", valid=False,
        expect=[(E, "recipe.micro_batch_size", "8 without a global batch")]),
    row("recipe-script-has-no-batch-rule", "recipe=script", "recipe.path=train.py", f"recipe.target={TARGET}",
        "topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device", "device=cpu", valid=True,
        probe={"paths": frozenset({"train.py"})}),
    row("recipe-script-missing", "recipe=script", "recipe.path=train.py", "device=cpu", valid=False,
        expect=[(E, "recipe.path", "'train.py' does not exist")]),
]


def _compose_row(r: Row) -> JobConfig:
    spec = compose(*BASE, *r.overrides)
    if r.edit:
        r.edit(spec)
    return spec


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_rule_table(r: Row) -> None:
    got = validate(_compose_row(r), **r.probe)
    report = got.rendered()
    assert got.valid is r.valid, f"expected {'valid' if r.valid else 'invalid'}, got:\n{report}"
    assert (got.job is None) == bool(got.errors)
    for severity, key, fragment in r.expect:
        assert got.find(key, fragment, severity), f"no {severity.value} {key!r} containing {fragment!r} in:\n{report}"
    expected_error_keys = Counter(k for s, k, _ in r.expect if s is E)
    got_error_keys = Counter(p.key for p in got.errors)
    # each expected error key appears, and no other error does (several fragments may name one problem)
    assert set(got_error_keys) == set(expected_error_keys), report
    for p in got.problems:
        assert p.key and p.message, p
        if p.severity is E:
            assert p.hint, f"error without a hint: {p.render()}"


def test_table_is_big_and_covers_both_verdicts() -> None:
    assert len(ROWS) >= 40
    assert len({r.id for r in ROWS}) == len(ROWS)
    assert sum(r.valid for r in ROWS) >= 10 and sum(not r.valid for r in ROWS) >= 30


# ---------------------------------------------------------------------------- all errors at once


@pytest.mark.parametrize("overrides, keys", [
    # three independent layers: the topology, an option, the recipe
    (("topology.nodes=0", "init.timeout_s=-1", "recipe.target=1bad"),
     {"topology.nodes", "init.timeout_s", "recipe.target"}),
    # three rules over the resolved job plus an option rule
    (("topology=hetero_2_1", "launcher=slurm", "parallel=dp", "init.master_port=70000", "device=cpu"),
     {"launcher.tasks", "parallel.mode", "init.master_port"}),
    # three option errors
    (("init.master_port=70000", "backend.socket_ifname='a b'", "recipe.global_batch_size=0"),
     {"init.master_port", "backend.socket_ifname", "recipe.global_batch_size"}),
], ids=["layers", "job-rules", "options"])
def test_all_errors_reported_at_once(overrides, keys) -> None:
    got = validate((*BASE, *overrides))
    assert not got.valid
    assert len(got.errors) == 3, got.rendered()
    assert {p.key for p in got.errors} == keys


def test_problems_render_key_message_hint() -> None:
    got = validate((*BASE, "init.master_port=70000"))
    (p,) = got.errors
    text = p.render()
    assert text.startswith("error: init.master_port: 70000 is not a TCP port")
    assert "\n    hint: leave it at 0" in text


# ---------------------------------------------------------------------------- what the probe is asked

CPU_SPECS = [
    ("topology=1x2", "device=cpu"),
    ("topology=2x2", "launcher=slurm", "device=cpu"),
    ("topology=2x2", "launcher=slurm", "launcher.tasks=per_device", "device=cpu", "init=file"),
    (*AB, "launcher=mpi", "device=cpu"),
    (*AB, "launcher=manual", "device=cpu", "init=file", "init.dir=/shared"),
    ("parallel=dp", "topology=1x4", "device=cpu"),
    ("topology=1x2", "device=cpu", "backend=nccl"),  # invalid, still no CUDA question
    ("topology=1x2", "device=cpu", "sharding=fsdp", "recipe.global_batch_size=7"),  # invalid
]


@pytest.mark.parametrize("overrides", CPU_SPECS, ids=[" ".join(o) for o in CPU_SPECS])
def test_cpu_job_never_asks_for_cuda(overrides) -> None:
    got = validate((*BASE, *overrides), cuda_devices=8)
    assert "cuda" not in got.probe.asked, got.probe.asked
    assert "mpi" not in got.probe.asked  # backend is not mpi: no torch.distributed question either
    if got.valid:
        assert got.job.device.value == "cpu"


def test_auto_device_asks_and_cuda_local_counts() -> None:
    assert "cuda" in validate((*BASE, "topology=1x2"), cuda_devices=0).probe.asked
    got = validate((*BASE, "topology=1x2", "device=cuda"), cuda_devices=2)
    assert got.valid and "cuda" in got.probe.asked
    # on a cluster the GPUs are counted where the tasks run, not on the login node
    got = validate((*BASE, "topology=2x2", "launcher=slurm", "device=cuda"), cuda_devices=0)
    assert got.valid and "cuda" not in got.probe.asked


@pytest.mark.parametrize("mode, asks", [("none", False), ("oss", True), ("sdp", True), ("zero", False), ("fsdp", False)])
def test_fairscale_asked_only_for_the_fairscale_modes(mode, asks) -> None:
    got = validate((*BASE, "topology=1x2", "device=cpu", f"sharding={mode}"))
    assert got.valid and ("fairscale" in got.probe.asked) is asks, got.probe.asked


def test_mpi_availability_asked_only_for_backend_mpi() -> None:
    got = validate((*BASE, "topology=1x2", "launcher=mpi", "device=cpu", "backend=mpi"), mpi_backend=True)
    assert got.valid and [a for a in got.probe.asked if a not in extras.BY_NAME] == ["mpi"]


def test_only_the_bundled_recipe_that_needs_an_extra_asks_for_it() -> None:
    assert "examples" in validate((*BASE, "topology=1x2", "device=cpu")).probe.asked
    # another recipe does not need it (one whose module imports no torch: its trial is over at once)
    other = validate(("topology=1x2", "device=cpu", "recipe=custom", "recipe.target=operator:add"),
                     missing_extras=frozenset({"examples"}))
    assert other.valid and "examples" not in other.probe.asked


# ---------------------------------------------------------------------------- resolution


@pytest.mark.parametrize("overrides, probe, device, backend, master", [
    (("topology=1x2",), {}, "cpu", "gloo", "127.0.0.1"),
    (("topology=1x2",), {"cuda_devices": 2}, "cuda", "nccl", "127.0.0.1"),
    (("topology=2x2", "launcher=slurm", "device=cuda"), {}, "cuda", "nccl", None),
    ((*AB, "launcher=mpi", "device=cpu"), {}, "cpu", "gloo", "a"),
    ((*H({"name": "a", "addr": "10.0.0.1", "devices": 1}, {"name": "b", "devices": 1}), "launcher=manual",
      "device=cpu", "backend=gloo"), {}, "cpu", "gloo", "10.0.0.1"),
    ((*AB, "launcher=mpi", "device=cpu", "init.master_addr=10.9.9.9"), {}, "cpu", "gloo", "10.9.9.9"),
])
def test_resolution(overrides, probe, device, backend, master) -> None:
    got = validate((*BASE, *overrides), **probe)
    assert got.valid, got.rendered()
    assert (got.job.device.value, got.job.backend.value, got.job.master_addr) == (device, backend, master)
