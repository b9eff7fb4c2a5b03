"""How a store lays out its arrays: the per-sample `Variable`, chunk shapes, dtypes and codecs,
and the writer's own chunk encoding of small appends.

The encoding (`_new_array_metadata`, `_encoded_appends`, `_encoded_chunks`) uses zarr's
private codec pipeline (`zarr.core.*`, `codec._encode_sync`; zarr 3.1.6): measured here as
most of a small commit's cost otherwise (see `StoreWriter._append_all`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import zarr


MODALITIES = ("vision", "boundary", "text")


# ~2 MiB of rows per chunk. 512 KiB was measured (Qwen3-VL-2B-sized captures, alternating
# stores): a sample's write 0.73x the CPU (a commit re-encodes less of each partial last chunk),
# but an analysis pass over the store 1.45x (4x the chunks read, ~0.85 ms each): not kept
_CHUNK_BYTES = 2 * 1024 * 1024
# the writer's own chunk encoding (`_encoded_appends`) sets chunks in batches of about this many bytes
_ENCODED_BATCH_BYTES = 32 << 20


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
    if data.dtype.kind in "USO":
        return str
    if data.dtype.kind == "f":
        return np.float32
    return data.dtype


def _array_layout(name: str, var: Variable) -> dict[str, Any]:
    """create_array keywords of a new variable: dtype, chunks, codecs (checksum last)."""
    data = np.asarray(var.data)
    dtype = _storage_dtype(data)
    itemsize = 4 if dtype is str else np.dtype(dtype).itemsize
    compressors: list[Any] = []
    if dtype is not str and np.dtype(dtype).kind == "f":
        compressors.append(zarr.codecs.BloscCodec(cname="lz4", clevel=1, shuffle="shuffle"))
    compressors.append(zarr.codecs.Crc32cCodec())  # every chunk carries its checksum
    return {"shape": (0,) + data.shape[1:], "chunks": _chunks((0,) + data.shape[1:], itemsize, var.dims[0]),
            "dtype": dtype, "dimension_names": list(var.dims), "compressors": compressors}


# the zarr metadata of a new, empty array, by its layout: zarr builds one in ~3 ms of Python (codec
# parsing and validation), paid once per process here instead of once per array of every
# condition (an alpha sweep's 8 conditions create ~100 arrays of a few layouts)
_NEW_ARRAYS: dict[tuple, Any] = {}


async def _new_array_metadata(name: str, var: Variable) -> Any:
    """The metadata `_array_layout` gives `var` as a new array named `name` (shape 0 rows),
    built once per layout in a memory store and reused: metadata objects are immutable."""
    from zarr.core.array import init_array
    from zarr.storage import MemoryStore, StorePath

    layout = _array_layout(name, var)
    key = (name, repr(sorted(layout.items())))
    if key not in _NEW_ARRAYS:
        _NEW_ARRAYS[key] = (await init_array(store_path=StorePath(MemoryStore(), name), **layout)).metadata
    return _NEW_ARRAYS[key]


async def _encoded_appends(writes: list[tuple[Any, Any, int, np.ndarray]]) -> None:
    """Write appends without zarr's per-call machinery: each (metadata with the new shape, the
    array's store path, first row, rows through the array's end). Every array's new metadata is
    set in the store first, then its chunks, encoded here by the array's own codecs (zarr's
    synchronous encoders, as its pipeline calls them) and set concurrently in batches of about
    _ENCODED_BATCH_BYTES, so that the encoded copy in memory stays bounded."""
    from zarr.core.buffer import default_buffer_prototype

    prototype = default_buffer_prototype()
    # the new shapes first: a chunk beyond an array's stored shape would be refused
    await _settled([(path / key).set(buf) for meta, path, _, _ in writes
                    for key, buf in meta.to_buffer_dict(prototype).items()])
    batch, size = [], 0
    for meta, path, start, data in writes:
        for key, encoded in _encoded_chunks(meta, start, data, prototype):
            batch.append((path / key).set(encoded))
            size += len(encoded)
            if size >= _ENCODED_BATCH_BYTES:
                await _settled(batch)
                batch, size = [], 0
    await _settled(batch)


def _encoded_chunks(meta: Any, start: int, data: np.ndarray, prototype: Any) -> Iterator[tuple[str, Any]]:
    """(chunk key, encoded bytes) of every chunk that rows `data`, written from row `start` (a
    chunk boundary) to the array's end, touch. No stored rows need merging: an edge chunk is
    padded with the fill value as zarr pads it, and every chunk is written, as
    `array.write_empty_chunks` asks."""
    from zarr.core.array_spec import ArrayConfig
    from zarr.core.codec_pipeline import codecs_from_list, fill_value_or_default
    from zarr.core.indexing import BasicIndexer

    config = ArrayConfig.from_dict({})
    array_array, array_bytes, bytes_bytes = codecs_from_list(meta.codecs)
    value = data.astype(meta.data_type.to_native_dtype(), copy=False) if data.dtype.kind == "O" else data
    selection = (slice(start, start + len(data)),) + (slice(None),) * (data.ndim - 1)
    for coords, chunk_selection, out_selection, _ in BasicIndexer(selection, meta.shape, meta.chunk_grid):
        spec = meta.get_chunk_spec(coords, config, prototype)
        rows = value[out_selection]
        if rows.shape != spec.shape:  # an edge chunk: padded as zarr pads it
            encoded = prototype.nd_buffer.create(shape=spec.shape, dtype=spec.dtype.to_native_dtype(),
                                                 order=spec.order, fill_value=fill_value_or_default(spec))
            encoded[chunk_selection] = prototype.nd_buffer.from_ndarray_like(rows)
        else:
            encoded = prototype.nd_buffer.from_ndarray_like(np.ascontiguousarray(rows))
        for codec in array_array:
            encoded, spec = codec._encode_sync(encoded, spec), codec.resolve_metadata(spec)
        encoded, spec = array_bytes._encode_sync(encoded, spec), array_bytes.resolve_metadata(spec)
        for codec in bytes_bytes:
            encoded, spec = codec._encode_sync(encoded, spec), codec.resolve_metadata(spec)
        yield meta.encode_chunk_key(coords), encoded


async def _settled(writes: list[Any]) -> None:
    """Await every write, then raise the first failure: a write still in flight in the store's
    threads when the error reaches the caller (who may then exit) can abort the interpreter."""
    import asyncio

    for outcome in await asyncio.gather(*writes, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome
