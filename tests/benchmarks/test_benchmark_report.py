"""benchmarks/report.py: REPORT.md's tables are rewritten from the result files, and only the tables."""

from __future__ import annotations

import pytest

import json

from conftest import REPO, load_module
from readme_text import docs

pytestmark = pytest.mark.unit

report = load_module("benchmark_report", REPO / "benchmarks" / "report.py")


def test_every_table_block_of_the_report_is_rewritten_from_the_results(tmp_path):
    copy = tmp_path / "REPORT.md"
    copy.write_text("# prose stays\n\n<!-- table:plan -->\nold figures\n<!-- end -->\n\nmore prose\n\n"
                    "<!-- table:throughput -->\n<!-- end -->\n")
    assert report.update(copy) == ["plan", "throughput"]
    text = copy.read_text()
    assert text.startswith("# prose stays\n") and "more prose" in text and "old figures" not in text
    plan = json.loads((REPO / "benchmarks" / "results" / "plan_scale.json").read_text())
    biggest = max(plan["rows"], key=lambda r: r["processes"])
    assert f"| {biggest['form']} | {biggest['hosts']:,} | {biggest['processes']:,} | {biggest['seconds']:.3f} |" in text
    launch = json.loads((REPO / "benchmarks" / "results" / "launch_speed.json").read_text())
    assert f"| 2 | {launch['throughput']['2']['median_steps_per_s']['run']:.1f} |" in text
    assert report.update(copy) == ["plan", "throughput"]  # idempotent: the markers stay


def test_the_committed_report_has_every_table_block():
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    assert [m["name"] for m in report._BLOCK.finditer(text)] == ["machine", "launch", "preload", "pairs", "restarts",
                                                                 "lost_hosts", "throughput", "diagnosis", "plan",
                                                                 "sharding", "checkpoint", "copies", "gpu"]


def test_the_committed_report_quotes_the_preload_results_and_the_zygote_imports_what_they_show_safe():
    """The preload table holds what benchmarks/results/zygote_preload.json holds; the zygote imports no candidate that
    hung a job, and torch._dynamo hung some (the reason it is not imported)."""
    from runner.worker.zygote import PRELOAD

    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    block = text[text.index("<!-- table:preload -->"):]
    assert report.preload() in block[:block.index("<!-- end -->")]
    results = json.loads((REPO / "benchmarks" / "results" / "zygote_preload.json").read_text())["results"]
    preloaded = {m for r in results.values() for m in r["modules"] if m in PRELOAD}
    assert preloaded == set(PRELOAD) - {"torch"}
    assert all(r["hangs"] == 0 for r in results.values() if set(r["modules"]) <= set(PRELOAD))
    assert next(r for r in results.values() if r["modules"] == ["torch._dynamo"])["hangs"] > 0


def test_the_committed_report_quotes_the_paired_torchrun_results():
    """The pairs table holds what benchmarks/results/torchrun_pairs.json holds (no figure the results lack)."""
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    block = text[text.index("<!-- table:pairs -->"):]
    block = block[:block.index("<!-- end -->")]
    assert report.pairs() in block


def test_the_readme_quotes_the_paired_torchrun_results():
    data = json.loads((REPO / "benchmarks" / "results" / "torchrun_pairs.json").read_text())
    two, four = data["results"]["2"], data["results"]["4"]
    row = next(line for line in docs().text.splitlines() if line.startswith("| an unchanged torchrun script"))
    assert f"{data['pairs']} pairs ({data['date']})" in row
    assert (f"**{two['ratio_run_vs_torchrun']:.2f}×** at 2 processes ({two['median_s']['run --']:.2f} s vs "
            f"{two['median_s']['torchrun --standalone']:.2f} s), **{four['ratio_run_vs_torchrun']:.2f}×** at 4 "
            f"({four['median_s']['run --']:.2f} s vs {four['median_s']['torchrun --standalone']:.2f} s)") in row
    assert (f"torchrun {two['teardown_aborts']['torchrun --standalone']} and "
            f"{four['teardown_aborts']['torchrun --standalone']} of {data['pairs']}, `run` "
            f"{two['teardown_aborts']['run --']} of {data['pairs']}") in row
    assert (f"runs that never ended: torchrun {two['hangs']['torchrun --standalone']} and "
            f"{four['hangs']['torchrun --standalone']}, `run` {two['hangs']['run --']} and {four['hangs']['run --']}") in row
    assert four["teardown_aborts"]["run --"] == two["teardown_aborts"]["run --"]


def test_the_committed_report_and_readme_quote_the_checkpoint_broadcast_results():
    """The checkpoint table holds what benchmarks/results/checkpoint_broadcast.json holds, and so does docs/benchmarks.md."""
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    block = text[text.index("<!-- table:checkpoint -->"):]
    assert report.checkpoint() in block[:block.index("<!-- end -->")]
    data = json.loads((REPO / "benchmarks" / "results" / "checkpoint_broadcast.json").read_text())
    whole, chunked = (data["ways"][way] for way in data["ways"])
    row = next(line for line in docs().text.splitlines() if line.startswith("| a checkpoint sent"))
    mib = lambda r: f"{r['peak_growth_bytes'] / 2**20:,.0f} MiB"  # noqa: E731
    assert (f"**{data['ratio_chunked_vs_whole']['rank0']:.2f}×** on rank 0 ({mib(chunked['rank0'])} vs "
            f"{mib(whole['rank0'])}), **{data['ratio_chunked_vs_whole']['rank1']:.2f}×** on the receiving rank "
            f"({mib(chunked['rank1'])} vs {mib(whole['rank1'])})") in row


def test_the_committed_report_and_readme_quote_the_checkpoint_copies_results():
    """The copies table holds what benchmarks/results/checkpoint_copies.json holds, and so does docs/benchmarks.md's row."""
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    block = text[text.index("<!-- table:copies -->"):]
    assert report.copies() in block[:block.index("<!-- end -->")]
    data = json.loads((REPO / "benchmarks" / "results" / "checkpoint_copies.json").read_text())
    row = next(line for line in docs().text.splitlines() if line.startswith("| a save that keeps"))
    for size in data["sizes"]:
        ways = size["ways"]
        seconds = [ways[way]["rank0"]["seconds"] for way in ("copies", "local")]
        assert (f"**{size['ratio_copies_vs_local']:.2f}×** at {size['mib']:,} MiB ({seconds[0]:.1f} s vs "
                f"{seconds[1]:.1f} s)") in row
    most = max(s["ways"]["copies"]["rank1"]["peak_growth_bytes"] for s in data["sizes"])
    assert f"the receiving rank holds {most / 2**20:,.0f} MiB at most" in row and data["date"] in row


def test_the_committed_report_quotes_the_restart_across_hosts_results():
    """The restarts table holds what benchmarks/results/restart_across_hosts.json holds: each launcher's medians, its
    ratios and counts, and host 0's lines about the failure."""
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    block = text[text.index("<!-- table:restarts -->"):]
    block = block[:block.index("<!-- end -->")]
    assert report.restarts() in block
    data = json.loads((REPO / "benchmarks" / "results" / "restart_across_hosts.json").read_text())
    for name, r in data["results"].items():
        assert f"| {name} | {r['trials']} | {r['restarted']}, {r['both_exit_0']} |" in block
        assert f"{r['names_cause']} of {r['trials']} |" in block
    for name, ratio in data["ratio_run_vs"].items():
        assert f"{ratio['survivor_gone_s']:.2f} / {ratio['both_restarted_s']:.2f}" in block


def test_the_readme_quotes_the_restart_across_hosts_results():
    """docs/across-hosts.md's "Why not torch elastic's rendezvous" gives the figures of
    benchmarks/results/restart_across_hosts.json."""
    data = json.loads((REPO / "benchmarks" / "results" / "restart_across_hosts.json").read_text())
    text = " ".join(docs().section("Why not torch elastic's rendezvous and `@record`").split())
    ours = data["results"]["run (launcher=manual)"]
    shipped = data["results"]["torchrun (c10d rendezvous)"]
    fixed = data["results"]["torchrun, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]
    first_step = lambda r: f"{r['median_s']['both_restarted_s']:.2f} s"  # noqa: E731
    assert (f"{first_step(ours)} after the kill under `run`, {first_step(fixed)} under torchrun with "
            f"`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` "
            f"({data['ratio_run_vs'][next(k for k in data['ratio_run_vs'] if 'DISABLE' in k)]['both_restarted_s']:.2f}×) "
            f"and {first_step(shipped)} under torchrun as shipped "
            f"({data['ratio_run_vs']['torchrun (c10d rendezvous)']['both_restarted_s']:.2f}×), which restarted only "
            f"{shipped['restarted']} of {shipped['trials']} times") in text
    torchrun_runs = [r for name, res in data["results"].items() if name.startswith("torchrun") for r in res["runs"]
                     if r.get("restart_counts")]
    differed = sum(1 for r in torchrun_runs if len(set(r["restart_counts"])) > 1)
    assert f"differed between the hosts in {differed} of {len(torchrun_runs)} torchrun restarts" in text
    assert (f"{ours['names_cause']} of {ours['trials']} trials under `run`, {shipped['names_cause']} of "
            f"{shipped['trials']} under torchrun") in text
    assert f"{data['rounds']} trials each" in text



def test_the_committed_report_and_readme_quote_the_lost_hosts_results():
    """The lost-hosts table of the report is benchmarks/results/lost_hosts.json's, and docs/lost-hosts.md ("When a host
    is lost") gives each fault's outcome under the three launchers in the same words."""
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    block = text[text.index("<!-- table:lost_hosts -->"):]
    assert report.lost_hosts() in block[:block.index("<!-- end -->")]
    data = json.loads((REPO / "benchmarks" / "results" / "lost_hosts.json").read_text())
    section = docs().page_with("When a host is lost").text
    for fault, row in data["results"].items():
        cells = " | ".join(report.lost_host_cell(r, fault) for r in report.lost_host_launchers(row))
        assert f"| {report.LOST_FAULTS[fault]} | {cells} |" in section, fault
    rounds = f"{data['rounds']} round{'s' if data['rounds'] != 1 else ''}"
    assert f"{rounds}, {data['date']}):" in " ".join(section.split())
