"""`embed_table`: the input embedding table's row norms (what each token id embeds to), read from
the weights in the trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..models.protocol import ModelLike
from ..records import Record
from .base import Site, order, register_site, site
from .readers import saved_copy

if TYPE_CHECKING:
    from ..capture import CapturePlan

if TYPE_CHECKING:  # torch is imported where a reader runs: `analyses` reads the site registry
    import torch  # (dims, phases) where torch is not installed


class EmbeddingTableCapture(Record):
    """The row norms of the input embedding table (`embed_table`), read from the embedding
    module's weight inside the trace (so it works where the weights live, NDIF included), scaled
    as the module scales its output (`embed_scale`, Gemma-3)."""

    site: str
    _fields = ("site",)
    _defaults = {"site": "embed_table"}
    prompt_only = True
    rows = "run"

    def targets(self) -> list[tuple[tuple[int, int, float], None]]:
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        import torch
        envoy = model.module(model.arch.embed)[0]  # the same weights for every batch row
        norms = envoy.weight.detach().to(torch.float32).norm(dim=-1)
        scale = getattr(envoy, "embed_scale", None)
        if scale is not None:
            norms = norms * float(scale)
        saved[(self.site, None)] = [saved_copy(norms)]

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        return {cast(str, site(self.site).variable): merged[(self.site, None)][0][None].numpy()}




def capture(plan: CapturePlan, layers: None) -> None:
    plan.outputs += (EmbeddingTableCapture(),)


register_site(Site("embed_table", 0, stores={"embed_table_norms": ("run", "embed_row")}, access="weights",
                   capture=capture))
