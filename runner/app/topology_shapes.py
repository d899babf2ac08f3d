"""``topology=NxM`` for any N and M, not only the shapes shipped as files under conf/topology/.

Before Hydra composes, :func:`register_named_shapes` finds every ``NxM`` a launch can ask for — in the command
line's ``topology=`` overrides (sweeps included: ``topology=1x1,1x2,3x4``) and in the defaults lists of the YAML
files of the user's config folder (``defaults: [override /topology: 3x4]``) — and stores each as a grid
topology in Hydra's ConfigStore (``topology/3x4``), a public API. The override stays as typed, so a sweep's
folders, ``hydra.job.override_dirname``, ``hydra.runtime.choices`` and the sweep summary's configuration column
read ``topology=3x4``. A shipped file (conf/topology/2x2.yaml) and a user's own ``topology/3x4.yaml`` in
--config-dir are left as they are: no shape of that name is stored.

(Before, a subclass of the pkg:// source in Hydra's internals answered any ``topology/NxM``: it tied the runner
to one release of Hydra.)
"""

from __future__ import annotations

import re
from importlib import resources
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore

from runner.spec.schema import TopologyConfig

PACKAGE = "runner.conf"  # the shipped config groups
GROUP = "topology"
_SHAPE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,3})$")
# an NxM among a value's other characters (a sweep's commas, choice(...), brackets, quotes)
_SHAPE_IN = re.compile(r"(?<![\w.])([1-9][0-9]{0,5})x([1-9][0-9]{0,3})(?![\w.])")
# Hydra's flags that name a folder of the user's configs
_FOLDER_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp")


def parse_shape(name: str) -> tuple[int, int] | None:
    """(nodes, devices_per_node) of an option name ``<N>x<M>``, else None."""
    m = _SHAPE.match(name.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _shapes_in(value: str) -> Iterator[tuple[int, int]]:
    for m in _SHAPE_IN.finditer(value):
        yield int(m.group(1)), int(m.group(2))


def _is_topology_key(key: str) -> bool:
    """``topology``, ``+topology``, ``override /topology``, ``/topology@pkg`` ...: the topology group's choice."""
    key = key.strip().removeprefix("override").strip().lstrip("+~/")
    return key.split("@", 1)[0].strip() == GROUP


def shapes_in_overrides(overrides: Iterable[str]) -> set[tuple[int, int]]:
    """The shapes ``topology=`` overrides choose (each value of a sweep or ``choice(...)``)."""
    found: set[tuple[int, int]] = set()
    for override in overrides:
        key, eq, value = override.partition("=")
        if eq and _is_topology_key(key):
            found.update(_shapes_in(value))
    return found


def shapes_in_defaults(folder: Path) -> set[tuple[int, int]]:
    """The shapes the defaults lists of the YAML files under ``folder`` choose for the topology group
    (``- topology: 3x4``, ``- override /topology: 3x4``); a file that does not parse is left to Hydra to report."""
    found: set[tuple[int, int]] = set()
    for path in sorted(folder.rglob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        defaults = doc.get("defaults") if isinstance(doc, dict) else None
        for entry in defaults if isinstance(defaults, list) else ():
            if not isinstance(entry, dict):
                continue
            for key, value in entry.items():
                if isinstance(key, str) and _is_topology_key(key):
                    for v in value if isinstance(value, list) else [value]:
                        if isinstance(v, str) and (shape := parse_shape(v)) is not None:
                            found.add(shape)
    return found


def config_folders(argv: Iterable[str]) -> list[Path]:
    """The folders of the user's configs that Hydra's flags name (``--config-dir jobs``, ``-cd=jobs``, ...)."""
    argv = list(argv)
    folders = []
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if flag in _FOLDER_FLAGS:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value and not value.startswith("pkg://") and Path(value).is_dir():
                folders.append(Path(value))
    return folders


def register_shapes(shapes: Iterable[tuple[int, int]], folders: Iterable[Path] = ()) -> None:
    """Store each shape as option ``topology/<N>x<M>``: a grid of N hosts x M devices (what a shipped file of that
    name holds); idempotent. A shape that is a file — shipped, or ``topology/<N>x<M>.yaml`` in one of the user's
    config ``folders`` — is left to the file: it wins anyway, and a stored config of the same name would be taken
    as the file's schema (Hydra's deprecated automatic schema matching)."""
    cs = ConfigStore.instance()
    files = [resources.files(PACKAGE).joinpath(GROUP), *(Path(f) / GROUP for f in folders)]
    for nodes, devices in shapes:
        name = f"{nodes}x{devices}"
        if not any(folder.joinpath(f"{name}.yaml").is_file() for folder in files):
            cs.store(group=GROUP, name=name, node=TopologyConfig(nodes=nodes, devices_per_node=devices))


def register_named_shapes(argv: Iterable[str]) -> None:
    """Every shape that ``run``'s arguments ``argv`` may compose: their overrides' and their config folders'."""
    argv = list(argv)
    shapes = shapes_in_overrides(a for a in argv if not a.startswith("-"))
    folders = config_folders(argv)
    for folder in folders:
        shapes |= shapes_in_defaults(folder)
    register_shapes(shapes, folders)
