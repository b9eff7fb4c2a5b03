"""Captures: which tensors a run saves, read at their sites and moved to CPU float32 at once.

`CapturePlan` holds a model's readers; each reader is declared by its site (`workbench.sites.<site>`,
the shared ones in `workbench.sites.readers`) and re-exported here. `SiteValues` reads the values a
`patch` or `add` source condition provides.

Stored variables (dims; what a row is):
- `hidden (token, layer, dim)`: the residual stream (convention in `workbench.sites`).
- `keys`, `values (token, decoder_layer, kv)`: each layer's K (after RoPE, and k_norm for Qwen) and V at
  every prompt position, read from the KV cache, heads flattened (kv = kv_heads * head_dim).
  `decoder_layer` l is the l-th decoder layer, which reads residual `layer` l.
- `prefill_vision_mass (token, decoder_layer, head)`: for each query position of the prompt forward, the
  attention probability mass on `vision` key positions.
- `prefill_text_attention (token, decoder_layer, head)`: for each key position of the prompt forward,
  the attention probability it receives from the prompt's `text` query positions, summed over them
  (the per-patch text→vision mass where the key is a vision token).
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
- `embed_nn_ids`, `embed_nn_cos (token, layer, embed_rank)`: the `EMBED_TOP_K` rows of the input
  embedding table nearest to h_l by cosine at every position, and their cosines, nearest first
  (site `embed_lens`); each id's text is in the run's `run_id_texts`.
- `router_logits (token, decoder_layer, expert)`, `router_experts (token, decoder_layer,
  expert_rank)`: a mixture-of-experts layer's router logits and the top-k experts it selects,
  best first (NaN and -1 at a dense layer).
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

from typing import Any, cast

import numpy as np
import torch

from .models.protocol import ModelLike
from .records import Record
from .sites import order, position_index, read_order, site, site_tensor, batch_rows, to_device
# every site's reader, where its site declares it (re-exported: the plan's readers in one place)
from .sites.attention import AttentionCapture, attention_probabilities  # noqa: F401
from .sites.embed_lens import EMBED_TOP_K, EmbeddingLensCapture  # noqa: F401
from .sites.embed_table import EmbeddingTableCapture  # noqa: F401
from .sites.layer import ResidualCapture  # noqa: F401
from .sites.logit_lens import LENS_TOP_K, LogitLensCapture  # noqa: F401
from .sites.readers import (CachedKVCapture, LayerOutputCapture, ModuleOutputCapture, PatchCapture,  # noqa: F401
                            saved_copy, to_host)


class SiteValues(Record):
    """A sequence site's value (`embed`, residual `layer`, `attn_out`, `mlp_out`) at the selected
    positions, read to feed another condition's `patch` or `add` (direction_from)."""

    site: str
    layers: tuple[int, ...] | None
    positions: str | tuple[int, ...]
    _fields = ("site", "layers", "positions")

    def targets(self) -> list[tuple[tuple[int, int, float], int | None]]:
        if site(self.site).index:  # layer; attn_out, mlp_out at their phase in the layer
            return [(read_order(self.site, l), l) for l in self.layers or ()]
        return [(read_order(self.site, None), None)]

    def read(self, model: ModelLike, layer: int | None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        tensor = batch_rows(site_tensor(model, self.site, layer), row)
        index = to_device(torch.as_tensor(position_index(self.positions, inputs.modality)), tensor)
        saved[("site", self.site, layer)] = saved_copy(tensor[0, index])


class CapturePlan(Record):
    """Everything one model's runs capture; built by the plan from the spec's `capture` list."""

    residual: ResidualCapture | None
    attention: AttentionCapture | None
    kv: CachedKVCapture | None
    logits: bool
    max_new_tokens: int
    outputs: tuple[Any, ...]
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
            coords["prefill_text_attention"] = {"decoder_layer": np.asarray(self.attention.layers)}
        for output in self.outputs:
            # per-layer sites keep their own index dim (`vision_layer`: the tower's, never the LLM's)
            if getattr(output, "layers", None) is not None:
                entry = site(output.site)
                for variable in entry.stores:
                    coords[variable] = {cast(str, entry.index): np.asarray(output.layers)}
        return coords
