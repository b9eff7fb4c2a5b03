"""`vision_layer`: the output of each listed vision-tower layer (its own index 0..V-1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..models.protocol import ModelLike
from .base import Site, first_tensor, register_site
from .readers import PatchCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan
    from ..models.architectures import Architecture


def tensor(model: ModelLike, layer: int | None) -> Any:
    return first_tensor(model.module(cast(str, model.arch.vision_layers))[0][layer].output)  # a vision site: a tower


def check(arch: Architecture) -> str | None:
    return None if arch.vision_layers else (f"{arch.family} declares no vision-tower layers whose rows are its "
                                            "patches; expected vision (the tower's output)")


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.outputs += (PatchCapture("vision_layer", layers),)


register_site(Site("vision_layer", 1, index="vision_layer", vision=True,
                   stores={"vision_hidden": ("vision_patch", "vision_layer", "vision_dim")}, editable=True,
                   access="patches", tensor=tensor, capture=capture, check=check))
