"""`layer.pre_deepstack`: h_l before DeepStack's add (families with DeepStack only): decoder layer
l-1's own output; index 0 is the LLM input."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from .base import LAYER_OUTPUT_PHASE, Site, first_tensor, order, register_site, residual_envoy
from .readers import LayerOutputCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan


def tensor(model: ModelLike, layer: int) -> Any:
    if layer == 0:  # the LLM input (no DeepStack add before it)
        return residual_envoy(model, 0).input
    return first_tensor(model.decoder_layers()[layer - 1].output)


def read_key(layer: int) -> tuple[int, int, float]:
    """l >= 1 is read at decoder layer l-1's output (after that layer's inside, before layer l's input)."""
    return order("layer.pre_deepstack", layer - 1, LAYER_OUTPUT_PHASE) if layer else order("layer.pre_deepstack", 0, 1)


def check(arch: Any) -> str | None:
    return None if arch.deepstack else f"{arch.family} has no DeepStack (its h_l has no add to read before); expected layer"


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.outputs += (LayerOutputCapture("layer.pre_deepstack", layers),)


register_site(Site("layer.pre_deepstack", 4, index="layer", stores={"hidden_pre_deepstack": ("token", "layer", "dim")},
                   access="sequence", tensor=tensor, capture=capture, check=check, read_key=read_key))
