"""Captures: which tensors a run saves, read at their sites and moved to CPU float32 at once.

Stored variables (dims; what a row is):
- `hidden (token, layer, dim)`: the residual stream (convention in `workbench.sites`).
- `keys`, `values (token, decoder_layer, kv)`: each layer's K (after RoPE, and k_norm for Qwen) and V at
  every prompt position, read from the KV cache, heads flattened (kv = kv_heads * head_dim).
  `decoder_layer` l is the l-th decoder layer, which reads residual `layer` l.
- `prefill_vision_mass (token, decoder_layer, head)`: for each query position of the prompt forward, the
  attention probability mass on `vision` key positions.
- `decode_attention (token, step, decoder_layer, head)`: the attention probability of decode step s's
  query on the key at this prompt position. Step 0's query is the last prompt position (it
  predicts generated token 0); step s >= 1's query is generated token s-1 fed back.
- `keys_pre (token, decoder_layer, kv)`: the key projection's output (k_proj, before k_norm and
  RoPE: W_K·Norm(h)), heads flattened like `keys`.
- `attn_out`, `mlp_out (token, decoder_layer, dim)`: what decoder layer l's attention and MLP
  branches add to the residual stream (`Architecture.branch_outputs`: the module outputs
  themselves for pre-LN families, Gemma-3's post-attention / post-feedforward norms included), so
  that h_l + attn_out_l + mlp_out_l = h_{l+1} (Qwen3-VL: = `hidden_pre_deepstack` l+1).
- `hidden_pre_deepstack (token, layer, dim)`: Qwen3-VL's h_l before the DeepStack add (decoder
  layer l-1's own output; index 0 is the LLM input): ‖u₁‖/‖h₀‖ without the injected image feature.
- `lens_ids`, `lens_logprobs (token, layer, lens_rank)`: the logit lens of residual layer l, the
  top-k (`LENS_TOP_K`) token ids and log-probabilities of log_softmax(lm_head(final_norm(h_l))) at
  every position, rank 0 the most likely (no final-logit softcapping: the head's output, like
  `logprobs`).
- `embed`, `final_norm (token, dim)`: the token embeddings; the final norm's output.
- `embed_table_norms (run, embed_row)`: the L2 norm of every row of the input embedding table as
  the embedding module outputs it (Gemma-3's scaled embedding included), the whole vocabulary:
  what a token id enters as, for norm atlases without loading weights in the analyses.
- `vision (vision_patch, vision_dim)`, `vision_hidden (vision_patch, vision_layer, vision_dim)`: the tower's output as
  the connector receives it, and the output of each listed tower layer; one row per patch of the
  tower (tiles x patches flattened in the tower's own order), a `vision_patch` dim of its own since the
  connector merges patches into fewer LLM tokens.
- `logprobs (run, step, vocab)`: float32 log-softmax of the next-token logits at each step.
- `generated (run, step)`: the greedy token chosen at each step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .models.protocol import ModelLike
from .records import Record
from .sites import (BatchRow, batch_rows, order, position_index, read_order, residual_envoy, site, site_tensor,
                    to_device, token_rows)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy on the host, for reads after a forward (the KV cache)."""
    # copy=True: on CPU in float32 `.to` would return the same tensor, which later in-place
    # edits could still change.
    return tensor.detach().to("cpu", dtype=torch.float32, copy=True)


def saved_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy of a value read inside a forward, left on the value's device: the trace
    moves what it saved to the host once the forward is done (`backends.local.trace_rows`). A
    copy to the host waits for every kernel launched so far, so one per read (~30 in a 2B
    model's forward) made the host wait for the GPU layer after layer instead of queueing the
    next layer's kernels (the 2026-11-30 H200 run: a traced forward with its reads 63-71 ms
    against a plain forward's 39-51). The copy itself: later in-place edits in the forward must
    not reach it."""
    return tensor.detach().to(dtype=torch.float32, copy=True)


class ResidualCapture(Record):
    """The residual stream at each listed layer index, for every position."""

    _fields = ("layers", "variable")
    _defaults = {"variable": "hidden"}

    def targets(self) -> list[tuple[tuple[int, int, int], int]]:
        return [(order("layer", l, 1), l) for l in self.layers]

    def read(self, model: ModelLike, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        hidden = token_rows(residual_envoy(model, layer).input, row)
        saved.setdefault(("hidden", layer), []).append(saved_copy(hidden[0]))


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
    reduced as they are read: per query the mass on vision keys, and the last query's full row
    (the decode step's)."""

    _fields = ("layers",)

    def targets(self) -> list[tuple[tuple[int, int, int], int]]:
        return [(read_order("attention", l), l) for l in self.layers]

    def read(self, model: ModelLike, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
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


class ModuleOutputCapture(Record):
    """A per-position module output: `embed` (token embeddings, before image features are
    scattered in) or `final_norm` (the normed residual the LM head reads). Stored (token, dim)."""

    _fields = ("site",)
    rows = "tokens"

    def targets(self) -> list[tuple[tuple[int, int, int], None]]:
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        saved.setdefault((self.site, None), []).append(saved_copy(token_rows(site_tensor(model, self.site), row)[0]))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{variable: rows} of one run (the prompt may span two traces: kv_swap)."""
        return {self.site: torch.cat(merged[(self.site, None)], dim=0).numpy()}


class LayerOutputCapture(Record):
    """A per-layer sequence site other than the residual stream, at each listed index: a decoder
    layer's `keys_pre`, `attn_out` or `mlp_out` (`decoder_layer` 0..L-1), or Qwen3-VL's
    `layer.pre_deepstack` (`layer` 0..L). Stored (token, layer dim, width)."""

    _fields = ("site", "layers")
    rows = "tokens"

    def targets(self) -> list[tuple[tuple[int, int, int], int]]:
        return [(read_order(self.site, l), l) for l in self.layers]

    def read(self, model: Any, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        tensor = token_rows(site_tensor(model, self.site, layer), row)
        saved.setdefault((self.site, layer), []).append(saved_copy(tensor[0]))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{variable: (token, layer, width)}; a prompt over two traces (kv_swap) is joined."""
        per_layer = [torch.cat(merged[(self.site, l)], dim=0) for l in self.layers]
        return {site(self.site).variable: torch.stack(per_layer, dim=1).numpy()}


LENS_TOP_K = 10  # tokens kept per (position, layer) by the logit lens


class LogitLensCapture(Record):
    """The logit lens at each listed residual layer l: the family's own final norm and LM head
    applied to h_l (nnsight's ad-hoc module call: it serves nothing and spends no occurrence of
    the real forward), log_softmax in float32, and its top `k` token ids and log-probabilities
    per position (rank 0 = the most likely). At l = L it is the model's own next-token
    distribution (the final norm's output through the head)."""

    _fields = ("layers", "k")
    _defaults = {"k": LENS_TOP_K}
    rows = "tokens"
    site = "logit_lens"

    def targets(self) -> list[tuple[tuple[int, int, int], int]]:
        return [(read_order(self.site, l), l) for l in self.layers]

    def read(self, model: Any, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        hidden = token_rows(residual_envoy(model, layer).input, row)[0]
        norm, head = model.module(model.arch.final_norm)[0], model.module(model.arch.lm_head)[0]
        logprobs = torch.log_softmax(head(norm(hidden)).to(torch.float32), dim=-1)
        top = torch.topk(logprobs, min(self.k, logprobs.shape[-1]), dim=-1)
        saved.setdefault(("lens_ids", layer), []).append(top.indices.detach().clone())
        saved.setdefault(("lens_logprobs", layer), []).append(saved_copy(top.values))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{lens_ids, lens_logprobs: (token, layer, lens_rank)}; a prompt over two traces is joined."""
        return {name: torch.stack([torch.cat(merged[(name, l)], dim=0) for l in self.layers], dim=1).numpy()
                for name in ("lens_ids", "lens_logprobs")}


class PatchCapture(Record):
    """A vision-tower site, one row per patch: `vision` (the tower's output as the connector
    receives it) or `vision_layer` (each listed tower layer's output). Read in the prompt forward
    only (decode steps do not run the tower), and not at all without an image (`image: none`)."""

    _fields = ("site", "layers")
    _defaults = {"layers": None}
    prompt_only = True
    rows = "patches"

    def targets(self) -> list[tuple[tuple[int, int, int], int | None]]:
        if self.site == "vision_layer":
            return [(order(self.site, l, 1), l) for l in self.layers]
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: int | None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        if "pixel_values" not in inputs.encoding:
            return
        tensor = batch_rows(site_tensor(model, self.site, layer), row)
        saved[(self.site, layer)] = [saved_copy(tensor.reshape(-1, tensor.shape[-1]))]

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        variable = site(self.site).variable
        if self.site == "vision_layer":
            if (self.site, self.layers[0]) not in merged:
                return {}
            return {variable: torch.stack([merged[(self.site, l)][0] for l in self.layers], dim=1).numpy()}
        return {variable: merged[(self.site, None)][0].numpy()} if (self.site, None) in merged else {}


class EmbeddingTableCapture(Record):
    """The row norms of the input embedding table (`embed_table`), read from the embedding
    module's weight inside the trace (so it works where the weights live, NDIF included), scaled
    as the module scales its output (`embed_scale`, Gemma-3)."""

    _fields = ("site",)
    _defaults = {"site": "embed_table"}
    prompt_only = True
    rows = "run"

    def targets(self) -> list[tuple[tuple[int, int, int], None]]:
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        envoy = model.module(model.arch.embed)[0]  # the same weights for every batch row
        norms = envoy.weight.detach().to(torch.float32).norm(dim=-1)
        scale = getattr(envoy, "embed_scale", None)
        if scale is not None:
            norms = norms * float(scale)
        saved[(self.site, None)] = [saved_copy(norms)]

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        return {site(self.site).variable: merged[(self.site, None)][0][None].numpy()}


class SiteValues(Record):
    """A sequence site's value (`embed` or residual `layer`) at the selected positions, read to
    feed another condition's `patch` or `add` (direction_from)."""

    _fields = ("site", "layers", "positions")

    def targets(self) -> list[tuple[tuple[int, int, int], int | None]]:
        if self.site == "layer":
            return [(order("layer", l, 1), l) for l in self.layers or ()]
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: int | None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        tensor = batch_rows(site_tensor(model, self.site, layer), row)
        index = to_device(torch.as_tensor(position_index(self.positions, inputs.modality)), tensor)
        saved[("site", self.site, layer)] = saved_copy(tensor[0, index])


class CachedKVCapture(Record):
    """K and/or V of each listed layer, read from the KV cache after the prompt forward."""

    _fields = ("layers", "keys", "values")
    _defaults = {"keys": True, "values": True}

    def read_cache(self, cache: Any, n_tokens: int, row: int = 0) -> dict[str, np.ndarray]:
        """(token, layer, kv) arrays of batch row `row` of the cache."""
        out = {}
        for name, wanted in (("keys", self.keys), ("values", self.values)):
            if not wanted:
                continue
            per_layer = []
            for l in self.layers:
                tensor = getattr(cache.layers[l], name)[row, :, :n_tokens]      # (kv_heads, seq, hd)
                per_layer.append(to_host(tensor).permute(1, 0, 2).reshape(n_tokens, -1))
            out[name] = torch.stack(per_layer, dim=1).numpy()               # (token, layer, kv)
        return out


class CapturePlan(Record):
    """Everything one model's runs capture; built by the plan from the spec's `capture` list."""

    _fields = ("residual", "attention", "kv", "logits", "max_new_tokens", "outputs")
    _defaults = {"residual": None, "attention": None, "kv": None, "logits": False, "max_new_tokens": 1, "outputs": ()}
    _mutable = True

    def readers(self) -> list[Any]:
        """The captures read inside a trace (K/V are read from the cache afterwards)."""
        return [c for c in (self.residual, self.attention, *self.outputs) if c is not None]

    @property
    def decoding(self) -> bool:
        """Whether runs go past the prompt forward (logits or attention of decode steps)."""
        return self.logits or self.attention is not None

    def coords(self) -> dict[str, dict[str, np.ndarray]]:
        """Labels of the non-leading dims of each variable this plan stores."""
        coords: dict[str, dict[str, np.ndarray]] = {}
        if self.residual:
            coords["hidden"] = {"layer": np.asarray(self.residual.layers)}
        # attention and K/V belong to decoder layers (0..L-1), a dim of their own: decoder layer
        # l reads residual layer l
        if self.kv:
            layers = {"decoder_layer": np.asarray(self.kv.layers)}
            coords.update({n: layers for n in ("keys", "values") if getattr(self.kv, n)})
        if self.attention:
            coords["prefill_vision_mass"] = {"decoder_layer": np.asarray(self.attention.layers)}
            coords["decode_attention"] = {"decoder_layer": np.asarray(self.attention.layers)}
        for output in self.outputs:
            # per-layer sites keep their own index dim (`vision_layer`: the tower's, never the LLM's)
            if getattr(output, "layers", None) is not None:
                entry = site(output.site)
                for variable in entry.stores:
                    coords[variable] = {entry.index: np.asarray(output.layers)}
        return coords
