"""`vision`: the vision tower's output as the connector receives it, one row per patch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..models.protocol import ModelLike
from .base import Site, first_tensor, register_site
from .readers import PatchCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan


def tensor(model: ModelLike, layer: int | None) -> Any:
    path, end = cast("tuple[str, str]", model.arch.vision_output)  # a vision site: the model has a tower
    envoy = model.module(path)[0]
    # the connector's input (most families) or the tower's output (InternVL: before its CLS
    # row is dropped and the pixel shuffle)
    return envoy.input if end == "input" else first_tensor(envoy.output)


def capture(plan: CapturePlan, layers: None) -> None:
    plan.outputs += (PatchCapture("vision"),)


register_site(Site("vision", 2, vision=True, stores={"vision": ("vision_patch", "vision_dim")}, editable=True,
                   access="patches", tensor=tensor, capture=capture))
