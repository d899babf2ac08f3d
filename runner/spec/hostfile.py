"""``topology.hostfile=PATH``: the hosts of a job read from a hostfile users already keep, as DeepSpeed and Open MPI
read theirs.

One host a line: its name (or address), then ``slots=N`` — its processes (devices) — and, as Open MPI writes them,
``max_slots=M`` (taken as a check: M is at least N) or ``max-slots=M``. ``#`` starts a comment; blank lines are
skipped. A host without ``slots=`` gets ``topology.devices_per_node``, where that is set (Open MPI's default would be
its number of cores, which is no GPU count). Anything else on a line — an unknown key, a count that is not a
positive number, a host listed twice, a name no command line could carry — is refused with ``file:line``.

`run` reads the file once, where it starts, into ``topology.hosts`` (:func:`with_hostfile`): the run's spec.yaml
lists the hosts it read, so every host's `run` and every task plans with the same list, whether or not it sees the
file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runner.spec.problems import Problem
from runner.spec.schema import HostConfig, JobConfig
from runner.spec.topology import is_valid_host

KEY = "topology.hostfile"
_SLOTS = ("slots",)
_MAX_SLOTS = ("max_slots", "max-slots")


def parse_hostfile(text: str, where: str, per_node: int | None) -> tuple[list[HostConfig], list[Problem]]:
    """The hosts a hostfile's ``text`` lists, and its problems (each naming ``where:line``). ``per_node``:
    topology.devices_per_node, for a line without ``slots=``."""
    hosts: list[HostConfig] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        at = f"{where}:{number}"
        name, settings = words[0], words[1:]
        if not is_valid_host(name):
            problems.append(Problem(KEY, f"{at}: {name!r} is not a host name or address",
                                    "one host a line: NAME slots=N (letters, digits, '-', '_', '.')"))
            continue
        if name in seen:
            problems.append(Problem(KEY, f"{at}: {name!r} is listed twice (also line {seen[name]})",
                                    "list each host once, with all its slots"))
            continue
        seen[name] = number
        counts, bad = _settings(settings, at)
        problems += bad
        if bad:
            continue
        slots, most = counts.get("slots"), counts.get("max_slots")
        if slots is None and per_node is None:
            problems.append(Problem(KEY, f"{at}: {name!r} gives no slots=N: how many processes does it run?",
                                    f"write '{name} slots=2', or set topology.devices_per_node for every host "
                                    f"without one"))
            continue
        if slots is not None and most is not None and most < slots:
            problems.append(Problem(KEY, f"{at}: {name!r} has slots={slots} but max_slots={most}",
                                    f"slots is how many processes run there: at most max_slots ({most})"))
            continue
        hosts.append(HostConfig(name=name, devices=slots if slots is not None else per_node))
    if not hosts and not problems:
        problems.append(Problem(KEY, f"{where} lists no host", "one host a line: NAME slots=N"))
    return hosts, problems


def _settings(words: list[str], at: str) -> tuple[dict[str, int], list[Problem]]:
    counts: dict[str, int] = {}
    problems: list[Problem] = []
    for word in words:
        key, eq, value = word.partition("=")
        which = "slots" if key in _SLOTS else "max_slots" if key in _MAX_SLOTS else None
        if which is None or not eq:
            problems.append(Problem(KEY, f"{at}: {word!r} is not slots=N or max_slots=N",
                                    "a hostfile line is NAME slots=N [max_slots=M] (DeepSpeed's and Open MPI's "
                                    "form)"))
        elif not value.isdigit() or int(value) < 1:
            problems.append(Problem(KEY, f"{at}: {word!r}: {key} must be a whole number of at least 1",
                                    f"e.g. {key}=2"))
        else:
            counts[which] = int(value)
    return counts, problems


def with_hostfile(spec: JobConfig, cwd: str) -> tuple[JobConfig, list[Problem]]:
    """``spec`` with the hosts of its ``topology.hostfile`` (relative paths: to the job's folder, workdir, else
    ``cwd``) in ``topology.hosts`` and the file's absolute path kept in ``topology.hostfile``, and the problems;
    ``spec`` as it is when it names no hostfile."""
    topology = spec.topology
    if topology.hostfile is None:
        return spec, []
    if topology.hosts is not None:
        return spec, [Problem(KEY, "and topology.hosts both list the hosts",
                              "keep one: the hostfile (topology=hostfile topology.hostfile=PATH), or the list")]
    path = Path(spec.workdir or cwd) / Path(topology.hostfile).expanduser()
    try:
        text = path.read_text()
    except OSError as e:
        return spec, [Problem(KEY, f"{topology.hostfile!r} cannot be read ({e.strerror}; looked at {path})",
                              "a path to your hostfile, absolute or relative to the folder `run` starts in")]
    hosts, problems = parse_hostfile(text, str(topology.hostfile), topology.devices_per_node)
    if not problems and topology.nodes is not None and topology.nodes != len(hosts):
        problems.append(Problem("topology.nodes", f"is {topology.nodes} but {topology.hostfile} lists "
                                                  f"{len(hosts)} host(s)",
                                "topology=hostfile topology.hostfile=PATH (the hosts are the file's), or "
                                "topology.nodes=null"))
    if problems:
        return spec, problems
    read = dataclasses.replace(topology, hosts=hosts, hostfile=str(path.resolve()))
    return dataclasses.replace(spec, topology=read), []
