"""launcher=ssh without any host: the commands it runs (the golden files, parsed back: what reaches each host's shell
is exactly the words meant, whatever a value holds), the ssh options, where each host keeps the run, what it says
over stdin, how a failed check reads, and what it takes back from a host's run folder."""

from __future__ import annotations

import io
import json
import shlex
import signal
import tarfile
from pathlib import Path

import pytest

from conftest import GOLDEN, compose, environment, hosts_override, validate
from runner.environments.versions import Versions, installed
from runner.launchers import Invocation
from runner.launchers import plan_for
from runner.launchers.ssh import SshLauncher, ssh_base
from runner.launchers.ssh_check import verdict
from runner.launchers.ssh_collect import unpack
from runner.launchers.ssh_protocol import ProtocolError, end_message, parse, read_spec, signal_message, spec_message
from runner.records.paths import RunPaths
from runner.spec.document import load_spec_text, spec_yaml
from runner.spec.pins import pinned
from runner.spec.schema import SshOptions

pytestmark = pytest.mark.unit

AB = hosts_override({"name": "a", "devices": 2}, {"name": "b", "devices": 1})


def _lines(name: str, note: str) -> list[list[str]]:
    """The commands of a golden file that follow a comment containing ``note``, as argv lists."""
    lines = (GOLDEN / f"{name}.txt").read_text().splitlines()
    return [shlex.split(lines[i + 1]) for i, line in enumerate(lines) if line.startswith("#") and note in line]


def test_each_host_gets_exactly_the_words_meant_whatever_a_value_holds() -> None:
    """ssh joins its arguments into one line for the host's shell: the remote command is quoted once for it, so a
    workdir with a space and exported values with $( ), ; and quotes arrive as the words they were."""
    starts = _lines("ssh_options", "process(es)")
    assert len(starts) == 2
    for i, argv in enumerate(starts):
        cut = argv.index("--")
        assert argv[:2] == ["/usr/bin/ssh", "-T"] and argv[cut + 1] == ("gpu-a", "gpu-b")[i]
        assert len(argv) == cut + 3  # one remote command, one word
        remote = shlex.split(argv[-1])
        assert remote == ["cd", "/work/my proj", "&&", "exec", "env", "HF_HOME=/data/hf cache",
                          "WANDB_MODE=$(rm -rf ~); 'offline'", "/opt/venv/bin/run", "--ssh-host", str(i), "/runs/R1"]
    checks = _lines("ssh_options", "the check")
    assert [shlex.split(c[-1]) for c in checks] == [["cd", "/work/my proj", "&&", "exec", "/opt/venv/bin/run",
                                                    "--version"]] * 2
    collects = _lines("ssh_options", "after the run")
    assert shlex.split(collects[0][-1]) == ["cd", "/runs/R1", "&&", "exec", "tar", "-cf", "-", "--ignore-failed-read",
                                            "logs", "metrics.jsonl"]


def test_ssh_options_default_to_batch_mode_a_timeout_and_keepalives_and_your_own_config() -> None:
    assert ssh_base(SshOptions()) == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                                      "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]  # no -F: ~/.ssh/config
    options = _lines("ssh_options", "process(es)")[0]
    assert options[:options.index("--")] == [
        "/usr/bin/ssh", "-T", "-F", "/home/alice/.ssh/cluster_config", "-l", "alice", "-p", "2222", "-i",
        "/home/alice/.ssh/id_ed25519", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ProxyJump=bastion",
        "-o", "StrictHostKeyChecking=accept-new"]  # keepalive_s=0: none


def _launcher(tmp_path: Path, *overrides: str, cwd: str = "/work/proj", root: Path | None = None, **env: str):
    got = validate(compose("launcher=ssh", "device=cpu", "recipe.global_batch_size=60", *AB, *overrides))
    assert got.valid, got.rendered()
    paths = RunPaths(root or tmp_path / "outputs" / "runs" / "R1", "R1")
    job = pinned(got.job, SshLauncher.pins(got.job, paths))
    return SshLauncher(plan=plan_for(job, paths), paths=paths,
                       invocation=Invocation(python="/venv/bin/python", cwd=cwd, run_command="/venv/bin/run"),
                       environment=environment().with_exported(SshLauncher.exported_names(job.spec), env))


def test_each_host_keeps_the_run_at_its_path_under_the_jobs_folder(tmp_path) -> None:
    """The hosts start in the job's folder: a run folder under the folder `run` started in is at the same place
    under the job's folder there; another (hydra.run.dir elsewhere) at the same path."""
    here = _launcher(tmp_path, cwd=str(tmp_path), root=tmp_path / "outputs" / "runs" / "R1")
    assert here.remote_folder() == str(tmp_path / "outputs" / "runs" / "R1")  # workdir unset: this folder
    named = _launcher(tmp_path, "workdir=/tmp", cwd=str(tmp_path), root=tmp_path / "outputs" / "runs" / "R1")
    assert named.remote_folder() == "/tmp/outputs/runs/R1"
    apart = _launcher(tmp_path, cwd="/elsewhere", root=tmp_path / "runs" / "R1")
    assert apart.remote_folder() == str(tmp_path / "runs" / "R1")


def test_the_hosts_share_one_run_id_and_port_and_every_rank_is_placed(tmp_path) -> None:
    launcher = _launcher(tmp_path)
    hosts = launcher.hosts()
    assert [(h.index, h.name, h.destination, h.ranks) for h in hosts] == [(0, "a", "a", (0, 1)), (1, "b", "b", (2,))]
    assert launcher.plan.job.spec.run_id == "R1" and launcher.plan.job.spec.init.master_port  # pinned for every host
    assert "exec /venv/bin/run --ssh-host 1 " in hosts[1].start[-1]


def test_unset_exported_variables_are_left_out(tmp_path) -> None:
    launcher = _launcher(tmp_path, "launcher.ssh.export=[HF_HOME,UNSET_HERE]", HF_HOME="/data/hf")
    assert shlex.split(launcher.hosts()[0].start[-1])[4:6] == ["env", "HF_HOME=/data/hf"]


# ------------------------------------------------------------------------------------------- what goes over stdin


def test_the_spec_goes_over_stdin_and_comes_back_equal_then_the_messages(tmp_path) -> None:
    spec = _launcher(tmp_path, "+recipe.note='héllo 🙂'").plan.job.spec
    stream = io.BytesIO(spec_message(spec_yaml(spec)) + signal_message(signal.SIGINT)
                        + end_message("b", "lost: ssh exited 255"))
    assert load_spec_text(read_spec(stream)) == spec
    assert parse(stream.readline()) == {"signal": signal.SIGINT}
    end = parse(stream.readline())["end"]
    assert (end["rank"], end["host"], end["text"]) == (None, "b", "lost: ssh exited 255")
    assert stream.readline() == b""  # then stdin ends: the host stops as on SIGTERM
    assert parse(b"not json\n") == {} and parse(b"[1]\n") == {}


def test_anything_else_on_stdin_is_refused_with_why() -> None:
    with pytest.raises(ProtocolError, match="spec's length in bytes"):
        read_spec(io.BytesIO(b"defaults: []\n"))
    with pytest.raises(ProtocolError, match="after 3 of the spec's 10 bytes"):
        read_spec(io.BytesIO(b"10\nabc"))


# ------------------------------------------------------------------------------------------- the check's verdicts


def test_a_failed_check_says_why_with_a_hint(tmp_path) -> None:
    here = installed()
    host = _launcher(tmp_path).hosts()[1]
    ok = f"{here.line()}\n"
    assert verdict(host, 0, ok, "", here) is None
    why, hint = verdict(host, 255, "", "root@b: Permission denied (publickey).\n", here)
    assert why == "ssh could not log in (exit 255): root@b: Permission denied (publickey)." and "authorized_keys" in hint
    why, hint = verdict(host, 255, "", "ssh: connect to host b port 22: Connection timed out\n", here)
    assert "does not answer" in hint
    why, hint = verdict(host, 127, "", "bash: line 1: /venv/bin/run: No such file or directory\n", here)
    assert why.startswith("/venv/bin/run is not there or cannot run (exit 127") and "launcher.ssh.run=" in hint
    why, hint = verdict(host, 1, "", "bash: line 1: cd: /work/proj: No such file or directory\n", here)
    assert why.startswith("the job's folder is not there") and "workdir=" in hint
    older = Versions(here.runner, "2.12.0", here.python)
    why, hint = verdict(host, 0, older.line(), "", here)
    assert why == (f"runner {here.runner} and torch 2.12.0 there, runner {here.runner} and torch {here.torch} here")
    assert verdict(host, 0, "Hydra 1.3.2\n", "", here)[0].startswith("/venv/bin/run --version said no versions")


def test_run_version_is_read_back() -> None:
    here = installed()
    assert Versions.parse(here.line()) == here
    assert here.torch.split("+")[0] == __import__("torch").__version__.split("+")[0]


# ------------------------------------------------------------------------------------------- records taken back


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
