"""On-disk bytes of a store after a run ends, against the bytes of the arrays it holds.

Every commit rewrites the partial last chunk of each array it appends to; the run's end
(`StoreWriter.finish_run`) deletes the superseded versions. This measures what is left: the
bytes of every file under the store's folder (icechunk's chunks, manifests, snapshots,
transaction logs, refs, config) over the stored arrays' bytes (every array of the committed
snapshot at its stored dtype: shape x item size; strings at their UTF-8 length). Compression
makes the ratio smaller than 1 where the data compresses.

Arms, each one store written from nothing and finished as a run ends:

- `tiny run`: `workbench run` of a tiny model (`layers: all` and the logits), a commit per
  sample (`commit_interval_s: 0`, the most superseded versions), in a subprocess;
- `tiny shapes` / real-size shapes: `StoreWriter.write_samples` of synthetic captures with the
  shapes of the tiny models and of SmolVLM2-2.2B / Qwen3-VL-2B (`benchmarks/realsize.py`: 2048
  wide, every layer, the token counts of section 1), full-precision normal float32 (an fp32
  model's captures: what compresses least), one sample per commit.

    python -m benchmarks.disk_bench --out benchmarks/results/disk.json [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TARGET = 1.25  # disk bytes / stored arrays' bytes, at most
# (name, tokens per sample, layers, width, samples)
SHAPES = [
    ("tiny shapes (tiny-smolvlm)", 146, 4, 64, 48),
    ("tiny shapes (tiny-qwen3vl)", 109, 4, 64, 48),
    ("SmolVLM2-2.2B shapes", 165, 25, 2048, 8),
    ("Qwen3-VL-2B shapes", 148, 29, 2048, 8),
]
TINY_RUN = """\
name: bench-disk
models: [{model}]
data: {{source: builtin, n: {n}}}
conditions:
  baseline: {{}}
capture:
  - {{site: layer, layers: all}}
  - {{site: logits}}
store: {{path: {store}}}
backend: {{commit_interval_s: 0}}
"""


def disk_bytes(store: Path) -> int:
    return sum(f.stat().st_size for f in store.rglob("*") if f.is_file())


def array_bytes(store: Path) -> int:
    """Bytes of every array of the store's committed snapshot, at its stored dtype."""
    from workbench.store import BRANCH, _open_repo, _root_of

    repo = _open_repo(store)
    root = _root_of(repo, repo.readonly_session(branch=BRANCH))
    total = 0
    for _, array in _all_arrays(root):
        if array.dtype.kind in "OUT":
            total += sum(len(str(s).encode()) for s in np.asarray(array[:]).ravel())
        else:
            total += int(np.prod(array.shape)) * array.dtype.itemsize
    return total


def _all_arrays(group: Any) -> list[tuple[str, Any]]:
    out = list(group.arrays())
    for _, child in group.groups():
        out += _all_arrays(child)
    return out


def _labels(n: int, sample: int) -> dict[str, Any]:
    from workbench.store import Variable

    modality = np.array((["text"] * 10 + ["vision"] * n)[:n])
    return {
        "position": Variable(("token",), np.arange(n, dtype=np.int64)),
        "modality": Variable(("token",), modality),
        "token_id": Variable(("token",), (np.arange(n, dtype=np.int64) * 7 + sample) % 300),
        "token_text": Variable(("token",), np.array([chr(97 + (i % 26)) for i in range(n)], dtype=object)),
        "nonfinite": Variable(("run",), np.array([0], dtype=np.int64)),
    }


def shapes_arm(store: Path, tokens: int, layers: int, width: int, samples: int) -> dict[str, Any]:
    """`samples` results of (tokens, layers, width), one commit each, then the run's end."""
    from workbench.store import StoreWriter, Variable

    started = time.perf_counter()
    with StoreWriter(store) as writer:
        writer.ensure_model("m", {"family": "bench"})
        for i in range(samples):
            hidden = np.random.default_rng(i).standard_normal((tokens, layers, width), dtype=np.float32)
            variables = {**_labels(tokens, i),
                         "hidden": Variable(("token", "layer", "dim"), hidden, {"layer": np.arange(layers)})}
            writer.write_samples([("m", "baseline", f"s{i}", variables, None, "")])
        before = disk_bytes(store)
        writer.finish_run()
    return {"before_end_bytes": before, "seconds": time.perf_counter() - started}


def tiny_run_arm(store: Path, model: str, n: int) -> dict[str, Any]:
    spec = store.with_name("spec.yaml")
    spec.write_text(TINY_RUN.format(model=model, n=n, store=store))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(spec), "--no-progress", "--no-table"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"workbench run failed: {done.stderr[-2000:]}")
    return {"seconds": time.perf_counter() - started}


def measure(quick: bool = False, workdir: Path | None = None, log: Any = print) -> list[dict[str, Any]]:
    rows = []
    arms: list[tuple[str, Any]] = [
        (f"tiny run ({model}, {n} samples, a commit each)", lambda store, model=model, n=n: tiny_run_arm(store, model, n))
        for model, n in (("tiny-smolvlm", 4 if quick else 16), ("tiny-qwen3vl", 4 if quick else 16))]
    for name, tokens, layers, width, samples in SHAPES:
        samples = max(2, samples // 4) if quick else samples
        arms.append((f"{name}: ({tokens}, {layers}, {width}) x {samples}",
                     lambda store, a=(tokens, layers, width, samples): shapes_arm(store, *a)))
    for name, arm in arms:
        with tempfile.TemporaryDirectory(prefix="bench-disk-", dir=workdir) as tmp:
            store = Path(tmp) / "store.zarr"
            extra = arm(store)
            disk, arrays = disk_bytes(store), array_bytes(store)
            row = {"arm": name, "disk_bytes": disk, "array_bytes": arrays, "ratio": disk / arrays,
                   "met": disk / arrays <= TARGET, **extra}
            rows.append(row)
            log(f"{name}: disk {disk / 1e6:.2f} MB, arrays {arrays / 1e6:.2f} MB, ratio {row['ratio']:.3f}")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| store | arrays (MB) | on disk after the run (MB) | ratio | before the run's end (MB) | ≤ 1.25 |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        before = f"{r['before_end_bytes'] / 1e6:.2f}" if "before_end_bytes" in r else "—"
        out.append(f"| {r['arm']} | {r['array_bytes'] / 1e6:.2f} | {r['disk_bytes'] / 1e6:.2f} | {r['ratio']:.3f} "
                   f"| {before} | {'yes' if r['met'] else 'no'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.disk_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="fewer samples per arm")
    args = parser.parse_args(argv)
    rows = measure(quick=args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target": TARGET, "rows": rows}, indent=1))
    print(table(rows))
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
