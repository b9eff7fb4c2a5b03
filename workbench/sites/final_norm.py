"""`final_norm`: the final norm's output, what the LM head reads (token, dim)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from .base import Site, register_site
from .readers import ModuleOutputCapture

if TYPE_CHECKING:
    from ..capture import CapturePlan


def tensor(model: ModelLike, layer: int | None) -> Any:
    return model.module(model.arch.final_norm)[0].output


def capture(plan: CapturePlan, layers: None) -> None:
    plan.outputs += (ModuleOutputCapture("final_norm"),)


register_site(Site("final_norm", 5, stores={"final_norm": ("token", "dim")}, access="sequence", tensor=tensor,
                   capture=capture))
