"""`embed_lens`: per position and residual layer l, the `k` rows of the input embedding table
nearest to h_l by cosine (their token ids and cosines), computed in the trace from the embedding
module's weight (analyses never load weights): the embedding-table half of a LatentLens-style
text-neighbour readout (Krojer et al. 2026, arXiv 2602.00462; the contextual half reads the
stored `hidden` of text tokens, `analyses.neighbours`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..records import Record
from .base import Site, read_order, register_site, residual_envoy, running_layer, token_rows
from .readers import saved_copy

if TYPE_CHECKING:
    from ..capture import CapturePlan

if TYPE_CHECKING:  # torch is imported where a reader runs: `analyses` reads the site registry
    import torch  # (dims, phases) where torch is not installed


EMBED_TOP_K = 10  # embedding rows kept per (position, layer)


class EmbeddingLensCapture(Record):
    """At each listed residual layer l: cos(h_l(t), E_v) = h·E_v / (‖h‖ ‖E_v‖) in float32 for every
    row v of the input embedding table E (the module's weight; a scale the module applies to its
    output, Gemma-3's `embed_scale`, changes no cosine), and its top `k` rows per position, the
    nearest first. A zero row or state has no direction: its cosines are 0."""

    layers: tuple[int, ...]
    k: int
    _fields = ("layers", "k")
    _defaults = {"k": EMBED_TOP_K}
    rows = "tokens"
    site = "embed_lens"

    def targets(self) -> list[tuple[tuple[int, int, float], int]]:
        return [(read_order(self.site, l), l) for l in self.layers]

    def read(self, model: Any, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        import torch
        hidden = token_rows(residual_envoy(model, running_layer(model, layer, inputs)).input, row)[0]
        table = model.module(model.arch.embed)[0].weight
        rows = torch.nn.functional.normalize(table.detach().to(torch.float32), dim=-1)
        states = torch.nn.functional.normalize(hidden.detach().to(torch.float32), dim=-1)
        cos = states @ rows.to(states.device).T
        top = torch.topk(cos, min(self.k, cos.shape[-1]), dim=-1)
        saved.setdefault(("embed_nn_ids", layer), []).append(top.indices.detach().clone())
        saved.setdefault(("embed_nn_cos", layer), []).append(saved_copy(top.values))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{embed_nn_ids, embed_nn_cos: (token, layer, embed_rank)}; a prompt over two traces is joined."""
        import torch
        return {name: torch.stack([torch.cat(merged[(name, l)], dim=0) for l in self.layers], dim=1).numpy()
                for name in ("embed_nn_ids", "embed_nn_cos")}


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.outputs += (EmbeddingLensCapture(layers),)


register_site(Site("embed_lens", 4, index="layer", access="head", capture=capture,
                   stores={"embed_nn_ids": ("token", "layer", "embed_rank"),
                           "embed_nn_cos": ("token", "layer", "embed_rank")}))
