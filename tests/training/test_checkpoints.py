"""runner.training.checkpoints: a checkpoint loads without running anything from the file (a pickle that would
create a file on loading is refused, and the file never appears), and reaches a rank that does not see rank 0's
file in chunks, byte for byte (a real two-process gloo group)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training.checkpoints import CheckpointError
from runner.training.context import ContextSettings, RunContext
from runs import run


class _Planted:
    """Loading it calls open(marker, "w"): the file appears if the loader runs what the pickle names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _alone(tmp_path: Path) -> RunContext:
    place = RankPlace(global_rank=0, local_rank=0, node_rank=0, world_size=1, local_world_size=1, host="node0",
                      device="cpu", device_ids=())
    return RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(),
                                      global_batch_size=1, seed=0, output_dir=tmp_path,
                                      metrics_file=tmp_path / "metrics.jsonl", checkpoint_dir=tmp_path / "ck"))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_none(tmp_path) -> None:
    marker = tmp_path / "ran"
    saved = tmp_path / "planted.pt"
    torch.save({"step": 3, "model": _Planted(marker)}, saved)
    with pytest.raises(CheckpointError) as refused:
        _alone(tmp_path).load_checkpoint(path=saved)
    assert not marker.exists()
    assert str(refused.value) == (
        f"checkpoint {saved} is not a plain checkpoint: it holds io.open; loading it would have to import and call "
        f"code named in the file, so it was refused and nothing in it was run (torch.load with weights_only=True); "
        f"hint: save checkpoints as tensors, dicts, lists, tuples, numbers and strings (a state_dict() is one) and "
        f"save this one again that way; or, if you trust the file, allow its types before ctx.load_checkpoint: "
        f"torch.serialization.add_safe_globals([io.open])")


def test_a_plain_pickle_that_would_run_code_is_refused_too(tmp_path) -> None:
    marker = tmp_path / "ran"
    saved = tmp_path / "planted.pkl"
    saved.write_bytes(pickle.dumps({"model": _Planted(marker)}, protocol=2))
    with pytest.raises(CheckpointError) as refused:
        _alone(tmp_path).load_checkpoint(path=saved)
    assert not marker.exists()
    assert str(refused.value).startswith(
        f"checkpoint {saved} is not a plain checkpoint: it holds something torch's safe loader does not read "
        f"(Unsupported global: GLOBAL io.open was not an allowed global by default.")


@dataclass
class Seen:
    """A recipe's own type in its checkpoint."""

    samples: int


def test_a_type_the_recipe_allows_loads(tmp_path) -> None:
    saved = tmp_path / "allowed.pt"
    torch.save({"seen": Seen(12)}, saved)
    with pytest.raises(CheckpointError) as refused:
        _alone(tmp_path).load_checkpoint(path=saved)
    assert str(refused.value).endswith(f"add_safe_globals([{__name__}.Seen])")
    with torch.serialization.safe_globals([Seen]):
        assert _alone(tmp_path).load_checkpoint(path=saved) == {"seen": Seen(12)}


RANKS = r'''
import datetime, json, sys
from pathlib import Path
import torch, torch.distributed as dist
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training import checkpoints
from runner.training.context import ContextSettings, RunContext

rank, folder = int(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo", init_method=f"file://{folder}/group", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
mine = folder / f"host{rank}"  # each rank's own run folder, as on hosts that do not share one
place = RankPlace(global_rank=rank, local_rank=0, node_rank=rank, world_size=2, local_world_size=1, host=f"h{rank}",
                  device="cpu", device_ids=())
ctx = RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(),
                                 global_batch_size=2, seed=0, output_dir=mine,
                                 metrics_file=mine / "metrics.jsonl", checkpoint_dir=mine / "checkpoints"))
said = {}
received = checkpoints.broadcast_file(mine / "checkpoints" / "last.pt" if rank == 0 else None, torch.device("cpu"),
                                      chunk_bytes=4096)
if received is not None:
    (folder / "received.bin").write_bytes(received.read())
state = ctx.load_checkpoint()
said["loaded"] = {"step": state["step"], "w": state["w"].tolist()}
try:
    ctx.load_checkpoint(path=mine / "planted.pt")
except checkpoints.CheckpointError as e:
    said["planted"] = str(e)
(folder / f"said{rank}.json").write_text(json.dumps(said))
dist.destroy_process_group()
'''


def test_a_rank_that_sees_another_file_gets_rank_0s_checkpoint_in_chunks(tmp_path) -> None:
    for r in (0, 1):
        (tmp_path / f"host{r}" / "checkpoints").mkdir(parents=True)
    sent = tmp_path / "host0" / "checkpoints" / "last.pt"
    torch.save({"step": 7, "w": torch.arange(5000, dtype=torch.float32)}, sent)
    torch.save({"step": 2, "w": torch.zeros(3)}, tmp_path / "host1" / "checkpoints" / "last.pt")  # an older one
    marker = tmp_path / "ran"
    torch.save({"model": _Planted(marker)}, tmp_path / "host0" / "planted.pt")  # host 1 has none: it is sent
    procs = [subprocess.Popen([sys.executable, "-c", RANKS, str(r), str(tmp_path)], stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert sent.stat().st_size > 4 * 4096 and sent.stat().st_size % 4096  # several chunks, the last one short
    assert (tmp_path / "received.bin").read_bytes() == sent.read_bytes()
    said = [json.loads((tmp_path / f"said{r}.json").read_text()) for r in (0, 1)]
    assert said[0]["loaded"] == said[1]["loaded"] == {"step": 7, "w": list(map(float, range(5000)))}
    planted = tmp_path / "host0" / "planted.pt"
    assert said[1]["planted"] == said[0]["planted"].replace(f"checkpoint {planted} ", f"checkpoint "
                                                            f"{tmp_path / 'host1' / 'planted.pt'} (sent by rank 0) ")
    assert said[0]["planted"].startswith(f"checkpoint {planted} is not a plain checkpoint: it holds io.open;")
    assert not marker.exists()


def test_recipe_resume_of_a_file_that_would_run_code_fails_the_job_and_runs_none(tmp_path) -> None:
    marker = tmp_path / "ran"
    planted = tmp_path / "planted.pt"
    torch.save({"model": _Planted(marker)}, planted)
    done = run("topology=1x2", f"recipe.resume={planted}", cwd=tmp_path)
    assert done.code == 1, done.output
    assert (f"CheckpointError: checkpoint {planted} is not a plain checkpoint: it holds io.open; loading it would "
            f"have to import and call code named in the file, so it was refused and nothing in it was run") in done.stderr
    assert not marker.exists()
