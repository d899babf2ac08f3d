"""What the ssh launch takes back from a host's run folder (runner.launchers.ssh.collect): a host's records add to
this run folder, replace nothing, and stay inside it. Taken back from hosts with a real sshd, whose run folders are
their own: tests/e2e/test_ssh.py, test_a_2_plus_1_digits_job_from_a_machine_that_is_no_host."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from runner.launchers.ssh.collect import unpack
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit


def _tar(files: dict[str, bytes]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    data.seek(0)
    return data


def test_records_from_a_host_add_to_this_run_folder_and_replace_nothing(tmp_path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank00000.log").write_text("mine")
    added = unpack(_tar({"logs/rank00000.log": b"theirs", "logs/rank00002.log": b"host 1's",
                         "logs/rank00002.done": json.dumps({"stopped": False}).encode(), "metrics.jsonl": b"{}\n",
                         "spec.yaml": b"not theirs to give", "../escape": b"x", "logs/../../escape2": b"x"}),
                   RunPaths(tmp_path, "R1"))
    assert sorted(added) == ["logs/rank00002.done", "logs/rank00002.log", "metrics.jsonl"]
    assert (tmp_path / "logs" / "rank00000.log").read_text() == "mine"
    assert not (tmp_path / "spec.yaml").exists() and not (tmp_path.parent / "escape").exists()
