"""Appending a block of rows to a condition's arrays through zarr's public API (`Group.create_array`,
`Array.resize`, slice assignment), one call per array.

Throughput comes from the size of what one call writes, not from going around zarr: the
background writer gathers many results into one commit (`workbench.writer`), and `_write_once`
joins the results of one condition into one block, so each array gets one resize and one
assignment per commit however many results the commit holds.

An append that starts inside a chunk (the array's partial last chunk) is assigned from that
chunk's start, with the committed rows before it (the array's *tail*, kept in memory by the
writer): zarr then takes the chunk as wholly given (zarr 3.1.6 zarr/core/indexing.py,
`SliceDimIndexer`: `is_complete_chunk` holds for a selection from the chunk's start to the
array's end) and encodes it without reading and decoding the stored one. Arrays whose chunk row is
large keep zarr's own merge (a read of the stored chunk): their bytes are the cost there, and a
tail kept in memory would raise the writer's peak memory."""

from __future__ import annotations

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from .layout import _CHUNK_BYTES, Variable, _array_layout
from .staging import _Layout

# Arrays whose chunk row is at most this many bytes keep their tail in memory (labels; a tiny
# model's captures: 8 MiB; a 2B model's chunk row spans every layer, ~50 MB, and keeping it
# raised the peak RSS of benchmarks section 4 by 70-270 MB at 16 samples)
_TAIL_ARRAY_BYTES = 4 * _CHUNK_BYTES


def append_block(group: zarr.Group, arrays: dict[str, zarr.Array], rows: dict[str, Variable], layout: _Layout,
                 tails: dict[str, np.ndarray]) -> None:
    """Create or resize and write every array of `rows` at the layout's offsets. `arrays`: the
    group's arrays opened in this session (added to here); `tails`: each array's committed rows
    after its last chunk boundary, as far as known (updated here)."""
    for var in rows.values():
        for dim, values in var.coords.items():
            if dim not in layout.coords and dim not in arrays:
                values = np.asarray(values)
                coord = group.create_array(dim, shape=values.shape, dtype=values.dtype, dimension_names=[dim],
                                           compressors=[Crc32cCodec()])
                coord[:] = values
                arrays[dim] = coord
    for name, var in rows.items():
        _append(group, arrays, name, var, layout.offsets[var.dims[0]], tails)


def _append(group: zarr.Group, arrays: dict[str, zarr.Array], name: str, var: Variable, offset: int,
            tails: dict[str, np.ndarray]) -> None:
    data = np.asarray(var.data)
    end = offset + data.shape[0]
    known = arrays.get(name)
    new = known is None
    if known is None:  # made at its final shape: rows before `offset` read as fill values
        array = arrays[name] = group.create_array(name, **{**_array_layout(name, var), "shape": (end,) + data.shape[1:]})
    else:
        array = known
        array.resize((end,) + data.shape[1:])
    data, first = _as_stored(data, array), offset
    chunk = array.chunks[0]
    start = offset - offset % chunk
    kept = chunk * (data.nbytes // max(1, len(data))) <= _TAIL_ARRAY_BYTES
    if kept and not new and start < offset:  # the partial last chunk written whole, from its start
        tail = tails.get(name)
        if tail is None or len(tail) != offset - start:  # not kept: read back once
            tail = np.asarray(array[start:offset])
        data, first = np.concatenate([np.asarray(tail, dtype=data.dtype), data]), start
    array[first:end] = data
    boundary = end - end % chunk
    if kept and boundary >= first:
        tails[name] = data[boundary - first:].copy()  # a copy: a view would keep the whole block alive
    else:
        tails.pop(name, None)


def _as_stored(data: np.ndarray, array: zarr.Array) -> np.ndarray:
    if data.dtype.kind in "USO":
        return data.astype(object)
    if data.dtype != array.dtype:  # no copy when the capture already is float32
        return data.astype(array.dtype)
    return data
