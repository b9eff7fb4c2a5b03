"""Smoke test of benchmarks/: the quick benchmark functions at minimal sizes, and the structure of
the JSON and README table they write. No timing assertions (timings are the benchmark's job)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("torch")
pytest.importorskip("nnsight")

pytestmark = pytest.mark.slow  # the benchmark smoke tests run in CI through make test-slow


def _number(x) -> bool:
    return isinstance(x, (int, float)) and x == x  # not NaN


def test_quick_benchmarks_at_minimal_size(tmp_path):
    from benchmarks import run as bench

    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\nhand-written text\n\n<!-- bench:results:start -->\nold\n<!-- bench:results:end -->\n\ntail\n")
    out = tmp_path / "latest.json"
    bench.run("smoke", real_size=False, sections=("overhead", "fastfwd", "capture", "store", "merge", "resume", "sweep", "analyses",
                                                  "memory"), out=out,
              readme=readme, log=lambda _: None, workdir=tmp_path)

    data = json.loads(out.read_text())
    assert {"started", "mode", "threads", "machine", "sections", "rows", "duration_s"} <= set(data)
    assert data["mode"] == "smoke" and data["real_size"] is False
    m = data["machine"]
    assert {"cpu", "cores", "ram_gb", "versions"} <= set(m) and {"torch", "nnsight"} <= set(m["versions"])

    sec = data["sections"]
    assert set(sec) == {"overhead_tiny", "fastfwd", "capture_tiny", "store", "merge", "resume", "sweep", "analyses_tiny",
                        "memory_tiny"}
    ov = sec["overhead_tiny"]
    from benchmarks.overhead import ram_dir

    ram = {"tiny-qwen3vl | files in RAM"} if ram_dir() is not None else set()
    assert set(ov) == {"tiny-qwen3vl", "tiny-qwen3vl | commit per forward", "tiny-qwen3vl | no store",
                       "tiny-qwen3vl | nnsight loop", "tiny-qwen3vl | 8 forwards"} | ram
    # what tracing alone costs: a hand-written nnsight loop in the workbench's place, no target
    nn = ov["tiny-qwen3vl | nnsight loop"]
    assert nn["nnsight_only"] is True and _number(nn["ratio"]) and nn["commits"] == [0, 0]
    assert any("hand-written nnsight loop" in r["measurement"] and r["met"] is None for r in data["rows"])
    if ram:  # both loops' files in RAM (tmpfs): the same measurement, judged by the same target
        assert ov["tiny-qwen3vl | files in RAM"]["in_ram"] is True and _number(ov["tiny-qwen3vl | files in RAM"]["ratio"])
    assert ov["tiny-qwen3vl | 8 forwards"]["samples"] == 8 and len(ov["tiny-qwen3vl | 8 forwards"]["pair_ratios"]) == 3
    assert ov["tiny-qwen3vl | no store"]["store_writes"] is False and ov["tiny-qwen3vl | no store"]["commits"] == [0, 0]
    assert ov["tiny-qwen3vl"]["samples"] == 4 and _number(ov["tiny-qwen3vl"]["ratio"]) and _number(ov["tiny-qwen3vl"]["wall_ratio"])
    # the ratio split into the forwards' thread and the writer's threads: with one repeat (no
    # medians to take) the two add up to it, to the rounding of the three figures
    r = ov["tiny-qwen3vl"]
    assert 0 < r["main_thread_ratio"] <= r["ratio"] and r["writer_threads_share"] >= 0
    assert abs(r["main_thread_ratio"] + r["writer_threads_share"] - r["ratio"]) <= 3e-4
    # one commit per forward when asked; fewer (gathered) by default
    assert ov["tiny-qwen3vl | commit per forward"]["commits"] == [4, 4]
    for name in ("tiny-smolvlm", "tiny-qwen3vl"):
        assert _number(sec["sweep"][name]["batching_speedup"]) and sec["sweep"][name]["samples"] == 1
    ff = sec["fastfwd"]  # section 9: the writer behind an emulated GPU forward, the sweep's results
    assert ff["samples"] == 2 and ff["conditions_per_sample"] == 8 and set(ff) >= {"sweep"} and "sweep | 16 MiB commits" not in ff
    assert _number(ff["sweep"]["wall_ratio"]) and ff["sweep"]["workbench_samples_per_s"] > 0 and len(ff["sweep"]["commits"]) == 1
    assert any(r["section"] == "9" for r in data["rows"])
    mg = sec["merge"]
    assert mg["shards"] == 2 and mg["results"] == 4 and _number(mg["ratio"]) and mg["merge_cpu_s"] > 0
    rc = sec["resume"]
    assert rc["samples"] == 5 and _number(rc["ratio"]) and rc["every_chunk_cpu_s"] > 0 and rc["since_check_cpu_s"] > 0
    for name, section in sec.items():
        assert section.get("status") != "error", (name, section.get("reason"), section.get("traceback"))

    assert set(sec["capture_tiny"]) == {"tiny-qwen3vl | layers+attention"}
    for r in sec["capture_tiny"].values():
        assert len(r["baseline_cpu_s"]) == len(r["candidate_cpu_s"]) == 2
        for key in ("ratio", "pair_ratio", "wall_ratio", "trace_median_s", "write_median_s", "n_tokens"):
            assert _number(r[key]), key
        assert r["attention"] is True and r["n_layers"] == 3

    st = sec["store"]
    assert st["shape"] == [64, 3, 128] and set(st["arms"]) == {"raw", "workbench"}
    assert _number(st["throughput_ratio"]) and _number(st["zarr_mb_per_s"]) and 0 < st["stored_fraction"] <= 1.5

    an = sec["analyses_tiny"]
    assert an["analyses"]["entry_point"] in ("workbench analyze", "analyses.tables.analyze", "analyses.norms.norm_table")
    assert an["analyses"]["tables"] >= 1 and _number(an["ratio"]) and an["capture_cpu_s"] > 0

    mem = sec["memory_tiny"]
    assert list(mem["runs"]) == ["1"] and mem["runs"]["1"]["peak_rss_mb"] > 0 and _number(mem["growth"])

    rows = data["rows"]
    assert {r["section"] for r in rows} == {"1", "2", "3", "4", "6", "7", "8", "9"}
    for r in rows:
        assert {"measurement", "scale", "baseline", "workbench", "ratio", "target", "met"} <= set(r)

    text = readme.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written text") and text.rstrip().endswith("tail")
    assert "old" not in text and "| # | measurement |" in text and text.count("<!-- bench:results:start -->") == 1


def test_table_reports_failed_and_unavailable_sections():
    from benchmarks import run as bench
    from benchmarks.common import machine

    results = {"started": "t", "mode": "quick", "real_size": False, "threads": 1, "machine": machine(),
               "duration_s": 1.0, "sections": {
                   "store": {"status": "error", "reason": "OSError: disk full"},
                   "remote": {"status": "not available", "reason": "workbench.backends.remote does not exist yet"},
               }}
    table = bench.markdown(results)
    assert "error: OSError: disk full" in table
    assert "not available: workbench.backends.remote does not exist yet" in table


def test_remote_section_is_guarded():
    from benchmarks import remote_bench

    ok, reason = remote_bench.available()
    assert isinstance(ok, bool) and (ok or reason)


def test_gpu_benchmark_cpu_dry_run(tmp_path):
    """benchmarks/gpu.py's own code on the tiny models, CPU fp32: every arm runs and the table
    and JSON have their numbers (the GPU run itself needs a GPU machine)."""
    from benchmarks import gpu

    out = tmp_path / "gpu.json"
    lines: list[str] = []
    results = gpu.run(True, repeats=1, samples=1, out=out, log=lines.append, workdir=tmp_path)
    assert json.loads(out.read_text())["models"].keys() == {"tiny-smolvlm", "tiny-qwen3vl"}
    for entry in results["models"].values():
        sweep = entry["sweep"]
        assert sweep["conditions_per_sample"] == 8
        for arm in ("plain_batch8", "workbench_batch1", "workbench_batch8"):
            assert _number(sweep[f"{arm}_samples_per_s"]) and sweep[f"{arm}_samples_per_s"] > 0
        assert _number(entry["capture_overhead"]["ratio"])
    assert "| tiny-qwen3vl |" in lines[-1] and "workbench batch 8" in lines[-1]
