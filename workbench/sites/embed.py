"""`embed`: the token embeddings, before image features are scattered in (token, dim)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from .base import Site, register_site
from .readers import ModuleOutputCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan


def tensor(model: ModelLike, layer: int | None) -> Any:
    return model.module(model.arch.embed)[0].output


def capture(plan: CapturePlan, layers: None) -> None:
    plan.outputs += (ModuleOutputCapture("embed"),)


register_site(Site("embed", 0, stores={"embed": ("token", "dim")}, editable=True, access="sequence", tensor=tensor,
                   capture=capture))
