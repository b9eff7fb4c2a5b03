"""How a store lays out its arrays: the per-sample `Variable`, chunk shapes, dtypes and codecs
(the keywords of zarr's public `Group.create_array`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from ..names import GEOMETRY


MODALITIES = ("vision", "boundary", "text")


# ~2 MiB of rows per chunk. 512 KiB was measured (Qwen3-VL-2B-sized captures, alternating
# stores): a sample's write 0.73x the CPU (a commit re-encodes less of each partial last chunk),
# but an analysis pass over the store 1.45x (4x the chunks read, ~0.85 ms each): not kept
_CHUNK_BYTES = 2 * 1024 * 1024


# Skipping "empty" chunks compares every chunk with the fill value: 4-6x slower writes. Applied
# per write (a context), not process-wide.
_ZARR_WRITE_CONFIG = {"array.write_empty_chunks": True}


@dataclass
class Variable:
    """One captured array for one sample. `dims[0]` is "token" (per position), "vision_patch" (per
    vision-tower row) or "run" (one row per sample); `coords` labels the other dims (e.g.
    {"layer": [0, 1, 2]})."""

    dims: tuple[str, ...]
    data: np.ndarray
    coords: dict[str, np.ndarray] = field(default_factory=dict)


def _chunk_rows(row_shape: tuple[int, ...], itemsize: int, floor: int) -> int:
    row_bytes = max(1, int(np.prod(row_shape[-1:], dtype=np.int64)) * itemsize)
    rows = 2 ** int(np.floor(np.log2(max(1, _CHUNK_BYTES // row_bytes))))
    return int(min(max(rows, floor), 65536))
_LABEL_CHUNK = {"token": 4096, "run": 256}
# the row dim of vision-tower captures (one row per patch, before the connector merges them)
PATCH_DIM = "vision_patch"


def _chunks(shape: tuple[int, ...], itemsize: int, leading: str) -> tuple[int, ...]:
    # first dim: ~2 MiB worth of rows; middle dims one at a time (a layer per chunk); last whole.
    # Per-run rows can be large (a vocabulary of log-probs): no floor on their count, or every
    # append would rewrite a huge partial chunk. 1-D labels: a few thousand rows, since every
    # append rewrites the partial last chunk (and a transactional store keeps the old one until
    # compaction).
    if len(shape) == 1:
        return (_LABEL_CHUNK.get(leading, 4096),)
    middle = (1,) * max(0, len(shape) - 2)
    last = (shape[-1],) if len(shape) >= 2 else ()
    floor = 64 if leading == "token" else 1
    return (_chunk_rows(shape, itemsize, floor),) + middle + tuple(max(1, s) for s in last)


def _storage_dtype(data: np.ndarray) -> Any:
    if data.dtype.kind in "USOT":  # T: numpy's StringDType, as zarr reads strings back
        return str
    if data.dtype.kind == "f":
        return np.float32
    return data.dtype


def _array_layout(name: str, var: Variable) -> dict[str, Any]:
    """create_array keywords of a new variable: dtype, chunks, codecs (checksum last)."""
    data = np.asarray(var.data)
    dtype = _storage_dtype(data)
    itemsize = 4 if dtype is str else np.dtype(dtype).itemsize
    # Every array is compressed: an edge chunk is stored padded to the full chunk with the fill
    # value (zarr pads it so), and the padding must cost next to nothing on disk. Strings go
    # through zstd (blosc needs a fixed item size)
    compressors: list[Any] = [ZstdCodec(level=1) if dtype is str else
                              BloscCodec(cname="lz4", clevel=1, shuffle="shuffle")]
    compressors.append(Crc32cCodec())  # every chunk carries its checksum
    layout = {"shape": (0,) + data.shape[1:], "chunks": _chunks((0,) + data.shape[1:], itemsize, var.dims[0]),
              "dtype": dtype, "dimension_names": list(var.dims), "compressors": compressors}
    if name == GEOMETRY:  # rows stored before the array (a store written before geometry, resumed) read as none
        layout["fill_value"] = -1.0
    return layout
