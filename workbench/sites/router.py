"""`router`: the router of each listed mixture-of-experts decoder layer (`Architecture.router`):
its logits over the experts and the experts it selects, per prompt position. The selected
experts are the top-k of the logits (k: the router's `top_k`), best first: Qwen3-VL-MoE takes the
top-k of softmax(logits), the same experts in the same order; Llama 4 the top-k of the logits
(transformers 5.25 models/qwen3_vl_moe/modeling_qwen3_vl_moe.py `Qwen3VLMoeTextTopKRouter`,
models/llama4/modeling_llama4.py `Llama4Router`). A dense layer of an interleaved model (no router
module) stores NaN logits and experts -1."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..records import Record
from .base import Site, read_order, register_site, token_rows
from .readers import saved_copy

if TYPE_CHECKING:  # torch is imported where a reader runs: `analyses` reads the site registry
    import torch  # (dims, phases) where torch is not installed

# inside a decoder layer the router runs in the MLP branch: after `attn_out` (4), before the MLP's
# output (`mlp_out`, 5) is read
ROUTER_PHASE = 4.5


def router_envoy(model: Any, layer: int) -> Any:
    """The router module of decoder layer `layer`, or None where the layer is dense."""
    envoy = model.decoder_layers()[layer]
    for attribute in model.arch.router.split("."):
        if not hasattr(envoy, attribute):
            return None
        envoy = getattr(envoy, attribute)
    return envoy


class RouterCapture(Record):
    """Router logits and selected experts of each listed decoder layer. Stored (token,
    decoder_layer, expert) and (token, decoder_layer, expert_rank)."""

    _fields = ("layers",)
    layers: tuple[int, ...]
    rows = "tokens"
    site = "router"

    def targets(self) -> list[tuple[tuple[Any, ...], int]]:
        return [(read_order(self.site, l), l) for l in self.layers]

    def read(self, model: Any, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        import torch
        envoy = router_envoy(model, layer)
        if envoy is None:  # a dense layer: nothing routed (filled in by `collect`)
            return
        logits = envoy.output[model.arch.router_logits]        # (batch * seq, experts): rows flattened
        batch = row.of if row is not None else 1
        logits = token_rows(logits.reshape(batch, -1, logits.shape[-1]), row)[0]
        saved.setdefault(("router_logits", layer), []).append(saved_copy(logits))
        chosen = torch.topk(logits.to(torch.float32), int(envoy.top_k), dim=-1).indices
        saved.setdefault(("router_experts", layer), []).append(chosen.detach().clone())

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{router_logits, router_experts: (token, decoder_layer, ...)}; a prompt over two traces is
        joined; a dense layer's rows are NaN logits and experts -1."""
        import torch
        routed = [l for l in self.layers if ("router_logits", l) in merged]
        if not routed:
            raise ValueError(f"none of decoder layers {list(self.layers)} has a router; expected MoE layers")
        out = {}
        for name, fill in (("router_logits", float("nan")), ("router_experts", -1)):
            per_layer = {l: torch.cat(merged[(name, l)], dim=0) for l in routed}
            like = per_layer[routed[0]]
            out[name] = torch.stack([per_layer[l] if l in per_layer else torch.full_like(like, fill)
                                     for l in self.layers], dim=1).numpy()
        return out


def check(arch: Any) -> str | None:
    return None if arch.router else f"{arch.family} has no mixture-of-experts layers (no router); expected an MoE family"


def capture(plan: Any, layers: tuple[int, ...]) -> None:
    plan.outputs += (RouterCapture(layers),)


register_site(Site("router", 4, index="decoder_layer", access="router", phase=ROUTER_PHASE, capture=capture,
                   check=check, stores={"router_logits": ("token", "decoder_layer", "expert"),
                                        "router_experts": ("token", "decoder_layer", "expert_rank")}))
