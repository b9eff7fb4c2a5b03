"""`attn_heads`: decoder layer l's attention output per head, before the output projection: the
input of self-attention's `o_proj` (batch, seq, heads · head_dim), head h's output at columns
h·d .. (h+1)·d − 1 (d = `ModelInfo.head_dim`), the heads' outputs concatenated as transformers'
attention forwards make them (`attn_output.reshape(*input_shape, -1)`, e.g. transformers 5.x
models/llama/modeling_llama.py, LlamaAttention.forward). `o_proj` is linear, so what head h adds to
the residual stream is o_proj's weight columns of that slice times it: a `patch` with `heads`
replaces one head's contribution and leaves the others'. Read through `.source`
(`Architecture.output_projection_call`), like `keys_pre`: nnsight serves no `.source` operation of
a forward once a submodule inside it was requested."""

from __future__ import annotations

from typing import Any

from ..models.protocol import ModelLike
from .base import Site, register_site


def tensor(model: ModelLike, layer: int) -> Any:
    return getattr(model.decoder_layers()[layer].self_attn.source, model.arch.output_projection_call).input


# phase 3.5: after the attention call's read (`attention`, 3), before the branch's output (`attn_out`, 4)
register_site(Site("attn_heads", 4, index="decoder_layer", editable=True, access="heads", phase=3.5, tensor=tensor))
