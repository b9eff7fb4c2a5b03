"""`cross_kv`: the keys and values of each listed cross-attention layer (Mllama's), one row per
vision token: the projected image as that layer's attention reads it (K after k_norm; no RoPE
on either), heads kept apart. Rows are the tower output's rows (`vision`: every tile's patches
and CLS), so they share the store's `vision_patch` dim. Read inside the prompt forward, from
the layer's `k_norm` and `v_proj` outputs (transformers 5.25 models/mllama/modeling_mllama.py
`MllamaTextCrossAttention.forward`: these are what the cache holds and the attention reads);
decode steps reuse the cached ones, and a run without an image has none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..models.protocol import ModelLike
from ..records import Record
from .base import Site, batch_rows, read_order, register_site
from .readers import saved_copy

if TYPE_CHECKING:  # torch is imported where a reader runs
    import torch


def check(arch: Any) -> str | None:
    return None if arch.cross_attention_layers else (f"{arch.family} has no cross-attention layers (its image "
                                                     "is in the token sequence); expected keys / values")


class CrossKVCapture(Record):
    """K and V of each listed cross-attention layer, (vision token, layer, head, head dim)."""

    _fields = ("layers",)
    layers: tuple[int, ...]
    prompt_only = True
    rows = "patches"
    site = "cross_kv"

    def targets(self) -> list[tuple[tuple[int, int, float], int]]:
        return [(read_order("cross_kv", l), l) for l in self.layers]

    def read(self, model: ModelLike, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        if "pixel_values" not in inputs.encoding:
            return
        attention = model.decoder_layers()[layer].cross_attn
        # in execution order: v_proj runs before k_norm
        values = batch_rows(attention.v_proj.output, row)[0]          # (vision tokens, kv_heads * head_dim)
        keys = batch_rows(attention.k_norm.output, row)[0]           # (kv_heads, vision tokens, head_dim)
        heads, _, head_dim = keys.shape
        saved[("cross_keys", layer)] = [saved_copy(keys.transpose(0, 1))]
        saved[("cross_values", layer)] = [saved_copy(values.reshape(values.shape[0], heads, head_dim))]

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        import torch
        if ("cross_keys", self.layers[0]) not in merged:
            return {}
        return {name: torch.stack([merged[(name, l)][0] for l in self.layers], dim=1).numpy()
                for name in ("cross_keys", "cross_values")}


def capture(plan: Any, layers: tuple[int, ...]) -> None:
    plan.outputs += (CrossKVCapture(layers),)


register_site(Site("cross_kv", 4, index="cross_layer", vision=True, access="cache", phase=2, capture=capture,
                   check=check, stores={"cross_keys": ("vision_patch", "cross_layer", "head", "head_dim"),
                                        "cross_values": ("vision_patch", "cross_layer", "head", "head_dim")}))
