"""Hangs explained (runner.worker.watch, runner.records.watch_files, runner.reports.hangs): which collective each
rank is in and which rank never entered it, at a collective's timeout, at a stall, on Ctrl-\\ (SIGQUIT); a mismatch
of collectives; the slow rank named; every rank's output on the terminal when asked (log.console). Real ranks, real
gloo groups; locally, across namespace hosts and on the Slurm test cluster."""

from __future__ import annotations

import json
import re
import shutil
import signal
import uuid

import pytest

from runs import (QUIT_SAID, TESTS, bed_hosts, mpi_options, nothing_left, on_each_host, run, run_folder, running,
                  wait_until)

pytestmark = pytest.mark.timeout(240)


def hang(*extra: str) -> list[str]:
    """Rank 1 stops before its 4th all-reduce (workloads/hang.py:16 is its time.sleep)."""
    return ["recipe=custom", "recipe.target=workloads.hang:main", "+recipe.hang_rank=1", "+recipe.hang_step=3", *extra]


def summary(folder) -> dict:
    return json.loads((folder / "run_summary.json").read_text())


SINCE = r"since \d+\.\d s"


def test_a_rank_that_never_enters_a_collective_is_named_at_the_timeout(tmp_path):
    done = run("topology=1x3", *hang(), "recipe.global_batch_size=3", "init.timeout_s=6", cwd=tmp_path)
    assert done.code == 1, done.output
    said = (r"timeout: a collective waited init\.timeout_s=6 s: ranks 0,2 wait in all_reduce #4 \(process group 0\) "
            + SINCE + r" \(Float\[1\]\); rank 1 never entered it: its last collective was all_reduce #3, and it is at "
            r"workloads/hang\.py:16 in main")
    assert re.search(said, done.stderr), done.stderr
    hang_facts = summary(run_folder(tmp_path))["hang"]
    assert (hang_facts["kind"], hang_facts["collective"], hang_facts["waiting"], hang_facts["absent"]) == \
        ("timeout", 4, [0, 2], [1])
    nothing_left(done.run_id)


def test_a_real_gloo_timeout_is_recorded_as_one_by_the_rank(tmp_path):
    done = run("topology=1x2", *hang(), "recipe.global_batch_size=2", "init.timeout_s=2", cwd=tmp_path)
    assert done.code == 1, done.output
    error = json.loads((run_folder(tmp_path) / "logs" / "rank00000.error.json").read_text())
    assert re.fullmatch(r"RuntimeError: \[\S+/gloo/transport/tcp/unbound_buffer\.cc:\d+\] Timed out waiting 2000ms for "
                        r"recv operation to complete", error["exception"]), error["exception"]
    assert error["timeout"] is True
    assert re.search(r"timeout: a collective waited init\.timeout_s=2 s: rank 0 waits in all_reduce #4 \(process group "
                     r"0\) " + SINCE, done.stderr), done.stderr


def test_a_recipes_own_error_that_mentions_a_timeout_is_not_a_hang(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=1x2", "recipe=custom", "recipe.target=workloads.failing:main", f"+recipe.out_dir={art}",
               "+recipe.fail_rank=0", "+recipe.fail_step=3", "+recipe.message='timeout_s must be > 0'",
               "recipe.global_batch_size=2", cwd=tmp_path)
    assert done.code == 1, done.output
    assert "ValueError: timeout_s must be > 0 (its traceback is above" in done.stderr
    assert "timeout:" not in done.stderr and "  hang " not in done.stderr, done.stderr
    logs = run_folder(tmp_path) / "logs"
    assert json.loads((logs / "rank00000.error.json").read_text())["timeout"] is False
    assert not (logs / "diagnose.request").exists() and not (logs / "diagnosis.json").exists()  # no rank asked
    assert "Current thread" not in (logs / "rank00001.log").read_text()  # no stack asked of the other rank
    assert summary(run_folder(tmp_path))["hang"] is None


def test_a_script_that_makes_its_own_group_and_hangs_is_explained_the_same_way(tmp_path):
    shutil.copy(TESTS / "scripts" / "hang_script.py", tmp_path)
    done = run("topology=1x3", "init.timeout_s=6", "--", "hang_script.py", "--hang-rank", "1", cwd=tmp_path)
    assert done.code == 1, done.output
    said = (r"ranks 0,2 wait in all_reduce #4 \(process group 0\) " + SINCE + r" \(Float\[1\]\); rank 1 never entered "
            r"it: its last collective was all_reduce #3, and it is at hang_script\.py:17 in <module>")
    assert re.search(said, done.stderr), done.stderr
    nothing_left(done.run_id)


def test_ranks_that_enter_different_collectives_are_told_apart(tmp_path):
    shutil.copy(TESTS / "scripts" / "mismatch_script.py", tmp_path)
    done = run("topology=1x3", "init.timeout_s=5", "--", "mismatch_script.py", cwd=tmp_path)
    assert done.code == 1, done.output
    assert ("rank 1 entered broadcast #6 (Float[4]) while ranks 0,2 entered all_reduce #6 (Float[2, 3]) "
            "(process group 0)") in done.stderr
    assert summary(run_folder(tmp_path))["hang"]["mismatched"] == {"broadcast": [1], "all_reduce": [0, 2]}


def test_a_stall_ends_the_job_long_before_the_collective_timeout(tmp_path):
    done = run("topology=1x3", *hang(), "recipe.global_batch_size=3", "init.timeout_s=300",
               "launcher.stall_timeout_s=4", cwd=tmp_path)
    assert done.code == 1, done.output
    said = (r"StallError: stall: no rank completed a collective or a progress step for \d+ s "
            r"\(launcher\.stall_timeout_s=4\): ranks 0,2 wait in all_reduce #4 \(process group 0\) " + SINCE +
            r" \(Float\[1\]\); rank 1 never entered it: its last collective was all_reduce #3, and it is at "
            r"workloads/hang\.py:16 in main")
    assert re.search(said, done.stderr), done.stderr
    # ended by the stall, not init.timeout_s=300: no collective timed out, and no rank's error says one did
    assert summary(run_folder(tmp_path))["hang"]["kind"] == "stall" and "timeout:" not in done.stderr
    errors = [json.loads(p.read_text()) for p in (run_folder(tmp_path) / "logs").glob("rank*.error.json")]
    assert not any(e["timeout"] for e in errors), errors
    nothing_left(done.run_id)


def test_ctrl_backslash_says_where_the_ranks_are_and_the_job_goes_on(tmp_path):
    run_id = f"q{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    with running("topology=1x3", *hang(f"+recipe.marker={marker}"), "recipe.global_batch_size=3",
                 "init.timeout_s=300", run_id=run_id, cwd=tmp_path) as proc:
        wait_until(marker.exists, 60, "rank 1 stuck", alive=[proc])
        proc.send_signal(signal.SIGQUIT)
        wait_until(lambda: proc.said(QUIT_SAID + "the job goes on)"), 30, "told where the ranks are", alive=[proc])
        proc.send_signal(signal.SIGTERM)
        done = proc.wait(60)
    err = done.stderr
    assert re.search(r"where the ranks are: ranks 0,2 wait in all_reduce #4 \(process group 0\) " + SINCE +
                     r" \(Float\[1\]\); rank 1 never entered it: .* at workloads/hang\.py:16 in main", err), err
    assert done.code == 143, done.output
    nothing_left(run_id)


def test_the_slow_rank_is_named_in_the_summary(tmp_path):
    """Rank 2 sleeps 0.03 s more before each of 60 all-reduces (1.8 s in all): it is the one named, and the others'
    wait is one the runner counts (1 s or more: runner.reports.hangs.straggler). How long they waited beyond that
    depends on the machine's load: test_no_rank_is_named_when_none_is_slow is the control."""
    done = run("topology=1x4", "recipe=custom", "recipe.target=workloads.slow:main", "+recipe.steps=60",
               "+recipe.slow_rank=2", "+recipe.extra_s=0.03", "recipe.global_batch_size=4", cwd=tmp_path)
    assert done.code == 0, done.output
    line = next(line for line in done.stderr.splitlines() if line.startswith("  slowest"))
    found = re.fullmatch(r"  slowest   rank 2 on node0: (\d+\.\d\d)x the median step time; the others waited "
                         r"(\d+\.\d) s for it over the last (\d+) collectives", line)
    assert found, line
    assert float(found.group(1)) >= 1.5 and float(found.group(2)) >= 1.0 and int(found.group(3)) >= 30
    assert summary(run_folder(tmp_path))["straggler"].startswith("rank 2 on node0:")


def test_no_rank_is_named_when_none_is_slow(tmp_path):
    done = run("topology=1x4", "recipe=custom", "recipe.target=workloads.slow:main", "+recipe.steps=60",
               "+recipe.slow_rank=-1", "+recipe.extra_s=0", "recipe.global_batch_size=4", cwd=tmp_path)
    assert done.code == 0, done.output
    assert "slowest" not in done.stderr and summary(run_folder(tmp_path))["straggler"] is None


def _prefixed(stdout: str) -> dict[int, list[str]]:
    """The terminal's lines by the rank that printed them; every rank line is whole and prefixed."""
    by_rank: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = re.match(r"\[rank (\d+) (\S+)\] (.*)$", line)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(3))
        else:
            assert "progress:" not in line and not line.startswith("[rank"), line  # no line cut or merged
    return by_rank


def test_every_ranks_output_on_the_terminal_line_by_line(tmp_path):
    done = run("topology=1x3", "log.console=all", "recipe.epochs=2", "recipe.global_batch_size=63", cwd=tmp_path)
    assert done.code == 0, done.output
    by_rank = _prefixed(done.stdout)
    assert sorted(by_rank) == [0, 1, 2]
    for r in (0, 1, 2):
        assert any(line.startswith("progress: train step 42/42") for line in by_rank[r]), by_rank[r]
        log = (run_folder(tmp_path) / "logs" / f"rank{r:05d}.log").read_text()
        assert "progress: train step 42/42" in log  # the logs stay complete, without prefixes
    assert "final test accuracy" in " ".join(by_rank[0])


def test_chosen_ranks_on_the_terminal(tmp_path):
    done = run("topology=1x4", "log.console='1,3'", "recipe.epochs=1", cwd=tmp_path)
    assert done.code == 0, done.output
    assert sorted(_prefixed(done.stdout)) == [1, 3]
    assert "progress: train step 21/21" in (run_folder(tmp_path) / "logs" / "rank00000.log").read_text()


def test_console_across_namespace_hosts(testbed, tmp_path):
    run_id = f"c{uuid.uuid4().hex[:8]}"
    args = [*bed_hosts(testbed, [2, 1]), "launcher=manual", "log.console=all", "recipe.epochs=1",
            "recipe.global_batch_size=63"]
    results = on_each_host(testbed, tmp_path, args, run_id)
    assert [code for code, _ in results] == [0, 0], results
    names = [h.name for h in testbed.hosts]
    host0 = {int(m.group(1)) for m in re.finditer(rf"^\[rank (\d) {names[0]}\] ", results[0][1], re.M)}
    host1 = {int(m.group(1)) for m in re.finditer(rf"^\[rank (\d) {names[1]}\] ", results[1][1], re.M)}
    assert (host0, host1) == ({0, 1}, {2})  # each host's terminal shows its own ranks, named by host
    nothing_left(run_id)


def test_a_stall_across_slurm_nodes_names_the_rank_on_the_other_node(testbed, tmp_path):
    done = run("topology=2x2", "launcher=slurm", f"launcher.slurm.partition={testbed.partition}", "recipe=custom",
               "recipe.target=workloads.hang:main", "+recipe.hang_rank=3", "+recipe.hang_step=3",
               "recipe.global_batch_size=4", "init.timeout_s=300", "launcher.stall_timeout_s=5", cwd=tmp_path,
               env=testbed.env(), timeout=200)
    assert done.code == 1, done.output
    facts = summary(run_folder(tmp_path))["hang"]
    assert (facts["kind"], facts["collective"], facts["waiting"], facts["absent"]) == ("stall", 4, [0, 1, 2], [3])
    assert "rank 3 never entered it: its last collective was all_reduce #3, and it is at workloads/hang.py:16 in main" \
        in facts["text"]


def test_console_in_slurms_output_and_through_mpirun(testbed, tmp_path):
    """Each task's chosen ranks reach Slurm's output file, which `run` shows as it follows the job, and mpirun's
    output, prefixed with their rank and node."""
    done = run("topology=2x1", "launcher=slurm", f"launcher.slurm.partition={testbed.partition}", "log.console=all",
               "recipe.epochs=1", "recipe.global_batch_size=64", cwd=tmp_path, env=testbed.env(), timeout=200)
    assert done.code == 0, done.output
    by_rank = _prefixed(done.stdout)
    assert sorted(by_rank) == [0, 1] and any("progress: train step 21/21" in line for line in by_rank[1])
    names = [h.name for h in testbed.hosts]
    done = run(*bed_hosts(testbed, [1, 1]), *mpi_options(testbed), "launcher.tasks=per_device", "log.console=all",
               "recipe.epochs=1", "recipe.global_batch_size=64", cwd=tmp_path, env=testbed.env(), timeout=200)
    assert done.code == 0, done.output
    assert re.search(rf"^\[rank 1 {names[1]}\] progress: train step 21/21", done.stdout, re.M), done.stdout


def test_a_stop_that_the_ranks_cannot_honour_says_where_they_were(tmp_path):
    """SIGTERM asks the ranks to checkpoint and stop; ranks stuck in a collective cannot: after
    launcher.grace_s the runner says where they are, then stops them."""
    run_id = f"t{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    with running("topology=1x3", *hang(f"+recipe.marker={marker}"), "recipe.global_batch_size=3",
                 "init.timeout_s=300", "launcher.grace_s=2", run_id=run_id, cwd=tmp_path) as proc:
        wait_until(marker.exists, 60, "rank 1 stuck", alive=[proc])
        proc.send_signal(signal.SIGTERM)
        done = proc.wait(60)
    err = done.stderr
    assert done.code == 143, err
    assert re.search(r"SIGTERM: rank\(s\) 0, 1, 2 still running launcher.grace_s=2 s after it; killing them: ranks "
                     r"0,2 wait in all_reduce #4 \(process group 0\) " + SINCE + r" \(Float\[1\]\); rank 1 never entered it: .* at workloads/hang\.py:16 "
                     r"in main", err), err
    nothing_left(run_id)
