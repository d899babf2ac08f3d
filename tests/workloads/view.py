"""What a rank sees of its job, written to <out_dir>/view<rank>.json by the workloads that call :func:`write`: its run
id and master (its environment), the recipe options it was given, where its code was imported from, the folder it
runs in, and the spec the runner holds for it. A recipe is not given its spec, so this probe finds it in the rank's
setup on the stack. Tests compare every rank's view with the others' and with the run's spec.yaml (runs.check_views)."""

import json
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf


def _rank_spec():
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if type(value).__name__ == "RankSetup":
                return value.spec
        frame = frame.f_back
    raise RuntimeError("no RankSetup on the stack: this probe runs inside a recipe that `run` called")


def write(ctx, cfg) -> None:
    spec = OmegaConf.to_container(OmegaConf.structured(_rank_spec()), enum_to_str=True)
    view = {"rank": ctx.rank, "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
            "master_addr": os.environ.get("MASTER_ADDR"), "master_port": os.environ.get("MASTER_PORT"),
            "options": OmegaConf.to_container(cfg), "code": str(Path(__file__).resolve().parents[1]),
            "cwd": os.getcwd(), "spec": spec}
    Path(cfg.out_dir, f"view{ctx.rank}.json").write_text(json.dumps(view))
