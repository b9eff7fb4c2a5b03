"""Store writes: MB/s of captures appended with `StoreWriter.write_sample` against raw `np.save`.

Each "sample" is a (token, layer, dim) float32 array with bfloat16-valued entries (the low 16 bits
zeroed, as captures of a bf16 model are) plus the token labels the runner writes. Both arms write
into the same temporary directory (same disk, through the page cache; no fsync in either), one
file / one append per sample, the arms' order rotated every repeat after a warm-up, with an
untimed `os.sync()` before every timed write (each arm starts with no dirty pages: without it an
arm pays for the writeback of the previous arm's 100+ MB, which made the medians depend on the
order). Both arms are timed as buffered writes: what the runner waits for.

Diagnostics split the zarr time: the same appends through zarr's API directly (same codec and
chunks: StoreWriter's own overhead is the difference), without compression, and the Blosc
lz4+shuffle encode alone (numcodecs, this process).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .common import cpu_time, interleave_many, median, spread


def bf16_valued(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Normal float32 values rounded down to bfloat16 precision (what a bf16 model's captures are)."""
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    x.view(np.uint32)[...] &= np.uint32(0xFFFF0000)
    return x


def sample_variables(hidden: np.ndarray) -> dict[str, Any]:
    from workbench.store import Variable

    n, layers = hidden.shape[0], hidden.shape[1]
    modality = np.array(["text"] * 10 + ["vision"] * (n - 20) + ["text"] * 10)[:n]
    return {
        "position": Variable(("token",), np.arange(n, dtype=np.int64)),
        "modality": Variable(("token",), modality),
        "token_id": Variable(("token",), np.arange(n, dtype=np.int64) % 300),
        "hidden": Variable(("token", "layer", "dim"), hidden, {"layer": np.arange(layers)}),
        "nonfinite": Variable(("run",), np.array([0], dtype=np.int64)),
    }


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(tokens: int = 600, layers: int = 29, dim: int = 2048, repeats: int = 7, warmup: int = 1,
            diagnostics: bool = True, workdir: Path | None = None) -> dict[str, Any]:
    """Median CPU and wall seconds per sample of each arm, MB/s and the zarr/raw throughput ratio.

    Arms, rotated every repeat: `raw` (np.save), `workbench` (StoreWriter.write_sample), and with
    `diagnostics` the hidden array alone appended through zarr's API with StoreWriter's codec and
    chunks (`zarr_api_lz4`), the same after the full `astype` copy `StoreWriter._append` makes
    (`zarr_api_lz4_astype`), and uncompressed (`zarr_api_uncompressed`)."""
    import zarr

    from workbench.store import StoreWriter, _chunks

    arrays = [bf16_valued((tokens, layers, dim), seed) for seed in range(2)]
    mb = arrays[0].nbytes / 1e6
    chunks = _chunks((0, layers, dim), 4, "token")
    with tempfile.TemporaryDirectory(prefix="bench-store-", dir=workdir) as tmp:
        tmp = Path(tmp)
        raw_dir = tmp / "raw"
        raw_dir.mkdir()

        def raw(i: int) -> None:
            np.save(raw_dir / f"s{i}.npy", arrays[i % 2])

        def zarr_api(name: str, compressors: Any, copy: bool = False) -> Any:
            group = zarr.open_group(tmp / f"{name}.zarr", mode="w", zarr_format=3)
            array = group.create_array("hidden", shape=(0, layers, dim), chunks=chunks, dtype="float32",
                                       compressors=compressors, fill_value=None)

            def append(i: int) -> None:
                n = array.shape[0]
                array.resize((n + tokens, layers, dim))
                data = arrays[i % 2]
                array[n:n + tokens] = data.astype(np.float32) if copy else data
            return append

        with StoreWriter(tmp / "store.zarr") as store:
            store.ensure_model("bench", {"family": "benchmark"})

            def workbench(i: int) -> None:
                store.write_sample("bench", "baseline", f"s{i}", sample_variables(arrays[i % 2]))

            arms = {"raw": raw, "workbench": workbench}
            if diagnostics:
                arms["zarr_api_lz4"] = zarr_api("lz4", zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"))
                arms["zarr_api_lz4_astype"] = zarr_api("lz4copy", zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"), copy=True)
                arms["zarr_api_uncompressed"] = zarr_api("none", None)
            times = interleave_many(arms, repeats, warmup, between=os.sync)
            store.finish_run()  # compacts: the chunks left on disk are the live ones
        stored = _disk_bytes(tmp / "store.zarr" / "chunks")
        raw_bytes = _disk_bytes(raw_dir)
    med = {name: {k: median(v) for k, v in t.items()} for name, t in times.items()}
    out: dict[str, Any] = {
        "shape": [tokens, layers, dim],
        "mb_per_sample": round(mb, 1),
        "chunks": list(chunks),
        "repeats": repeats,
        "arms": {name: {"cpu_s": [round(x, 4) for x in t["cpu"]], "wall_s": [round(x, 4) for x in t["wall"]],
                        "cpu_median_s": round(med[name]["cpu"], 4), "wall_median_s": round(med[name]["wall"], 4),
                        "mb_per_s": round(mb / med[name]["cpu"], 1), "mb_per_s_wall": round(mb / med[name]["wall"], 1)}
                 for name, t in times.items()},
        "zarr_mb_per_s": round(mb / med["workbench"]["cpu"], 1),
        "raw_mb_per_s": round(mb / med["raw"]["cpu"], 1),
        "throughput_ratio": round(med["raw"]["cpu"] / med["workbench"]["cpu"], 4),
        "throughput_ratio_wall": round(med["raw"]["wall"] / med["workbench"]["wall"], 4),
        "noise": round(spread(times["raw"]["cpu"]) + spread(times["workbench"]["cpu"]), 4),
        "stored_fraction": round(stored / raw_bytes, 3) if raw_bytes else None,
    }
    if diagnostics:
        out["diagnostics"] = _codec_costs(arrays, repeats=max(3, repeats // 2))
    return out


def _codec_costs(arrays: list[np.ndarray], repeats: int) -> dict[str, Any]:
    """CPU seconds per sample of the in-memory pieces of an append (no I/O): the Blosc lz4+shuffle
    encode of every chunk, and the full copy `StoreWriter._append` makes with `astype`."""
    from numcodecs import Blosc

    tokens, layers, dim = arrays[0].shape
    blosc = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)
    per_layer = np.ascontiguousarray(arrays[0].transpose(1, 0, 2))  # a chunk holds one layer's rows
    encode, copy = [], []
    for _ in range(repeats):
        start = cpu_time()
        compressed = sum(len(blosc.encode(per_layer[layer])) for layer in range(layers))
        encode.append(cpu_time() - start)
        start = cpu_time()
        arrays[0].astype(np.float32)
        copy.append(cpu_time() - start)
    return {
        "blosc_lz4_encode_cpu_s": round(median(encode), 4),
        "astype_copy_cpu_s": round(median(copy), 4),
        "lz4_compressed_fraction": round(compressed / arrays[0].nbytes, 3),
    }


def _raise_mmap_threshold() -> bool:
    """The allocator settings `workbench run` applies (see `workbench.runner.tune_allocator`)."""
    from workbench.runner import tune_allocator

    return tune_allocator()


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.store_write --out X.json [--mallopt]`: the section in its own process
    (the benchmark runner uses it for the variant with glibc's mmap threshold raised)."""
    import argparse
    import json

    from .common import pin_threads

    parser = argparse.ArgumentParser(prog="python -m benchmarks.store_write")
    parser.add_argument("--out", required=True)
    parser.add_argument("--mallopt", action="store_true", help="raise glibc's mmap/trim thresholds first")
    parser.add_argument("--shape", default="600,29,2048")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    applied = _raise_mmap_threshold() if args.mallopt else False
    tokens, layers, dim = (int(x) for x in args.shape.split(","))
    result = measure(tokens, layers, dim, repeats=args.repeats)
    result["mallopt"] = {"requested": args.mallopt, "applied": applied,
                         "M_MMAP_THRESHOLD": 1 << 30 if applied else None, "M_TRIM_THRESHOLD": (1 << 31) - 1 if applied else None}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
