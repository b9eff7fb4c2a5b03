"""Peak memory of the `text-neighbours` readout on stores several times larger than its block bound.

Two stores (`analyses.synthetic.write_probe_store`) hold the same samples, vision tokens, layers
and width; one has 4 × the text tokens per sample of the other, so the contextual neighbours are
searched among 4 × the text tokens and `hidden` is several times larger. For each, a fresh process
lowers the block bound (`analyses.streaming.BLOCK_BYTES`), opens the store, records its resident
memory (VmRSS, labels read), runs `text_neighbours` uncached for the vision tokens of the first
4 samples, and records its peak (VmHWM). Reported per store: `hidden`'s bytes against the block
bound and the growth of the peak over the idle process, and the ratio of the two growths (≈ 1:
memory bounded by the block and the queries, not by the store).

    python -m benchmarks.neighbours_bench --out benchmarks/results/neighbours.json
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .memory import child_memory, report

CHILD = """
from analyses import neighbours
samples = neighbours.query_samples(ds, "baseline")
neighbours.id_texts(ds)                                   # labels read before the idle mark
idle = status("VmRSS")
result = neighbours.text_neighbours(ds, "baseline", samples, cache=False)
print(json.dumps({"idle_rss": idle, "peak_rss": status("VmHWM"), "hidden_bytes": int(ds["hidden"].nbytes),
                  "queries": int(result.sizes["query"]),
                  "top1_cos_last_layer": float(result["context_cos"].isel(rank=0, layer=-1).mean())}))
"""


def measure(n_samples: int, n_text: int, n_vision: int, layers: int, dim: int, block_mb: float) -> dict[str, Any]:
    from analyses.synthetic import write_probe_store

    root = Path(tempfile.mkdtemp(prefix="neighbours-bench-"))
    try:
        store = root / "neighbours.zarr"
        write_probe_store(store, n_samples=n_samples, n_layers=layers, dim=dim, n_vision=n_vision, n_text=n_text, seed=1)
        out = child_memory(CHILD, store, int(block_mb * 2**20), "text-neighbours")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    held = out["queries"] * (layers + 1) * dim * 8            # the queries' unit vectors (float64)
    return {**out, "queries_held": held, "samples": n_samples, "text_tokens": n_text, "vision_tokens": n_vision,
            "layers": layers + 1, "dim": dim}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--text-tokens", type=int, default=96, help="per sample, of the larger store (the smaller: a quarter)")
    parser.add_argument("--vision-tokens", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (hidden holds one more)")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--block-mb", type=float, default=4.0, help="the block bound, MiB (default: 4)")
    parser.add_argument("--out", help="write the result as JSON")
    args = parser.parse_args(argv)
    arms = [measure(args.samples, n, args.vision_tokens, args.layers, args.dim, args.block_mb)
            for n in (args.text_tokens // 4, args.text_tokens)]
    report(arms, "queries_held", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
