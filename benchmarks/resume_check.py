"""The check at a run's start on a store that already holds many samples: reading every chunk
(what `workbench verify` does, and what every start did before the check was recorded) against
reading only the chunks committed since the last recorded check (`StoreWriter.repair` writes the
record, `<store>.verified`; see `workbench.verified`), one more sample having been committed since.

The first is proportional to the store, the second to what the last run added: the ratio falls
as the store grows. A resumed sweep pays the second at each start."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .common import interleave_many, median, spread
from .store_write import _disk_bytes, bf16_valued, sample_variables


def write_store(store: Path, samples: int, shape: tuple[int, int, int]) -> None:
    """`samples` samples in one run; then a run that records its start check and adds one more."""
    from workbench.store import StoreWriter

    with StoreWriter(store) as writer:
        writer.add_provenance({"spec_name": "bench", "run": 1})  # each run's record (and its run-<n> tag)
        for i in range(samples):
            writer.write_sample("bench", "baseline", f"s{i:04d}", sample_variables(bf16_valued(shape, i)))
        writer.finish_run()
    with StoreWriter(store) as writer:
        assert writer.repair(set()) == [] and writer.checked == "every chunk"
        writer.add_provenance({"spec_name": "bench", "run": 2})
        writer.write_sample("bench", "baseline", f"s{samples:04d}", sample_variables(bf16_valued(shape, samples)))
        writer.finish_run()


def measure(samples: int = 48, shape: tuple[int, int, int] = (300, 9, 1024), repeats: int = 3,
            workdir: Path | None = None) -> dict[str, Any]:
    from workbench.store import StoreWriter

    with tempfile.TemporaryDirectory(prefix="bench-resume-", dir=workdir) as tmp:
        store = Path(tmp) / "store.zarr"
        write_store(store, samples, shape)

        def every_chunk(i: int) -> None:
            with StoreWriter(store) as writer:
                assert writer.damage() == []

        def since_check(i: int) -> None:
            with StoreWriter(store) as writer:
                assert writer.damage_since_check() == [] and "since the last check" in writer.checked

        times = interleave_many({"every_chunk": every_chunk, "since_check": since_check}, repeats, warmup=1)
        store_mb = _disk_bytes(store) / 1e6
    med = {name: {k: median(v) for k, v in t.items()} for name, t in times.items()}
    return {
        "samples": samples + 1, "shape": list(shape), "repeats": repeats, "store_mb": round(store_mb, 1),
        "every_chunk_cpu_s": round(med["every_chunk"]["cpu"], 4), "since_check_cpu_s": round(med["since_check"]["cpu"], 4),
        "every_chunk_wall_s": round(med["every_chunk"]["wall"], 4), "since_check_wall_s": round(med["since_check"]["wall"], 4),
        "ratio": round(med["since_check"]["cpu"] / med["every_chunk"]["cpu"], 4),
        "wall_ratio": round(med["since_check"]["wall"] / med["every_chunk"]["wall"], 4),
        "noise": round(spread(times["every_chunk"]["cpu"]) + spread(times["since_check"]["cpu"]), 4),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=1))
