"""`keys_pre`: inside decoder layer l, the key projection's output (before k_norm and RoPE:
W_K·Norm(h)), heads flattened like `keys`. Read through `.source` (`Architecture.key_projection_call`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from .base import Site, register_site
from .readers import LayerOutputCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan


def tensor(model: ModelLike, layer: int) -> Any:
    return getattr(model.decoder_layers()[layer].self_attn.source, model.arch.key_projection_call).output


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.outputs += (LayerOutputCapture("keys_pre", layers),)


register_site(Site("keys_pre", 4, index="decoder_layer", stores={"keys_pre": ("token", "decoder_layer", "kv")},
                   access="source", phase=2, tensor=tensor, capture=capture))
