"""Shared helpers: thread pinning, interleaved timing with medians, machine description."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def pin_threads(n: int) -> None:
    """Pin torch's intra-op threads (and the BLAS/OpenMP pools of child processes)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:  # the store/analysis sections need no torch
        pass


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@dataclass
class Paired:
    """CPU and wall times of a baseline and a candidate, run alternately (ABBA...).

    Ratios are of CPU time (user + system of this process): on this VM the wall time of a fixed
    matmul loop varies by +-50% from run to run (the vCPU is descheduled; steal is not reported),
    while its CPU time varies by +-3%. Wall-time ratios are kept beside them."""

    baseline: list[float] = field(default_factory=list)            # CPU seconds
    candidate: list[float] = field(default_factory=list)
    baseline_wall: list[float] = field(default_factory=list)
    candidate_wall: list[float] = field(default_factory=list)
    baseline_steal: list[float] = field(default_factory=list)     # the host's steal, all vCPUs (s)
    candidate_steal: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """median(candidate) / median(baseline), CPU time."""
        return median(self.candidate) / median(self.baseline)

    @property
    def pair_ratios(self) -> list[float]:
        """candidate_i / baseline_i per repeat, CPU time."""
        return [c / b for c, b in zip(self.candidate, self.baseline)]

    @property
    def wall_ratio(self) -> float:
        return median(self.candidate_wall) / median(self.baseline_wall)

    def steal_share(self) -> float:
        """What share of the timed runs' vCPU time the host took back (steal), both arms."""
        wall = sum(self.baseline_wall) + sum(self.candidate_wall)
        steal = sum(self.baseline_steal) + sum(self.candidate_steal)
        return steal / (wall * (os.cpu_count() or 1)) if wall else 0.0

    def summary(self) -> dict[str, Any]:
        r = lambda xs: [round(t, 6) for t in xs]  # noqa: E731
        return {
            "baseline_cpu_s": r(self.baseline),
            "candidate_cpu_s": r(self.candidate),
            "baseline_wall_s": r(self.baseline_wall),
            "candidate_wall_s": r(self.candidate_wall),
            "baseline_median_s": round(median(self.baseline), 6),
            "candidate_median_s": round(median(self.candidate), 6),
            "ratio": round(self.ratio, 4),
            "wall_ratio": round(self.wall_ratio, 4),
            "noise": round(spread(self.candidate) + spread(self.baseline), 4),
            "steal_share": round(self.steal_share(), 4),
            **pair_fields(self.pair_ratios),
        }


def ratio_ci(ratios: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """The geometric mean of paired ratios and its `level` bootstrap confidence interval (BCa
    over the pairs): (mean, low, high); None for fewer than 3 pairs. A pair's two arms run back
    to back, so they share most of the host's contention of the moment, which is what makes a
    single run's time swing on this VM; the interval says what the pairs, together, show."""
    if len(ratios) < 3:
        return None
    import numpy as np
    from scipy import stats

    logs = np.log(ratios)
    if np.ptp(logs) == 0:  # no spread: no interval to estimate (BCa would divide by zero)
        return float(ratios[0]), float(ratios[0]), float(ratios[0])
    ci = stats.bootstrap((logs,), np.mean, confidence_level=level, n_resamples=4999, method="BCa",
                         random_state=np.random.default_rng(0)).confidence_interval
    return float(np.exp(logs.mean())), float(np.exp(ci.low)), float(np.exp(ci.high))


def pair_fields(ratios: list[float]) -> dict[str, Any]:
    """A summary's figures of paired ratios: each pair's, their median (robust to slow drift),
    and (from 3 pairs) their geometric mean with its 95 % interval (`ratio_ci`)."""
    out: dict[str, Any] = {"pair_ratios": [round(r, 4) for r in ratios], "pair_ratio": round(median(ratios), 4)}
    ci = ratio_ci(ratios)
    if ci is not None:
        out.update({"pair_gmean": round(ci[0], 4), "pair_ci95": [round(ci[1], 4), round(ci[2], 4)]})
    return out


def new_dir(path: Path) -> Path:
    """`path`, made (it must not exist): a plain loop's new output folder."""
    path.mkdir()
    return path


def spread(values: list[float]) -> float:
    """A rough relative noise figure: (max - min) / 2 / median for n < 5, else (q3 - q1) / 2 / median."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    if len(values) < 5:
        return (max(values) - min(values)) / 2 / m
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / 2 / m


def cpu_time() -> float:
    """User + system CPU seconds of this process (all threads)."""
    return time.process_time()


def steal_time() -> float:
    """Seconds the hypervisor ran something else while this VM's vCPUs wanted to run (steal,
    summed over vCPUs; /proc/stat), 0.0 where the kernel does not report it. On this project's
    VM the CPU time of a fixed loop rises with it: the host's other tenants also share caches."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, result) of fn()."""
    gc.collect()
    wall, cpu = time.perf_counter(), cpu_time()
    out = fn()
    return cpu_time() - cpu, time.perf_counter() - wall, out


def interleave(baseline: Callable[[int], Any], candidate: Callable[[int], Any], repeats: int, warmup: int = 1) -> Paired:
    """Run baseline and candidate `warmup` times each untimed, then `repeats` timed pairs in ABBA
    order. Each callable gets the repeat index (negative for warm-ups: distinct sample ids)."""
    for i in range(warmup):
        baseline(-1 - i)
        candidate(-1 - i)
    out = Paired()
    sinks = {baseline: (out.baseline, out.baseline_wall, out.baseline_steal),
             candidate: (out.candidate, out.candidate_wall, out.candidate_steal)}
    for i in range(repeats):
        order = (baseline, candidate) if i % 2 == 0 else (candidate, baseline)
        for fn in order:
            steal = steal_time()
            cpu, wall, _ = timed(lambda: fn(i))
            for sink, value in zip(sinks[fn], (cpu, wall, steal_time() - steal)):
                sink.append(value)
    return out


def interleave_many(arms: dict[str, Callable[[int], Any]], repeats: int, warmup: int = 1,
                    between: Callable[[], Any] | None = None) -> dict[str, dict[str, list[float]]]:
    """Like `interleave` for several arms: each repeat runs every arm once, the order rotated
    by one per repeat; `between` runs untimed before every timed call (e.g. `os.sync`, so no arm
    pays for the writeback of another's dirty pages). Returns {arm: {"cpu": [...], "wall": [...]}}."""
    names = list(arms)
    for i in range(warmup):
        for name in names:
            arms[name](-1 - i)
    out = {name: {"cpu": [], "wall": []} for name in names}
    for i in range(repeats):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            if between is not None:
                between()
            cpu, wall, _ = timed(lambda: arms[name](i))
            out[name]["cpu"].append(cpu)
            out[name]["wall"].append(wall)
    return out


def code_revision() -> str | None:
    """The commit the measured code is at, "+modified" where a Python file of workbench/ or
    benchmarks/ differs from it (runs are pooled only over the same code, `benchmarks.pooled`);
    None outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "workbench/*.py", "benchmarks/*.py"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+modified" if changed else "")


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM and package versions of this run."""
    import importlib.metadata as md

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((l.split(":", 1)[1] for l in text.splitlines() if l.startswith("flags")), "")
    except OSError:
        pass
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gb = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    versions = {}
    for name in ("torch", "transformers", "nnsight", "zarr", "numcodecs", "xarray", "numpy"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "simd": " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags.split()),
        "gpu": gpu,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
    }


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Discarding:
    """Takes results and stores none: the diagnostic arm that times a run's loop without its store."""

    commits = 0

    def __init__(self, summary: Any, keep: list | None = None):
        self.summary = summary
        self.keep = keep

    def put_group(self, results: list[Any]) -> None:
        if self.keep is not None:
            self.keep.extend(results)
        self.summary.written += len(results)


def runner_loop(model: Any, spec_text: str, samples: list[Any], store_path: Path,
                sync: Callable[[], Any], store_writes: bool = True, keep: list | None = None) -> tuple[float, float, int, float]:
    """The workbench's own run loop (`workbench.runner._Run.todo`, the background writer) over
    `samples` with the plan of `spec_text` compiled against `model` itself, until every result is
    committed. Returns (CPU seconds of the process, wall seconds, commits, CPU seconds of the
    calling thread: the forwards' side, the rest being the writer's threads); opening and closing
    the store (once per run) are outside the timing. `store_writes=False`: the results are
    dropped instead of written (a diagnostic: what the loop costs without its store), and
    appended to `keep` where one is given."""
    import contextlib

    from tqdm.auto import tqdm

    from workbench.data import input_hash
    from workbench.plan import compile_plan
    from workbench.executors.local import LocalExecutor
    from workbench.runner import RunContext, RunSummary, _Run, result_writer
    from workbench.spec import parse_spec
    from workbench.store import StoreWriter
    from workbench.worklist import PendingRun

    spec = parse_spec(spec_text, source="<benchmark spec>")
    plan = compile_plan(spec, model.info)
    summary = RunSummary(store=str(store_path))
    bar = tqdm(disable=True)
    with StoreWriter(store_path) as store:
        executor = LocalExecutor(str(model.device), models={model.model_id: model})
        run = _Run(RunContext(spec, store, executor, summary, {s.id: input_hash(s) for s in samples}, bar,
                              lambda _: None))
        todo = [PendingRun(plan, s, c) for s in samples for c in plan.conditions]
        sync()
        cpu, wall, main = time.process_time(), time.perf_counter(), time.thread_time()
        writing = result_writer(store, spec, summary, bar) if store_writes else contextlib.nullcontext(_Discarding(summary, keep))
        with writing as writer:
            run.todo(todo, writer)
        sync()
        cpu, wall, main = time.process_time() - cpu, time.perf_counter() - wall, time.thread_time() - main
    assert summary.written == len(todo), (summary.written, len(todo))
    return cpu, wall, getattr(writer, "commits", len(todo)), main
