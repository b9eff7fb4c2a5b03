"""`mlp_out`: what decoder layer l's MLP branch adds to the residual stream, before the add
(`Architecture.branch_outputs`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from .base import Site, branch_output, register_site
from .readers import LayerOutputCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan


def tensor(model: ModelLike, layer: int) -> Any:
    return branch_output(model, "mlp_out", layer)


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.outputs += (LayerOutputCapture("mlp_out", layers),)


register_site(Site("mlp_out", 4, index="decoder_layer", stores={"mlp_out": ("token", "decoder_layer", "dim")},
                   editable=True, access="branch", phase=5, tensor=tensor, capture=capture))
