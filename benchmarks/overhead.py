"""Per-sample overhead of a run (issue 14's target): `workbench run`'s own loop over N samples
against a plain loop over the same samples, both start to end.

- plain loop: per sample, encode it (`WorkbenchModel.encode`, the processor call both arms make),
  one transformers forward with `output_hidden_states=True` under `inference_mode`, the hidden
  states of every layer stacked, copied to host float32 and `np.save`d, into a new folder each
  repeat (as the workbench arm writes a new store);
- workbench: the runner's loop (`workbench.runner._Run.todo`: encoding, one nnsight trace per
  (sample, condition) capturing the residual stream at every layer, token labels and decoded
  token texts, the non-finite check, the background writer gathering what arrives within
  `backend.commit_interval_s` into one icechunk commit) until every result is committed.

Both in one process, alternating (ABBA) after a warm-up of each. CPU seconds are of the whole
process, all threads (the writer thread, zarr's and icechunk's), so work moved off the main
thread still counts; wall seconds say how much of it overlaps (on a GPU the host would otherwise
wait). The store is opened before and closed after the timing (its lock and repository), as a
run does once.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .common import interleave, median, new_dir, pair_fields, runner_loop

SPEC = """\
name: bench-overhead
models: [{model}]
data: {{source: builtin, n: {n}}}
conditions:
  baseline: {{}}
capture:
  - {{site: layer, layers: all}}
store: {{path: {store}}}
"""


def _saving_loop(model: Any, samples: list[Any], out_dir: Path, sync: Any, hidden_states: Any) -> None:
    """Both hand-written loops: per sample the processor call, `hidden_states(encoding)` (the
    forward, under inference mode), np.save of what it returns."""
    import numpy as np
    import torch

    for i, sample in enumerate(samples):
        inputs = model.encode(sample.image, sample.question, "real")
        model.prepare()
        with torch.inference_mode():
            hidden = hidden_states(inputs.encoding)
        np.save(out_dir / f"hidden-{i}.npy", hidden)
    sync()


def plain_loop(model: Any, samples: list[Any], out_dir: Path, sync: Any) -> None:
    import torch

    def hidden_states(encoding: dict[str, Any]) -> Any:
        # no KV cache: the workbench builds none where nothing reads it, so neither
        # arm pays for one (the ratio is the workbench's overhead, not work it skips)
        out = model.hf(**encoding, output_hidden_states=True, use_cache=False)
        return torch.stack(out.hidden_states, dim=2)[0].to("cpu", torch.float32).numpy()

    _saving_loop(model, samples, out_dir, sync, hidden_states)


def nnsight_loop(model: Any, samples: list[Any], out_dir: Path, sync: Any) -> None:
    """The plain loop as a user of nnsight writes it by hand: per sample the same encode, one
    nnsight trace saving the residual stream at every layer from the same sites the workbench
    reads (`workbench.sites.residual_envoy`: each decoder layer's input and the final norm's),
    stacked, copied to host float32 and `np.save`d. Against the plain loop it measures what
    tracing alone costs (nnsight's hand-offs at every module call); against it, the workbench's
    own share of the ratio (labels, store)."""
    import nnsight
    import torch

    from workbench.sites import residual_envoy

    layers = range(model.n_layers + 1)

    def hidden_states(encoding: dict[str, Any]) -> Any:
        with model.lm.trace(**encoding, use_cache=False):
            saved = nnsight.save([residual_envoy(model, l).input[0] for l in layers])
        return torch.stack(saved, dim=1).to("cpu", torch.float32).numpy()

    _saving_loop(model, samples, out_dir, sync, hidden_states)


def workbench_loop(model: Any, samples: list[Any], store_path: Path, sync: Any,
                   commit_interval_s: float | None = None, store_writes: bool = True) -> tuple[float, float, int, float]:
    """The runner's loop over `samples` (`common.runner_loop`); returns (CPU s, wall s, commits,
    CPU s of this thread)."""
    # the spec names a known model to validate; the plan is compiled against `model` itself (a
    # real-size random-weight model has no hub id)
    text = SPEC.format(model="tiny-smolvlm", n=len(samples), store=store_path)
    if commit_interval_s is not None:
        text += f"backend: {{commit_interval_s: {commit_interval_s}}}\n"
    return runner_loop(model, text, samples, store_path, sync, store_writes)


def measure(model: Any, n: int, repeats: int, warmup: int = 1, workdir: Path | None = None,
            commit_interval_s: float | None = None, store_writes: bool = True,
            nnsight_only: bool = False) -> dict[str, Any]:
    """Per-sample CPU and wall time of both loops over `n` built-in samples, and their ratios.
    store_writes=False: the workbench arm drops its results (a diagnostic, see `tiny`);
    nnsight_only: `nnsight_loop` in the workbench arm's place (a diagnostic)."""
    import torch

    from workbench.data import builtin_samples
    from workbench.runner import tune_allocator

    tune_allocator()  # as `workbench run` does at start (both arms share the process)
    cuda = str(model.device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    samples = builtin_samples(n)
    commits: list[int] = []
    wb_cpu: list[float] = []
    wb_wall: list[float] = []
    wb_main: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-", dir=workdir) as tmp:
        def baseline(i: int) -> None:
            # new files in a new folder each repeat, as the workbench arm writes a new store:
            # overwriting the same files would spare the plain loop the file system's inode
            # allocation, which the store's chunk and manifest files pay
            plain_loop(model, samples, new_dir(Path(tmp) / f"plain{i}"), sync)

        def workbench(i: int) -> None:
            if nnsight_only:
                cpu, wall, k, main = _timed_loop(lambda: nnsight_loop(model, samples, new_dir(Path(tmp) / f"nn{i}"), sync))
            else:
                cpu, wall, k, main = workbench_loop(model, samples, Path(tmp) / f"run{i}.zarr", sync,
                                                    commit_interval_s, store_writes)
            if i >= 0:
                wb_cpu.append(cpu)
                wb_wall.append(wall)
                wb_main.append(main)
                commits.append(k)

        paired = interleave(baseline, workbench, repeats, warmup)
    out = paired.summary()
    # the workbench arm's own clock excludes opening and closing the store (once per run)
    base_cpu, base_wall = median(paired.baseline), median(paired.baseline_wall)
    out.update({
        "model": model.model_id,
        "samples": n,
        "repeats": repeats,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "plain_cpu_per_sample_s": round(base_cpu / n, 6),
        "plain_wall_per_sample_s": round(base_wall / n, 6),
        "workbench_cpu_per_sample_s": round(median(wb_cpu) / n, 6),
        "workbench_wall_per_sample_s": round(median(wb_wall) / n, 6),
        "ratio": round(median(wb_cpu) / base_cpu, 4),
        # where the ratio goes: the forwards' thread (nnsight, labels), and the writer's threads
        # (zarr, icechunk: on a GPU host they run on otherwise idle cores); the plain loop is one thread
        "main_thread_ratio": round(median(wb_main) / base_cpu, 4),
        "writer_threads_share": round(median([c - m for c, m in zip(wb_cpu, wb_main)]) / base_cpu, 4),
        "wall_ratio": round(median(wb_wall) / base_wall, 4),
        # each repeat's workbench run against the plain loop run beside it; the interval is what
        # a target is judged by (`benchmarks.run`: met only where its upper end is)
        **pair_fields([w / b for w, b in zip(wb_cpu, paired.baseline)]),
        "commits": commits,
        "commit_interval_s": commit_interval_s,
        "store_writes": store_writes,
        "nnsight_only": nnsight_only,
    })
    return out


def _timed_loop(loop: Any) -> tuple[float, float, int, float]:
    """(CPU s of the process, wall s, commits (none), CPU s of this thread) of `loop()`."""
    import time

    cpu, wall, main = time.process_time(), time.perf_counter(), time.thread_time()
    loop()
    return time.process_time() - cpu, time.perf_counter() - wall, 0, time.thread_time() - main


# the forwards of one model in the seed's α sweep (80 samples x 9 conditions): a run's length
SEED_RUN = 720


def ram_dir() -> Path | None:
    """A RAM-backed folder (tmpfs) where this machine has one, else None. Both loops write their
    files there in the `files in RAM` rows: on this project's VM (ext4 without a journal) creating
    a file scans past every inode deleted in the last one to five minutes (the kernel's
    `recently_deleted`, found with perf), which made the plain loop's np.save of a tiny sample
    cost 1-3 ms after the benchmark's own clean-ups, flattering the ratio; a GPU host's disk has
    no such scan, and tmpfs none either."""
    import os

    path = Path("/dev/shm")
    return path if path.is_dir() and os.access(path, os.W_OK) else None


def tiny(models: tuple[str, ...] = ("tiny-smolvlm", "tiny-qwen3vl"), n: int = 128, repeats: int = 10,
         workdir: Path | None = None, long_run: int | None = SEED_RUN) -> dict[str, Any]:
    """The tiny models (a fast forward: the proxy for a GPU), and four diagnostics: one commit
    per forward (`commit_interval_s: 0`, what every result cost before commits were gathered),
    both loops writing to RAM instead of the disk (`ram_dir`),
    the run's loop with its results dropped instead of stored (what the forwards' side costs
    alone: nnsight, labels; its forwards' thread against the gathered run's shows what the
    writer's threads cost the forwards by running beside them), a hand-written nnsight loop in
    the workbench's place (`nnsight_loop`: what tracing alone costs), and, for the first model, a run
    as long as one model's α sweep in the seed (`long_run` forwards: commits are paced and cut
    by bytes there, where a run of `n` makes about two)."""
    from workbench.models.model import load_model

    out = {}
    for name in models:
        model = load_model(name, device="cpu", dtype="float32", attn="sdpa")
        out[name] = measure(model, n, repeats, workdir=workdir)
        ram = ram_dir()
        if ram is not None:
            out[f"{name} | files in RAM"] = {**measure(model, n, repeats, workdir=ram), "in_ram": True}
        out[f"{name} | commit per forward"] = measure(model, max(4, n // 16), 2, workdir=workdir,
                                                      commit_interval_s=0)
        out[f"{name} | no store"] = measure(model, n, max(2, repeats // 2), workdir=workdir, store_writes=False)
        # what tracing alone costs, files in RAM as in the row it explains
        out[f"{name} | nnsight loop"] = {**measure(model, n, max(2, repeats // 2), workdir=ram or workdir,
                                                   nnsight_only=True), "in_ram": ram is not None}
        if long_run and name == models[0]:
            out[f"{name} | {long_run} forwards"] = {**measure(model, long_run, max(3, repeats // 2), workdir=workdir),
                                                    "long_run": True}
        del model
    return out


def real_size_one(name: str, model: Any, n: int = 2, repeats: int = 2, workdir: Path | None = None) -> dict[str, Any]:
    return measure(model, n, repeats, workdir=workdir)
