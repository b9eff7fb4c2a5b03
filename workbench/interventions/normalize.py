"""`normalize`: rescale every projector output token to L2 norm `target`: x * target / ‖x‖.

The default target is the mean L2 norm of the model's text-token embeddings (the rows of the
input embedding matrix), resolved from the model before the run; it is the inference-time
counterpart of a post-projector LayerNorm with gain T/√D."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import torch
from pydantic import PlainValidator

from ..extend import KindSpec, register_intervention
from ..models.protocol import ModelLike
from ..spec.fields import Site, Swept, _normalize_target
from .base import Intervention

# rows of the LLM's width, all of them vision tokens
SITES = ("projector", "projector.merger")


class NormalizeSpec(KindSpec):
    kind: Literal["normalize"]
    site: Site = "projector"
    target: Annotated[Union[float, str], PlainValidator(_normalize_target), Swept("number")] = "text_embedding_mean"


@register_intervention(NormalizeSpec, sites=SITES)
class Normalize(Intervention):
    """Rescale every projector output token to L2 norm `target`."""

    target: str | float
    _fields = Intervention._fields + ("target",)
    _defaults = {**Intervention._defaults, "target": "text_embedding_mean"}

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        return x * (float(self.target) / norm)

    def resolve(self, model: ModelLike) -> "Normalize":
        return self.replace(target=model.text_embedding_norm()) if isinstance(self.target, str) else self

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Normalize":
        return cls(**{**common, "positions": "all"}, target=raw.target)  # every projector row
