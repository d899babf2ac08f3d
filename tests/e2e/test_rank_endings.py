"""Every rank ends, whatever its script leaves behind (docs/faults.md, Rank endings; runner.worker.rank_life): ordinary DDP
scripts of several shapes run many times at 1x2 and 1x3, each run required to end with the script's status; a rank
stuck at its end (its main thread joins a thread that waits for the GIL it holds, as ~ProcessGroupGloo leaves one) is
said to be so, ended, and the job's result stands; a stall no rank's watch can see is ended by the host agent; where
the ranks are names a stuck rank; a rank that leaves early is named as that."""

from __future__ import annotations

import json
import re
import shutil
import signal

import pytest

from runner.worker.rank_life import QUIET_S
from runs import QUIT_SAID, TESTS, nothing_left, run, run_folder, running, wait_until

SCRIPTS = TESTS / "scripts"
SHAPES = ("sgd", "adam_kept", "loader", "compiled", "dynamo_first")
# the one shape that hangs at its end under torchrun too (torch's race; it imports torch._dynamo first): the end guard
# ends it; the others must end by themselves, as fresh processes do
GUARDED = "dynamo_first"


def _sweep(shapes: tuple[str, ...], reps: int) -> str:
    """The jobs of a sweep: each shape ``reps`` times (the script's arguments are all that differ)."""
    return "recipe.args=" + ",".join(f"['--shape={s}','--rep={r}']" for s in shapes for r in range(reps))


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("topology, reps", [("1x2", 3), ("1x3", 2)])  # 25 runs of the 5 shapes in all
def test_ordinary_ddp_scripts_end_every_time_with_their_status(tmp_path, topology, reps):
    """Optimizer made in main() and freed when it returns, with and without destroy_process_group(), a DataLoader
    with workers, torch.compile, Adam and SGD: one sweep runs every shape ``reps`` times; every run ends, done."""
    shutil.copy(SCRIPTS / "ending_shapes.py", tmp_path)
    with running("-m", f"topology={topology}", "recipe=script", "recipe.path=ending_shapes.py", _sweep(SHAPES, reps),
                 cwd=tmp_path, workloads=False) as proc:
        done = proc.wait(1100)
        run_id = proc.run_id
    jobs = {}
    for found in tmp_path.glob("outputs/multirun/*/*/*/run_summary.json"):
        spec = (found.parent / "spec.yaml").read_text()
        shape = re.search(r"--shape=(\w+)", spec)[1]
        jobs.setdefault(shape, []).append(json.loads(found.read_text()))
    assert sorted(jobs) == sorted(SHAPES) and all(len(j) == reps for j in jobs.values()), done.output
    not_done = {shape: [s["status_text"] for s in summaries if s["status"] != "done"] for shape, summaries in jobs.items()}
    assert done.code == 0 and not any(not_done.values()), (not_done, done.stderr[-3000:])
    ended = {shape: sum(bool(s["ended_by_agent"]) for s in summaries) for shape, summaries in jobs.items()}
    assert all(n == 0 for shape, n in ended.items() if shape != GUARDED), ended  # fresh processes end by themselves
    print(f"{topology}: {len(SHAPES) * reps} runs ended; ended by the end guard: {ended}")
    nothing_left(run_id)


def _stuck(tmp_path, *overrides: str, script: tuple[str, ...] = ()):
    """tests/scripts/stuck_at_end.py at 1x2 (``script``: its arguments)."""
    shutil.copy(SCRIPTS / "stuck_at_end.py", tmp_path)
    return running("topology=1x2", *overrides, "--", "stuck_at_end.py", *script, cwd=tmp_path, workloads=False)


def test_a_rank_stuck_at_its_end_is_said_to_be_so_ended_and_the_jobs_result_stands(tmp_path):
    with _stuck(tmp_path) as proc:
        done = proc.wait(QUIET_S + 60)
        run_id = proc.run_id
    assert done.code == 0, done.output
    said = ("rank 1 destroyed its process group at \\d+\\.\\d s and did not end \\(stuck in ProcessGroupGloo's "
            "destructor: its main thread waits for its thread pt_gloo_runloop to end, which waits on a lock; its main "
            "thread used no CPU time for \\d+ s, and its watch could not run: the GIL is held\\); ended it")
    assert re.search(said + r" \(its stacks: .*/logs/rank00001\.log\)", done.stderr), done.stderr
    folder = run_folder(tmp_path)
    summary = json.loads((folder / "run_summary.json").read_text())
    assert summary["status_text"] == ("done: every rank finished its work; 1 did not end by itself and was ended by "
                                      "its host agent (exit 0)")
    assert len(summary["ended_by_agent"]) == 1 and re.fullmatch(said, summary["ended_by_agent"][0])
    assert "  ended     rank 1 destroyed its process group" in done.stdout + done.stderr
    log = (folder / "logs" / "rank00001.log").read_text()
    assert "Current thread" in log and "stuck_at_end.py" in log  # its stacks, written without the GIL
    nothing_left(run_id)


def test_a_stall_that_no_ranks_watch_can_see_is_ended_by_the_host_agent(tmp_path):
    """Both ranks stuck in native code holding the GIL mid-training: no watch runs, so rank 0's cannot end the stall;
    the host agent does, launcher.stall_timeout_s and its margin after the last progress, and says where they are."""
    with _stuck(tmp_path, "launcher.stall_timeout_s=2", script=("--ranks", "0,1", "--when", "in-training")) as proc:
        done = proc.wait(90)
        run_id = proc.run_id
    assert done.code == 1, done.output
    stuck = ("rank {r} cannot answer: its watch has not run for \\d+ s \\(the GIL is held\\); stuck in "
             "ProcessGroupGloo's destructor: its main thread waits for its thread pt_gloo_runloop to end, which waits "
             "on a lock")
    said = (r"stall: no rank completed a collective or a progress step for \d+ s \(launcher\.stall_timeout_s=2; seen "
            r"by the host agent: rank 0's watch could not say it\): " + stuck.format(r=0) + "; " + stuck.format(r=1))
    assert re.search(said, done.stderr), done.stderr
    summary = json.loads((run_folder(tmp_path) / "run_summary.json").read_text())
    assert re.fullmatch(said, summary["hang"]["text"])
    assert summary["status_text"].startswith("failed (exit 1): stall: no rank completed a collective")
    nothing_left(run_id)


def test_where_the_ranks_are_names_a_rank_that_cannot_answer(tmp_path):
    """Ctrl-\\ while rank 1 is stuck holding the GIL and rank 0 waits for it in a collective: rank 0 answers, rank 1's
    agent answers for it."""
    with _stuck(tmp_path, "launcher.grace_s=2", script=("--ranks", "1", "--when", "in-training")) as proc:
        wait_until(lambda: (tmp_path / "1.ready").exists(), 60, "rank 1 about to be stuck", alive=[proc])
        wait_until(lambda: "waits for its thread" in _asked(proc), 60, "an answer for rank 1", alive=[proc])
        said = proc.stderr
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        run_id = proc.run_id
    assert re.search(r"where the ranks are: rank 0 waits in all_reduce #2 \(process group 0\) since \d+\.\d s "
                     r"\(Float\[1\]\); rank 1 cannot answer: its watch has not run for \d+ s \(the GIL is held\); stuck "
                     r"in ProcessGroupGloo's destructor: its main thread waits for its thread pt_gloo_runloop to end, "
                     r"which waits on a lock", said), said
    nothing_left(run_id)


def _asked(proc) -> str:
    """Ask `run` where the ranks are (SIGQUIT), and what it said so far."""
    before = proc.stderr.count(QUIT_SAID)
    proc.send_signal(signal.SIGQUIT)
    wait_until(lambda: proc.stderr.count(QUIT_SAID) > before, 30, "run's answer to SIGQUIT", alive=[proc])
    return proc.stderr.rsplit("where the ranks are:", 1)[-1]


def test_a_rank_that_leaves_early_is_named_and_the_summary_says_the_same(tmp_path):
    """Rank 0 returns after 5 steps while ranks 1 and 2 go on: they fail on its closed connection, and the report names
    rank 0 as the rank that left, not the first that lost it; the summary's status line says the same."""
    shutil.copy(SCRIPTS / "uneven_end.py", tmp_path)
    done = run("topology=1x3", "--", "uneven_end.py", cwd=tmp_path, workloads=False, timeout=120)
    assert done.code == 1, done.output
    said = (r"rank 0 \(host node0\) left at \d+\.\d s while the others were still running: its process ended with "
            r"status 0, and rank\(s\) 1, 2 then failed on its closed connection")
    assert re.search("== job failed ==\n" + said, done.stderr), done.stderr
    summary = json.loads((run_folder(tmp_path) / "run_summary.json").read_text())
    assert re.fullmatch(f"failed \\(exit 1\\): {said}", summary["status_text"]), summary["status_text"]
    assert summary["first_failure"]["rank"] == 0 and summary["hang"] is None


def test_an_error_whose_message_begins_with_newlines_is_said_by_its_first_words(tmp_path):
    (tmp_path / "newline.py").write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    raise RuntimeError('\\n\\nthe-real-message: rank 1 could not go on\\nmore detail')\n"
        "dist.barrier()\n")
    done = run("topology=1x2", "--", "newline.py", cwd=tmp_path, workloads=False, timeout=120)
    assert done.code == 1, done.output
    status = json.loads((run_folder(tmp_path) / "run_summary.json").read_text())["status_text"]
    assert status.startswith("failed (exit 1): rank 1 on host node0 raised RuntimeError: the-real-message: rank 1 "
                             "could not go on"), status
