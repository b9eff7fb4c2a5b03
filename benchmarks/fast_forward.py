"""The store writer behind a fast forward (section 9): a CPU-only proxy for a GPU's throughput.

On a GPU a 2B forward takes tens of milliseconds and the host thread mostly waits for the
device, so what bounds samples/s is whether the background writer keeps up. This section
emulates that forward: each sample's "forward" is `forward_ms` of wall time without CPU
(`time.sleep`, as a CUDA synchronize waits), after which the sample's results are handed on.

The results are the alpha sweep's (8 conditions per sample, residual at 3 layers and the last
position's log-probabilities): the labels come from one real runner pass over the tiny model
(`workbench.runner._Run`, token texts and run texts included), the captures are replaced by
bfloat16-valued arrays of a real model's size (Qwen3-VL-2B: hidden 2048, vocabulary 151 936;
~4.2 MB a result). Arms, alternating (ABBA) after a warm-up of each, wall time (the forward is
wall time; CPU seconds are reported beside it):
- plain loop: per sample the forward, then `np.save` of its 8 rows' hidden states and
  log-probabilities (one file each, a new folder per repeat);
- workbench: per sample the forward, then `BackgroundWriter.put_group` of its 8 results (the
  runner's writer: default queue, 1 s commit interval, paced), until everything is committed;
- diagnostic (`| 16 MiB commits`): the workbench with every commit capped at 16 MiB (the
  gathering cap then), as the writer did before it took its whole backlog (2026-12-02).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import interleave, median, new_dir, pair_fields

if TYPE_CHECKING:
    from workbench.writer import StoredResult

REAL = dict(dim=2048, vocab=151936)  # Qwen3-VL-2B's text model (benchmarks/realsize.py)


def sweep_labels(samples: int, workdir: Path | None = None) -> list[list[StoredResult]]:
    """Per sample, the 8 results (as `StoreWriter.write_samples` takes them) of the tiny model's
    alpha sweep, run once through the runner's own loop with its results kept, not stored."""
    from workbench.data import builtin_samples
    from workbench.models.model import load_model

    from . import gpu
    from .common import runner_loop

    model = load_model("tiny-smolvlm", device="cpu", dtype="float32")
    kept: list[tuple] = []
    with tempfile.TemporaryDirectory(prefix="bench-fastfwd-", dir=workdir) as tmp:
        text = gpu.SWEEP.format(alphas=", ".join(map(str, gpu.ALPHAS)), layers=", ".join(map(str, gpu._sweep_layers(model))),
                                batch=len(gpu.ALPHAS), store=Path(tmp) / "unused.zarr")
        runner_loop(model, text, builtin_samples(samples), Path(tmp) / "unused.zarr", lambda: None, store_writes=False,
                    keep=kept)
    per = len(gpu.ALPHAS)
    return [kept[i:i + per] for i in range(0, len(kept), per)]


def real_size(batches: list[list[StoredResult]], dim: int, vocab: int) -> list[list[StoredResult]]:
    """The same results with `hidden` (token, layer, dim) and `logprobs` (run, step, vocab) of
    a real model's width: bfloat16-valued float32 (as a bf16 model's captures are), a different
    slice of one random block per condition."""
    import numpy as np

    from workbench.store import Variable
    from workbench.writer import StoredResult

    from .store_write import bf16_valued

    tokens = max(r.variables["hidden"].data.shape[0] for b in batches for r in b)
    layers = batches[0][0].variables["hidden"].data.shape[1]
    per = len(batches[0])
    hidden = bf16_valued((tokens + per, layers, dim), seed=0)
    logprobs = bf16_valued((per, 1, 1, vocab), seed=1)
    out = []
    for batch in batches:
        rows = []
        for k, (model, condition, sample, variables, attrs, input_hash) in enumerate(batch):
            h, lp = variables["hidden"], variables["logprobs"]
            v = {**variables, "hidden": Variable(h.dims, hidden[k:k + h.data.shape[0]], h.coords),
                 "logprobs": Variable(lp.dims, logprobs[k], lp.coords)}
            rows.append(StoredResult(model, condition, sample, v, attrs, input_hash))
        out.append(rows)
    return out


def plain(batches: list[list[StoredResult]], out_dir: Path, forward_s: float) -> None:
    import numpy as np

    for i, batch in enumerate(batches):
        time.sleep(forward_s)
        np.save(out_dir / f"hidden-{i}.npy", np.stack([r.variables["hidden"].data for r in batch]))
        np.save(out_dir / f"logprobs-{i}.npy", np.stack([r.variables["logprobs"].data for r in batch]))


def workbench(batches: list[list[StoredResult]], store_path: Path, forward_s: float, backlog: bool = True) -> int:
    """The background writer fed a sample's results after each forward; returns its commits.
    The store is opened before and closed after (once per run, as a run does), inside the timing
    here: its share is small beside the writes."""
    from workbench.spec.schema import BackendSpec
    from workbench.store import StoreWriter
    from workbench.writer import BackgroundWriter

    backend = BackendSpec()  # the runner's defaults: its queue's cap and commit interval
    with StoreWriter(store_path) as store:
        store.ensure_model(batches[0][0].model_id, {"family": "smolvlm"})
        with BackgroundWriter(store, backend.write_queue_mb << 20, None, backend.commit_interval_s) as writer:
            if not backlog:  # the writer before backlog commits: every commit capped at 16 MiB
                writer._gather_bytes = writer._backlog_bytes = 16 << 20
            for batch in batches:
                time.sleep(forward_s)
                writer.put_group(batch)
    return writer.commits


def measure(samples: int = 24, repeats: int = 3, forward_ms: float = 50.0, dim: int = REAL["dim"],
            vocab: int = REAL["vocab"], workdir: Path | None = None, diagnostic: bool = True) -> dict[str, Any]:
    batches = real_size(sweep_labels(samples, workdir), dim, vocab)
    forward_s = forward_ms / 1e3
    result_mb = sum(v.data.nbytes for v in batches[0][0].variables.values()) / 1e6
    out: dict[str, Any] = {"samples": samples, "conditions_per_sample": len(batches[0]), "forward_ms": forward_ms,
                           "dim": dim, "vocab": vocab, "result_mb": round(result_mb, 2)}
    with tempfile.TemporaryDirectory(prefix="bench-fastfwd-", dir=workdir) as tmp:
        arms = {"sweep": True, "sweep | 16 MiB commits": False} if diagnostic else {"sweep": True}
        for key, backlog in arms.items():
            commits: list[int] = []
            arm = new_dir(Path(tmp) / ("backlog" if backlog else "capped"))

            def candidate(i: int, backlog: bool = backlog, arm: Path = arm) -> None:
                commits.append(workbench(batches, arm / f"wb-{i}.zarr", forward_s, backlog))

            paired = interleave(lambda i, arm=arm: plain(batches, new_dir(arm / f"plain-{i}"), forward_s),
                                candidate, repeats if backlog else max(1, repeats - 1))
            summary = paired.summary()
            out[key] = {
                **summary, "commits": commits[1:],  # the warm-up's first
                # wall time decides here (the forward is wall time): its pairs, as section 8's CPU ones
                "wall_pairs": pair_fields([c / b for c, b in zip(paired.candidate_wall, paired.baseline_wall)]),
                "plain_samples_per_s": round(samples / median(paired.baseline_wall), 3),
                "workbench_samples_per_s": round(samples / median(paired.candidate_wall), 3),
                "forward_bound_samples_per_s": round(1 / forward_s, 3),
            }
    return out
