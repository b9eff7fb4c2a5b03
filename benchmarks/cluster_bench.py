"""Analyses of a store larger than the memory its dask workers may use.

A synthetic store (`analyses.synthetic`, the residual stream only, real-size width) is written
to several times the memory each worker is allowed. A `dask.distributed` cluster on loopback
(`LocalCluster`, one thread per worker process, `memory_limit` per worker) then runs
`workbench analyze STORE depth --scheduler ADDRESS` in a fresh process, as a user would; the
same command without `--scheduler` (dask's local threads) is the baseline. `depth` reads every
row of `hidden` (the mean norm at every layer, and the update ratio between layers).

Reported: the store's bytes against one worker's limit; each worker's peak RSS (sampled every
0.2 s while the analysis runs, and before it, idle) against the limit; the wall time on
the cluster against the local scheduler's, and the two tables (equal, or the run fails).

    python -m benchmarks.cluster_bench --out benchmarks/results/cluster.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from .common import REPO

ANALYSIS = "depth"


def write_store(path: Path, target_bytes: int, dim: int, layers: int) -> int:
    """A synthetic store of about `target_bytes` of `hidden` (float32); returns its arrays' bytes."""
    from analyses.synthetic import SyntheticModel, write_synthetic_store

    model = SyntheticModel("synthetic-wide", n_layers=layers, dim=dim)
    per_sample = 16 * (layers + 1) * dim * 4   # ~16 tokens per sample (analyses/synthetic.py layout)
    n = max(2, target_bytes // per_sample)
    write_synthetic_store(path, models=(model,), n_samples=int(n), alphas=(), extra_conditions=(),
                          variables=("hidden",))
    return stored_bytes(path)


def stored_bytes(path: Path) -> int:
    import workbench

    ds = workbench.open_store(path, model="synthetic-wide")
    return int(ds["hidden"].nbytes)


def analyze(store: Path, scheduler: str | None) -> tuple[float, str, int]:
    """Wall seconds, the table printed, and the process's peak RSS (bytes) of one
    `workbench analyze` in a fresh process."""
    command = [sys.executable, "-c", (
        "import resource, sys; from workbench.cli import main; code = main(sys.argv[1:]); "
        "print('PEAK_RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr); "
        "raise SystemExit(code)"), "analyze", str(store), ANALYSIS, "--force"]
    if scheduler:
        command += ["--scheduler", scheduler]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"analyze failed ({done.returncode}):\n{done.stderr[-3000:]}")
    peak = int(next(line.split()[1] for line in done.stderr.splitlines() if line.startswith("PEAK_RSS")))
    return wall, done.stdout, peak


class RssSampler:
    """Each worker process's resident memory, sampled every `interval` s while the analysis runs
    (psutil, which dask.distributed depends on); `peaks` holds each worker's largest sample."""

    def __init__(self, client: Any, interval: float = 0.2):
        self.client, self.interval = client, interval
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for worker, rss in self.client.run(lambda: psutil.Process().memory_info().rss).items():
            self.peaks[worker] = max(self.peaks.get(worker, 0), int(rss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def measure(target_mb: int, limit_mb: int, workers: int, dim: int, layers: int) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    root = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    try:
        store = root / "wide.zarr"
        array_bytes = write_store(store, target_mb * 2**20, dim, layers)
        local_wall, local_table, local_peak = analyze(store, None)
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          memory_limit=f"{limit_mb}MiB", dashboard_address=None) as cluster, \
                Client(cluster) as client:
            with RssSampler(client) as idle:        # the workers' own footprint, before any work
                time.sleep(1.0)
            with RssSampler(client) as sampler:
                cluster_wall, cluster_table, _ = analyze(store, cluster.scheduler_address)
            peaks, baseline_peaks = sorted(sampler.peaks.values()), sorted(idle.peaks.values())
        if cluster_table != local_table:
            raise RuntimeError("the cluster's table differs from the local scheduler's")
        limit = limit_mb * 2**20
        return {
            "analysis": ANALYSIS, "workers": workers, "threads_per_worker": 1,
            "worker_memory_limit_bytes": limit, "store_array_bytes": array_bytes,
            "store_over_worker_limit": round(array_bytes / limit, 2),
            "worker_peak_rss_bytes": peaks, "worker_idle_rss_bytes": baseline_peaks,
            "worker_peak_over_limit": round(max(peaks) / limit, 3),
            "local_wall_s": round(local_wall, 2), "cluster_wall_s": round(cluster_wall, 2),
            "cluster_over_local": round(cluster_wall / local_wall, 3),
            "local_peak_rss_bytes": local_peak, "tables_equal": True,
            "cpus": os.cpu_count(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store-mb", type=int, default=4096, help="the store's `hidden` bytes (MiB)")
    parser.add_argument("--worker-mb", type=int, default=1024, help="memory_limit of each worker (MiB)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=2048, help="hidden width (2048: the study's 2B models)")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = measure(args.store_mb, args.worker_mb, args.workers, args.dim, args.layers)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
