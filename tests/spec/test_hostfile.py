"""topology.hostfile (runner.spec.hostfile): DeepSpeed's and Open MPI's hostfiles read into topology.hosts, bad lines
refused with file:line, and the composed spec of `run topology=hostfile topology.hostfile=PATH` valid with the file's
hosts. A launcher=ssh job started from a hostfile on the test bed: tests/e2e/test_ssh.py."""

from __future__ import annotations

import pytest

from conftest import compose, validate
from runner.spec.hostfile import parse_hostfile, with_hostfile

pytestmark = pytest.mark.unit

DEEPSPEED = """\
# DeepSpeed's form
worker-1 slots=4
worker-2 slots=4
"""
OPEN_MPI = """\
node01 slots=2 max_slots=4   # Open MPI's form
node02 slots=2 max-slots=2

node03.cluster.example slots=1
"""


def test_deepspeeds_and_open_mpis_hostfiles_give_their_hosts_and_slots() -> None:
    hosts, problems = parse_hostfile(DEEPSPEED, "hostfile", None)
    assert not problems and [(h.name, h.devices) for h in hosts] == [("worker-1", 4), ("worker-2", 4)]
    hosts, problems = parse_hostfile(OPEN_MPI, "hosts.txt", None)
    assert not problems
    assert [(h.name, h.devices) for h in hosts] == [("node01", 2), ("node02", 2), ("node03.cluster.example", 1)]


def test_a_host_without_slots_takes_devices_per_node_where_it_is_set_and_is_refused_where_not() -> None:
    hosts, problems = parse_hostfile("a\nb slots=3\n", "h", 2)
    assert not problems and [(h.name, h.devices) for h in hosts] == [("a", 2), ("b", 3)]
    _, problems = parse_hostfile("a\nb slots=3\n", "h", None)
    assert [p.message for p in problems] == ["h:1: 'a' gives no slots=N: how many processes does it run?"]


@pytest.mark.parametrize("text, said", [
    ("a slots=2\nb slots=zero\n", "hosts.txt:2: 'slots=zero': slots must be a whole number of at least 1"),
    ("a slots=0\n", "hosts.txt:1: 'slots=0': slots must be a whole number of at least 1"),
    ("a slots=2\n\n# c\na slots=1\n", "hosts.txt:4: 'a' is listed twice (also line 1)"),
    ("a cpus=2\n", "hosts.txt:1: 'cpus=2' is not slots=N or max_slots=N"),
    ("a slots\n", "hosts.txt:1: 'slots' is not slots=N or max_slots=N"),
    ("a slots=4 max_slots=2\n", "hosts.txt:1: 'a' has slots=4 but max_slots=2"),
    ("a;rm slots=1\n", "hosts.txt:1: 'a;rm' is not a host name or address"),
    ("# nothing\n\n", "hosts.txt lists no host"),
], ids=["not-a-number", "zero", "twice", "unknown-key", "no-value", "over-max", "shell", "empty"])
def test_a_bad_line_is_refused_with_file_and_line(text, said) -> None:
    _, problems = parse_hostfile(text, "hosts.txt", None)
    assert [(p.key, p.message) for p in problems] == [("topology.hostfile", said)]
    assert all(p.hint for p in problems)


def test_run_topology_hostfile_reads_the_file_relative_to_the_folder_run_starts_in(tmp_path) -> None:
    (tmp_path / "hosts.txt").write_text("box-a slots=2\nbox-b slots=1\n")
    spec, problems = with_hostfile(compose("topology=hostfile", "topology.hostfile=hosts.txt", "launcher=ssh",
                                           "device=cpu", "recipe.global_batch_size=60"), str(tmp_path))
    assert not problems
    assert spec.topology.hostfile == str(tmp_path / "hosts.txt")  # kept, absolute, as the record of where they came from
    got = validate(spec)
    assert got.valid, got.rendered()
    assert [(h.name, h.devices) for h in got.job.hosts] == [("box-a", 2), ("box-b", 1)]


def test_a_hostfile_beside_a_host_list_a_grids_node_count_or_a_missing_file_is_refused(tmp_path) -> None:
    (tmp_path / "hosts.txt").write_text("box-a slots=2\nbox-b slots=2\n")
    _, problems = with_hostfile(compose("topology.hostfile=hosts.txt"), str(tmp_path))  # the default grid: 1 host
    assert [(p.key, p.message) for p in problems] == [("topology.nodes", "is 1 but hosts.txt lists 2 host(s)")]
    assert "topology=hostfile" in problems[0].hint
    _, problems = with_hostfile(compose("topology=custom", "topology.hosts=[{name: a, devices: 1}]",
                                        "topology.hostfile=hosts.txt"), str(tmp_path))
    assert [p.message for p in problems] == ["and topology.hosts both list the hosts"]
    _, problems = with_hostfile(compose("topology=hostfile", "topology.hostfile=nope.txt"), str(tmp_path))
    assert problems[0].message.startswith("'nope.txt' cannot be read (No such file or directory; looked at ")
    spec = compose("topology=1x2")
    assert with_hostfile(spec, str(tmp_path)) == (spec, [])
