"""`workbench merge` throughput against a plain copy of the same bytes.

Shard stores are written once (StoreWriter, like sharded runs of one spec: disjoint samples, the
same conditions and shard provenance); then, alternating, `merge_stores` into a new store and
`shutil.copytree` of the shard stores (the floor: the bytes moved without decoding). The ratio is
copy CPU time / merge CPU time (1.0 = as fast as a copy)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .common import interleave_many, median, spread
from .store_write import _disk_bytes, bf16_valued, sample_variables


def write_shards(folder: Path, shards: int, samples: int, shape: tuple[int, int, int]) -> list[Path]:
    from workbench.store import StoreWriter

    paths = []
    for k in range(shards):
        path = folder / f"shard{k}.zarr"
        with StoreWriter(path) as store:
            store.ensure_model("bench", {"family": "benchmark", "dtype": "float32", "device": "cpu"})
            store.add_provenance({"spec_name": "bench", "shard": [k, shards]})
            for i in range(k, samples, shards):
                for condition in ("baseline", "scaled"):
                    store.write_sample("bench", condition, f"s{i:03d}", sample_variables(bf16_valued(shape, i)),
                                       {"identity": {"condition": condition}})
            store.finish_run()
        paths.append(path)
    return paths


def measure(shards: int = 2, samples: int = 6, shape: tuple[int, int, int] = (300, 9, 1024), repeats: int = 3,
            workdir: Path | None = None) -> dict[str, Any]:
    from workbench.merge import merge_stores

    with tempfile.TemporaryDirectory(prefix="bench-merge-", dir=workdir) as tmp:
        tmp = Path(tmp)
        paths = write_shards(tmp, shards, samples, shape)
        shard_bytes = sum(_disk_bytes(p) for p in paths)

        def merge(i: int) -> None:
            out = tmp / f"merged{i}.zarr"
            merge_stores(out, paths, log=lambda _: None)
            shutil.rmtree(out)

        def copy(i: int) -> None:
            out = tmp / f"copy{i}"
            for p in paths:
                shutil.copytree(p, out / p.name)
            shutil.rmtree(out)

        times = interleave_many({"copy": copy, "merge": merge}, repeats, warmup=1, between=os.sync)
    med = {name: {k: median(v) for k, v in t.items()} for name, t in times.items()}
    mb = shard_bytes / 1e6
    return {
        "shards": shards, "samples": samples, "results": 2 * samples, "shape": list(shape), "repeats": repeats,
        "shard_mb": round(mb, 1),
        "copy_cpu_s": round(med["copy"]["cpu"], 4), "merge_cpu_s": round(med["merge"]["cpu"], 4),
        "copy_wall_s": round(med["copy"]["wall"], 4), "merge_wall_s": round(med["merge"]["wall"], 4),
        "ratio": round(med["copy"]["cpu"] / med["merge"]["cpu"], 4),
        "wall_ratio": round(med["copy"]["wall"] / med["merge"]["wall"], 4),
        "noise": round(spread(times["copy"]["cpu"]) + spread(times["merge"]["cpu"]), 4),
        "merge_mb_per_s": round(mb / med["merge"]["wall"], 1),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=1))
