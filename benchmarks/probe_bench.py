"""Peak memory of the `probe` analysis on stores several times larger than its block bound.

Two stores with a planted signal (`analyses.synthetic.write_probe_store`) hold the same samples,
layers and width, one with 4 × the vision tokens of the other (4 × the bytes of `hidden`; the
per-sample features the probes hold are the same). For each, a fresh process lowers the block
bound (`analyses.streaming.BLOCK_BYTES`), opens the store, records its resident memory (VmRSS:
imports and labels, before any row of `hidden` is read), runs `probe_results` uncached, and
records its peak (VmHWM). Reported per store: `hidden`'s bytes against the block bound and the
growth of the peak over the idle process; and the ratio of the two growths (memory bounded by
the block, not by the store: ≈ 1 while the store grows 4 ×). The growth itself includes the
warm-up of the reader (zarr codecs, dask's threads and their malloc arenas) and the per-sample
features (samples × 5 groups × layers × dim × 8 B per condition), named beside it.

    python -m benchmarks.probe_bench --out benchmarks/results/probe.json
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .memory import child_memory, report

CHILD = """
from analyses import probe
probe.sample_labels(ds, "colour"); streaming.layout(ds, "token")   # labels read before the idle mark
idle = status("VmRSS")
result = probe.probe_results(ds, "colour", cache=False)
accuracy = float(result["accuracy"].sel(condition="baseline", group="vision").isel(layer=-1).mean())
print(json.dumps({"idle_rss": idle, "peak_rss": status("VmHWM"), "hidden_bytes": int(ds["hidden"].nbytes),
                  "vision_accuracy_last_layer": accuracy}))
"""


def measure(n_samples: int, n_vision: int, layers: int, dim: int, block_mb: float) -> dict[str, Any]:
    from analyses.synthetic import write_probe_store

    root = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    try:
        store = root / "probe.zarr"
        write_probe_store(store, n_samples=n_samples, n_layers=layers, dim=dim, n_vision=n_vision, seed=1)
        out = child_memory(CHILD, store, int(block_mb * 2**20), "probe")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    features = 2 * n_samples * 5 * (layers + 1) * dim * 8   # two conditions' per-sample features (float64)
    return {**out, "per_sample_features_held": features, "samples": n_samples, "vision_tokens": n_vision,
            "layers": layers + 1, "dim": dim}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--vision-tokens", type=int, default=96, help="of the larger store (the smaller: a quarter)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (hidden holds one more)")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--block-mb", type=float, default=4.0, help="the block bound, MiB (default: 4)")
    parser.add_argument("--out", help="write the result as JSON")
    args = parser.parse_args(argv)
    arms = [measure(args.samples, n, args.layers, args.dim, args.block_mb)
            for n in (args.vision_tokens // 4, args.vision_tokens)]
    report(arms, "per_sample_features_held", args.out)
    accuracies = ", ".join(f"{arm['vision_accuracy_last_layer']:.2f}" for arm in arms)
    print(f"baseline vision accuracy at the last layer: {accuracies}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
