"""README's "What a run leaves behind": the table names the files of a run folder that the code names (RunPaths,
the rank outcome files, the run summary, the checkpoint, Hydra's own), but a listed few, each for a reason; the run
folders it and the rest of the README name are those `run` makes; a run-folder path elsewhere in the README
(`logs/...`, `checkpoints/...`) is one of these files."""

from __future__ import annotations

import inspect
import re
from pathlib import Path, PurePosixPath

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from omegaconf import OmegaConf

import runner.app.cli
from readme_text import code_of, readme
from runner.api import RunContext
from runner.plan.outcome import RankOutcome
from runner.plan.paths import RunPaths
from runner.reports import run_summary
from runner.training.context import CHECKPOINT_DIR

pytestmark = pytest.mark.unit

ROOT, RUN_ID = Path("/run"), "r1"

# Names of the code's that the table leaves out: name -> the README section that says it, or None (internal).
LEFT_OUT = {
    "logs": None,  # a folder: the table's rows are its files
    "checkpoints": None,  # a folder: its file is a row
    "user_stop": "Slurm",  # a marker `run` leaves for the batch script (README: "writes `user_stop`")
    f"{RUN_ID}.rdzv/attempt0": "What a run exposes on the network",  # init=file's, in init.dir when set; removed
    f"{RUN_ID}.job": None,  # init=file's channel folder, beside the rendezvous files
    "logs/rank00000.elastic-error.json": "Differences from torchrun",  # written by torch's @record, on a failure
}


def code_names() -> set[str]:
    """Every path of a run folder the code names, relative to the folder (rank files as rank 0's)."""
    paths = RunPaths(ROOT, RUN_ID)
    found = []
    for name, member in vars(RunPaths).items():
        if isinstance(member, property):
            found.append(getattr(paths, name))
        elif inspect.isfunction(member) and not name.startswith("_") and name != "make":
            [parameter] = list(inspect.signature(member).parameters)[1:]
            found.append(member(paths, 0 if parameter == "rank" else None))
    outcome = RankOutcome(paths, 0)
    found += [outcome.error_file, outcome.done_file, outcome.joined_file, ROOT / run_summary.FILE_NAME]
    checkpoint = inspect.signature(RunContext.save_checkpoint).parameters["name"].default
    found.append(ROOT / CHECKPOINT_DIR / f"{checkpoint}.pt")
    hydra = _hydra()
    found += [ROOT / f"{hydra.job.name}.log", ROOT / hydra.output_subdir]
    return {str(PurePosixPath(p).relative_to(ROOT)) for p in found}


def _hydra(*overrides: str):
    runner.app.cli.register(overrides)
    with initialize_config_module(config_module="runner.conf", version_base=None):
        return hydra_compose(config_name="job", overrides=list(overrides), return_hydra_config=True).hydra


def _as_rank0(name: str) -> str:
    return re.sub(r"rank(NNNNN|\*)", "rank00000", name).rstrip("/")


def table_names() -> set[str]:
    names = set()
    for row in readme().table("path", "what").rows:
        first = None
        for name in code_of(row[0]):
            if name.startswith(".") and first is not None and "/" in first:  # `logs/rankNNNNN.done`, `.joined`
                name = re.sub(r"\.\w+$", name, first)
            first = first or name
            names.add(_as_rank0(name))
    return names


def test_the_table_names_the_files_the_code_names() -> None:
    code = code_names()
    assert not set(LEFT_OUT) - code, f"LEFT_OUT names what the code no longer does: {set(LEFT_OUT) - code}"
    assert table_names() == code - set(LEFT_OUT)
    for name, section in LEFT_OUT.items():
        shown = name.replace(RUN_ID, "<run id>").replace("rank00000", "rankNNNNN").removesuffix("/attempt0")
        assert section is None or shown in readme().section(section), f"README's {section} no longer names {shown}"


def test_every_run_folder_path_the_readme_names_is_one() -> None:
    """`logs/rank*.log`, `checkpoints/`, `logs/rankNNNNN.elastic-error.json`: files (or folders) of a run folder."""
    code = code_names()
    folders = {str(PurePosixPath(n).parent) for n in code} | code
    named = [s.text for s in readme().spans if re.match(r"(logs|checkpoints)/", s.text)]
    assert len(named) >= 5
    for name in named:
        assert _as_rank0(name) in folders, name


def _template(text: str) -> re.Pattern[str]:
    """A folder the README writes with placeholders, as a pattern of the folders `run` makes."""
    fills = {"date": r"\d{4}-\d\d-\d\d", "time": r"\d\d-\d\d-\d\d", "random": "[0-9a-f]+", "uid": "[0-9a-f]+",
             "id": RUN_ID, "run_id": RUN_ID, "n": "7"}
    parts = re.split(r"<(\w+)>", text)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else fills[p] for i, p in enumerate(parts)))


def test_the_run_folders_are_those_run_makes() -> None:
    """`outputs/<date>/<time>_<random>/`, `outputs/runs/<id>/`, `outputs/multirun/<date>/<time>_<uid>/<n>/`."""
    single, pinned = _hydra().run.dir, _hydra(f"run_id={RUN_ID}").run.dir
    sweep = _hydra().sweep
    job = OmegaConf.to_container(sweep, resolve=False)["subdir"].replace("${hydra.job.num}", "7")
    made = [f"{single}/", f"{pinned}/", f"{sweep.dir}/", f"{sweep.dir}/{job}/"]
    named = {s.text for s in readme().spans if s.text.startswith("outputs/") and "<" in s.text}
    assert len(named) >= 4, named
    for text in named:
        assert any(_template(text).fullmatch(folder) for folder in made), (text, made)
