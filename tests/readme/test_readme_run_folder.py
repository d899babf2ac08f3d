"""README's "What a run leaves behind": the table names the files of a run folder that the code names, in its order
(runner.records.paths.RunPaths.entries, Hydra's own included); the run folders it and the rest of the README name
are those `run` makes; a run-folder path elsewhere in the README (`logs/...`, `checkpoints/...`) is one of these
files; the error file's flag for a killed rank is its record's (runner.records.outcomes.ErrorRecord); a file of a
sweep's folder that "Sweeps" names is one runner.records.paths.SweepPaths names (or one of its jobs' run folders)."""

from __future__ import annotations

import dataclasses
import fnmatch
import re

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from omegaconf import OmegaConf

import runner.app.cli
from readme_text import code_of, docs
from runner.records.outcomes import ErrorRecord
from runner.records.paths import RunPaths, SweepPaths

pytestmark = pytest.mark.docs

RUN_ID = "r1"


def code_names() -> list[str]:
    """Every file and folder of a run folder, as the one object that names them lists them (RunPaths.entries)."""
    return [e.path for e in RunPaths.entries()]


def _hydra(*overrides: str):
    runner.app.cli.register(overrides)
    with initialize_config_module(config_module="runner.conf", version_base=None):
        return hydra_compose(config_name="job", overrides=list(overrides), return_hydra_config=True).hydra


def table_names() -> list[str]:
    """The table's paths, in its order (a row may name several: `.hydra/`, `.hydra/overrides.yaml`, `run.log`)."""
    return [name for row in docs().table("path", "what").rows for name in code_of(row[0])]


def test_the_table_names_the_files_the_code_names() -> None:
    assert table_names() == code_names()


def test_the_error_files_flag_for_a_killed_rank_is_the_records() -> None:
    """`logs/rankNNNNN.error.json`: "for a rank killed by a signal, by its launcher: `"killed": true`"."""
    [row] = [row for row in docs().table("path", "what").rows if "`logs/rankNNNNN.error.json`" in row[0]]
    [flag] = re.findall(r'by its launcher: `"(\w+)": true`', row[1])
    assert flag in {f.name for f in dataclasses.fields(ErrorRecord) if f.type in (bool, "bool")}, flag


def _entry_pattern(path: str) -> re.Pattern[str]:
    """An entry's path as the names it stands for: ``<name>`` any name, ``NNNNN`` a rank (or itself, or ``*``)."""
    parts = re.split(r"(<[^>]+>|NNNNN)", path.rstrip("/"))
    fills = {"NNNNN": r"(?:NNNNN|\d{5}|\*)"}
    return re.compile("".join(fills.get(p, "[^/]+") if i % 2 else re.escape(p) for i, p in enumerate(parts)) + "/?")


def test_every_run_folder_path_the_readme_names_is_one() -> None:
    """`logs/rank*.log`, `checkpoints/last.pt`, `logs/rankNNNNN.*`: a file or folder of a run folder, or a glob of
    them."""
    entries = code_names()
    named = [s.text for s in docs().spans if re.match(r"(logs|checkpoints)/", s.text)]
    assert len(named) >= 5
    for name in named:
        assert any(_entry_pattern(e).fullmatch(name) or fnmatch.fnmatch(e, name) for e in entries), name


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
    named = {s.text for s in docs().spans if s.text.startswith("outputs/") and "<" in s.text}
    assert len(named) >= 4, named
    for text in named:
        assert any(_template(text).fullmatch(folder) for folder in made), (text, made)


def _placeholders(path: str) -> re.Pattern[str]:
    """An entry's path, its placeholders standing for the README's (one or several: `<job id>` for `<array>_<i>`)."""
    parts = re.split(r"<[^>]+>", path)
    return re.compile(r"<[\w ]+>(?:_<[\w ]+>)*".join(map(re.escape, parts)))


def test_every_file_of_a_sweep_the_readme_names_is_one() -> None:
    """`summary.csv`, `summary.md`, `scaling.png`, `array<k>.sbatch`: SweepPaths's; `job.sbatch`,
    `<i>/slurm-<array>_<i>.out`: a job's run folder's (`<i>/`)."""
    named = [s.text for s in docs().spans if s.section == "Sweeps" and re.fullmatch(r"[\w<>/.-]+\.[a-z]+", s.text)]
    assert len(named) >= 5, named
    entries = [e.path for e in SweepPaths.entries()] + [f"{prefix}{e}" for e in code_names() for prefix in ("", "<n>/")]
    for name in named:
        assert any(_placeholders(e).fullmatch(name) for e in entries), (name, entries)
