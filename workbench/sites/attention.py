"""`attention`: attention probabilities of each listed decoder layer, reduced as they are read:
per query the mass on vision keys and per key the mass it receives from the prompt's text queries
(prompt forward), and each decode step's row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from ..records import Record
from .base import BatchRow, Site, batch_rows, read_order, register_site, to_device
from .readers import saved_copy

if TYPE_CHECKING:  # torch is imported where a reader runs: `analyses` reads the site registry
    import torch  # (dims, phases) where torch is not installed

    from ..capture import CapturePlan


def attention_probabilities(args: tuple, kwargs: dict, row: Any = None) -> torch.Tensor:
    """Attention probabilities (batch, heads, query, key) from the arguments of a decoder layer's
    attention call `attention_interface(self, query, key, value, attention_mask, scaling=...)`:
    softmax(q kᵀ · scaling + mask) in float32, the computation of transformers' eager attention
    (`eager_attention_forward`: keys repeated per query-head group, the mask added, softmax in
    float32), whatever implementation the model runs. So no per-request switch to eager is
    needed, which NDIF would not apply. Measured on the tiny models under sdpa: layer 0 bitwise
    equal to eager's own probabilities, later layers within 2e-7 (their inputs differ by
    sdpa's rounding). Masks: None = causal (queries are the last positions of the keys),
    (batch, key) = causal and a padding mask, 4-D boolean = True where allowed, 4-D additive float
    = 0 where allowed. `row`: only that batch row (`workbench.sites.batch_rows`); a padded row's
    queries and keys are cut to its real positions (its pads come after them, see
    `workbench.sites.BatchRow`), so no probability falls on a pad."""
    import torch
    _, query, key, _, mask = args[:5]
    query, key = batch_rows(query, row), batch_rows(key, row)
    mask = mask if mask is None else batch_rows(mask, row)
    length = row.length if isinstance(row, BatchRow) else None
    if length is not None:  # a prompt forward: queries and keys are both the prompt's positions
        query, key = query[:, :, :length], key[:, :, :length]
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :, :length, :length]
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    batch, kv_heads, n_keys, head_dim = key.shape
    groups = query.shape[1] // kv_heads
    key = key[:, :, None].expand(batch, kv_heads, groups, n_keys, head_dim).reshape(batch, kv_heads * groups, n_keys, head_dim)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    n_queries = query.shape[2]
    causal = torch.ones(n_queries, n_keys, dtype=torch.bool, device=weights.device).tril(n_keys - n_queries)
    if mask is None:
        allowed = causal
    elif mask.dim() == 2:  # a (batch, key) padding mask, 1 = a token (what flash attention gets)
        allowed = causal & mask[:, None, None, :n_keys].to(torch.bool)
    elif mask.dtype == torch.bool:
        allowed = mask[..., :n_keys]
    else:
        allowed = mask[..., :n_keys] == 0
    weights = weights.masked_fill(~allowed, float("-inf"))
    return torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)


class AttentionCapture(Record):
    """Attention probabilities of each listed decoder layer (see `attention_probabilities`),
    reduced as they are read: per query the mass on vision keys, per key the mass it receives from
    the text queries of the prompt (`text_received`: a prompt forward's, whose keys are all prompt
    positions; a decode step's keys run past the prompt and it reads none), and the last query's
    full row (the decode step's)."""

    layers: tuple[int, ...]
    _fields = ("layers",)

    def targets(self) -> list[tuple[tuple[int, int, float], int]]:
        return [(read_order("attention", l), l) for l in self.layers]

    def read(self, model: ModelLike, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        import torch
        call = getattr(model.decoder_layers()[layer].self_attn.source, model.arch.attention_call)
        args, kwargs = call.inputs
        probs = attention_probabilities(args, kwargs, row)[0]  # (heads, q, k)
        n_keys = probs.shape[-1]
        vision_keys = torch.zeros(n_keys, dtype=torch.bool, device=probs.device)  # generated keys: text
        prompt = torch.as_tensor(inputs.modality == "vision")[:n_keys]
        vision_keys[: prompt.shape[0]] = to_device(prompt, probs)
        mass = probs[:, :, vision_keys].sum(-1)   # (heads, q)
        saved.setdefault(("vision_mass", layer), []).append(saved_copy(mass.transpose(0, 1)))
        saved.setdefault(("last_row", layer), []).append(saved_copy(probs[:, -1, :].transpose(0, 1)))
        modality = inputs.modality
        if n_keys <= len(modality):  # a prompt forward (or its one-token tail): queries end at key n_keys-1
            text = torch.as_tensor(modality[n_keys - probs.shape[1]:n_keys] == "text")
            received = probs[:, to_device(text, probs), :].sum(1)  # (heads, k)
            saved.setdefault(("text_received", layer), []).append(saved_copy(received.transpose(0, 1)))


def text_received(saved: dict[Any, list[torch.Tensor]], layers: tuple[int, ...], n: int) -> torch.Tensor:
    """(key, layer, head): the attention each of the n prompt positions receives from the prompt's
    text queries, summed over the traces a prompt forward was split into (a kv_swap's head reads
    keys 0..n-2, its tail all n: each part's sums padded with zeros to n)."""
    import torch
    per_layer = []
    for layer in layers:
        parts = [torch.nn.functional.pad(part, (0, 0, 0, n - part.shape[0])) for part in saved[("text_received", layer)]]
        per_layer.append(torch.stack(parts).sum(0))
    return torch.stack(per_layer, dim=1)




def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.attention = AttentionCapture(layers)


register_site(Site("attention", 4, index="decoder_layer", access="attention", phase=3, steps="decode", capture=capture,
                   stores={"prefill_vision_mass": ("token", "decoder_layer", "head"),
                           "prefill_text_attention": ("token", "decoder_layer", "head"),
                           "decode_attention": ("token", "step", "decoder_layer", "head")}))
