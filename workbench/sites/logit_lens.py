"""`logit_lens`: the top-k of log_softmax(lm_head(final_norm(h_l))) per position and residual
layer l (with the family's scale or cap of the head's output, `ModelInfo.head_logits`), computed
in the trace (analyses never load weights)."""

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


LENS_TOP_K = 10  # tokens kept per (position, layer) by the logit lens


class LogitLensCapture(Record):
    """The logit lens at each listed residual layer l: the family's own final norm and LM head
    applied to h_l (nnsight's ad-hoc module call: it serves nothing and spends no occurrence of
    the real forward), log_softmax in float32, and its top `k` token ids and log-probabilities
    per position (rank 0 = the most likely). At l = L it is the model's own next-token
    distribution (the final norm's output through the head)."""

    layers: tuple[int, ...]
    k: int
    _fields = ("layers", "k")
    _defaults = {"k": LENS_TOP_K}
    rows = "tokens"
    site = "logit_lens"

    def targets(self) -> list[tuple[tuple[int, int, float], int]]:
        return [(read_order(self.site, l), l) for l in self.layers]

    def read(self, model: Any, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        import torch
        hidden = token_rows(residual_envoy(model, running_layer(model, layer, inputs)).input, row)[0]
        norm, head = model.module(model.arch.final_norm)[0], model.module(model.arch.lm_head)[0]
        logprobs = torch.log_softmax(model.info.head_logits(head(norm(hidden))).to(torch.float32), dim=-1)
        top = torch.topk(logprobs, min(self.k, logprobs.shape[-1]), dim=-1)
        saved.setdefault(("lens_ids", layer), []).append(top.indices.detach().clone())
        saved.setdefault(("lens_logprobs", layer), []).append(saved_copy(top.values))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{lens_ids, lens_logprobs: (token, layer, lens_rank)}; a prompt over two traces is joined."""
        import torch
        return {name: torch.stack([torch.cat(merged[(name, l)], dim=0) for l in self.layers], dim=1).numpy()
                for name in ("lens_ids", "lens_logprobs")}




def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.outputs += (LogitLensCapture(layers),)


register_site(Site("logit_lens", 4, index="layer", access="head", capture=capture,
                   stores={"lens_ids": ("token", "layer", "lens_rank"), "lens_logprobs": ("token", "layer", "lens_rank")}))
