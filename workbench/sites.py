"""Named sites: where in the forward pass a site lives, and in which order sites run.

nnsight requires every request of one trace in execution order, so every operation (capture or
intervention) carries an `order` key built here, and the backend sorts operations by it.

Residual-stream convention, the same for every architecture: `layer` index 0 is the LLM input (the
embedding sequence after image features are scattered in); index l >= 1 is the residual stream
after l decoder layers have run (before the final norm; for Qwen3-VL after the DeepStack add, since
it is what decoder layer l receives). With L decoder layers the indices are 0..L: index l < L is
read at the input of decoder layer l, index L at the input of the final norm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# stage of each site in one forward: embeddings, vision tower, projector, decoder, head
SITE_STAGE = {
    "embed": 0,
    "vision": 1,
    "projector.merger": 2,
    "projector": 2,
    "layer": 3,
    "attention": 3,
    "keys": 3,
    "values": 3,
    "final_norm": 4,
    "logits": 5,
}
VISION_SITES = ("vision", "projector", "projector.merger")
PER_LAYER_SITES = ("layer", "attention", "keys", "values")


def order(site: str, layer: int | None = None, phase: int = 0) -> tuple[int, int, int]:
    """Execution-order key: stage, then layer, then phase (0 intervene before 1 capture)."""
    return (SITE_STAGE[site], -1 if layer is None else layer, phase)


def batch_rows(tensor: Any, row: tuple[int, int] | None) -> Any:
    """The rows of batch row `row` = (index, of) in `tensor`, a view (in-place edits reach the
    forward). Batched runs stack conditions with the same token sequence, so each batch row owns
    an equal block of a tensor's first dimension: one row of a (batch, seq, dim) stream, or
    n_vision_tokens rows of Qwen's flat (batch * tokens, dim) merger output. A first dimension
    of 1 is shared by every row (a broadcast mask). None: the whole tensor (unbatched)."""
    if row is None or tensor.shape[0] == 1:
        return tensor
    index, of = row
    block = tensor.shape[0] // of
    return tensor[index * block:(index + 1) * block]


def residual_envoy(model: Any, layer: int) -> Any:
    """The envoy whose `.input` is the residual stream at `layer` (see the convention above)."""
    if layer < model.n_layers:
        return model.decoder_layers()[layer]
    return model.module(model.arch.final_norm)[0]


def position_index(positions: str | list[int] | tuple[int, ...], modality: np.ndarray) -> np.ndarray:
    """Sequence positions selected by a spec's `positions` (a modality name, `all`, or indices)."""
    n = modality.shape[0]
    if isinstance(positions, str):
        if positions == "all":
            return np.arange(n)
        return np.flatnonzero(modality == positions)
    index = np.asarray(list(positions), dtype=np.int64)
    if (index >= n).any():
        raise IndexError(f"positions {index[index >= n].tolist()} out of range for a sequence of {n} tokens")
    return index
