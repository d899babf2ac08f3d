"""runner.environments.slurm.expand_hostnames: Slurm's host lists expanded in this process, as Slurm's own
``scontrol show hostnames`` expands them (compared with it where it is installed: no cluster needed, only a
slurm.conf it can read)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runner.environments.slurm import SlurmEnvironment, expand_hostnames

# what scontrol show hostnames (Slurm 23/24) answers for each
CASES = [
    ("node[01-04,07]", "node01 node02 node03 node04 node07"),
    ("a[1-2]-b[3-4]", "a1-b3 a1-b4 a2-b3 a2-b4"),  # several brackets: every combination, the first slowest
    ("n[1-2][3-4]", "n13 n14 n23 n24"),
    ("n[8-10]", "n8 n9 n10"),
    ("n[009-011]", "n009 n010 n011"),  # padded as wide as the range's first number
    ("n[01-2]", "n01 n02"),
    ("n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10"),
    ("n[998-1000]", "n998 n999 n1000"),
    ("a,b[1-2],c", "a b1 b2 c"),
    ("n[3,1]", "n3 n1"),  # in the order given,
    ("n[1,1]", "n1 n1"),  # duplicates kept
    ("n[1-3],n[2-4]", "n1 n2 n3 n2 n3 n4"),
    ("n1,,n2", "n1 n2"),
    (",n1", "n1"),
    ("a b", "a b"),
    ("gpu-node-[1-2]", "gpu-node-1 gpu-node-2"),
    ("[1-2]", "1 2"),
    ("node7", "node7"),
    ("", ""),
]
INVALID = ["x[1-3]y", "n[1-2]-b", "n[10-8]", "n[a-b]", "n[]", "n[1-2]]", "n[1-2", "a[1-2],b[3]-c", "n[[1]]"]


@pytest.mark.unit
@pytest.mark.parametrize("nodelist, names", CASES)
def test_host_lists(nodelist, names) -> None:
    assert expand_hostnames(nodelist) == names.split()


@pytest.mark.unit
@pytest.mark.parametrize("nodelist", INVALID)
def test_what_slurm_calls_an_invalid_host_list(nodelist) -> None:
    with pytest.raises(ValueError, match=re.escape(f"host list {nodelist!r}")):
        expand_hostnames(nodelist)


@pytest.mark.unit
def test_the_environment_reads_its_nodes_without_scontrol(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol to call
    slurm = SlurmEnvironment.read({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "gpu-node[01-02]"})
    assert slurm.hostnames() == ["gpu-node01", "gpu-node02"] and slurm.first_host() == "gpu-node01"
    with pytest.raises(ValueError, match="SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST names a node"):
        SlurmEnvironment.read({"SLURM_JOB_ID": "7"}).first_host()


# ------------------------------------------------------------------------------------------ against Slurm itself


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """``scontrol show hostnames``, with a slurm.conf of its own (it reads one before it answers)."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (scripts/system_packages.sh installs it)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")

    def expand(nodelist: str) -> list[str] | None:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], env={"SLURM_CONF": str(conf)},
                              capture_output=True, text=True, timeout=30)
        return done.stdout.split() or None  # "Invalid hostlist" on stderr, with exit status 0

    return expand


def test_the_cases_are_what_scontrol_says(scontrol) -> None:
    assert [scontrol(n) for n, _ in CASES if n] == [names.split() for n, names in CASES if n]
    assert [scontrol(n) for n in INVALID if n != "n[1-2"] == [None] * (len(INVALID) - 1)  # (scontrol: "n]")


_number = st.integers(0, 120)
_range = st.tuples(_number, st.integers(0, 5), st.integers(0, 3)).map(
    lambda t: f"{t[0]:0{t[2]}d}" + (f"-{t[0] + t[1]:0{t[2]}d}" if t[1] else ""))
_bracket = st.lists(_range, min_size=1, max_size=3).map(lambda rs: "[" + ",".join(rs) + "]")
_text = st.text("abcxyz-", min_size=0, max_size=4)
_expression = st.one_of(
    st.text("abcxyz0123456789-", min_size=1, max_size=6),
    st.lists(st.tuples(_text, _bracket), min_size=1, max_size=2).map(lambda ps: "".join(t + b for t, b in ps)))


@settings(max_examples=60, deadline=None)
@given(st.lists(_expression, min_size=1, max_size=4))
def test_random_host_lists_expand_as_scontrol_expands_them(scontrol, expressions) -> None:
    nodelist = ",".join(expressions)
    assume(not nodelist.startswith("-"))  # scontrol would take it for an option
    assert expand_hostnames(nodelist) == scontrol(nodelist), nodelist
