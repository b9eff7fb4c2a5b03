"""`Architecture`: the declarative description of one model family (one file per family, beside
this one). Nothing else in the workbench knows a module path, a family's image tokens or its
input quirks.

Shipped to NDIF servers (an `Architecture` travels inside the plan): this module imports only
what NDIF's whitelist allows. `re` (for numbered boundary tokens) is imported inside the
client-only `is_boundary_token`.
"""

from __future__ import annotations

from ...records import Record


# pre-LN decoder layers (h + attn(norm(h)), then + mlp(norm(.))): each branch adds its module's
# output to the residual stream as it is
BRANCH_OUTPUTS = {"attn_out": "self_attn", "mlp_out": "mlp"}


class PatchGeometry(Record):
    """How a family's vision tokens map onto its image (`Architecture.geometry`).
    layout: the name of a layout in `workbench/models/geometry.py` (`merged_grid`,
      `split_tiles_global`, `anyres`, ...) or of a function `layout(ctx) -> list[Place]` in the
      family's client module; None: the connector keeps no positions, and `reason` says why."""

    _fields = ("layout", "reason")
    _defaults = {"reason": ""}
    layout: str | None
    reason: str


def no_positions(reason: str) -> PatchGeometry:
    """A family whose vision tokens have no place in the image (a perceiver resampler's latents,
    cross-attention): the store holds no geometry for it, and says why."""
    return PatchGeometry(layout=None, reason=reason)


class Architecture(Record):
    """Fields:
    family: the family's name (its file under `workbench/models/architectures/`)
    model_class: transformers class that loads the checkpoint; config_architectures
    embed (token embedding module), decoder_layers (ModuleList of decoder layers), final_norm, lm_head
    vision: the vision tower (None: a text model)
    vision_layers: the tower's ModuleList of layers (site `vision_layer`: each one's output)
    vision_output: (module path, "input" | "output"): where the tower's output is read as the
      connector receives it (site `vision`): the connector's input, or the tower's own output
    vision_config: sub-config holding the tower's depth (`num_hidden_layers`, or Qwen's `depth`)
    projector: modules whose outputs together form "the projector output as it enters the LLM",
      in execution order; projector_merger: the main merger alone ("projector.merger")
    projector_parts: {part name: module path} of the connector's parts, in execution order;
      each is the site `projector.<part name>`
    image_token: placeholder scattered with image features
    boundary_tokens: literal framing tokens; boundary_patterns: regexes for numbered ones
      (matched on the client only, by `is_boundary_token`: `re` is not on NDIF's whitelist)
    text_config: sub-config holding the LLM dims
    mrope: M-RoPE; the model caches `rope_deltas` between forwards (reset before each run) and
      decode steps take them into their position ids
    deepstack: the vision tower's DeepStack mergers add features to the residual stream after the
      first decoder layers (Qwen3-VL): site `layer.pre_deepstack`, and edits of their outputs
      cannot share a trace with the vision-tower sites
    prefix_lm: the prompt is one bidirectional prefix (PaliGemma): no kv_swap, and a row without
      `token_type_ids` is never padded
    position_offset: the first position id (PaliGemma's are 1-based)
    tower_prefix_rows: rows each image has in the tower's layers before its patches, which the
      connector drops (CLIP's CLS row in LLaVA, `vision_feature_select_strategy: default`): the
      `vision_layer` capture leaves them out, so its rows are the patches `vision` holds
    attention_call: the `.source` name (nnsight) of the attention call in a decoder layer's
      self-attention forward, whose inputs (q, k, mask) give the attention probabilities
      (transformers 5.x: `attention_interface_1`, after the `attention_interface_0` lookup)
    nest_images: the processor takes images nested per sample (`[[img]]`, SmolVLM) or flat (`[img]`)
    drop_keys: processor outputs left out of the model inputs (e.g. `token_type_ids`, which most
      families' processors return for training only; Gemma-3 needs it: bidirectional image attention)
    per_token_keys: model inputs with one entry per token (truncated with the prompt, e.g. kv_swap)
    branch_outputs: {site: module path inside a decoder layer} of the decoder-layer sites
      `attn_out`, `mlp_out`: the module whose output is what each branch adds to the residual stream
    output_projection_call: the `.source` name of the output projection's call in the
      self-attention forward (site `attn_heads`: its input, the heads' outputs concatenated)
    key_projection_call: the `.source` name of the key projection's call in the self-attention
      forward (site `keys_pre`: k_proj's output, before any norm or RoPE). Read through `.source`,
      not as the module `self_attn.k_proj`: nnsight cannot serve `.source` operations of a forward
      (the attention capture's) once a submodule inside it was requested
    logit_scale, logit_softcap: text-config attributes of what the model's forward does to the
      head's output (Cohere's `logit_scale` multiplies it; PaliGemma's `final_logit_softcapping`
      caps it, c * tanh(x / c)); the `logits` and `logit_lens` sites read `lm_head` and apply the
      same (`ModelInfo.head_logits`), so stored log-probabilities are the model's own
    hub_id: a real checkpoint of the family on the Hugging Face hub (an example, for listings)
    router: the router of a mixture-of-experts decoder layer, a module path inside the layer whose
      output is a tuple holding the router logits (site `router`); None: no MoE. Layers without
      that module are dense (Llama 4 interleaves dense and MoE layers)
    router_logits: the index of the logits (tokens, experts) in the router's output tuple
    geometry: where each vision token sits in the image (a `PatchGeometry`: a layout, or
      `no_positions(reason)`); every multimodal family declares one (None: a text model)
    cross_attention_layers: text-config attribute listing the decoder layers that cross-attend to
      the image (Mllama: `cross_attention_layers`); None: the image enters the token sequence. With
      it the image never enters the residual stream: the image token is a marker (labelled
      boundary), the image's K/V are those layers' cache entries (site `cross_kv`), and `kv_swap`
      swaps them (the cross-attention KV from the donor image)
    layer_types: text-config attribute naming each decoder layer's kind (LFM2: `layer_types`);
      layers whose kind is not in `attention_types` have no self-attention (LFM2's short
      convolutions): no KV cache, no attention, keys or attn_out there. None: every layer attends
    packed_connector: the connector runs every image of a batch as one row (LFM2-VL's projector
      reads one grid of all images' patches), so a row editing it runs in a forward of its own
    tiny: name of the tiny offline model of this family (None: none); client: the client-only
      module (beside this one) with `build_tiny(out_dir, seed)` and `load_processor(model_dir)`
    A `Record`: it travels to NDIF servers inside the plan."""

    family: str
    model_class: str
    config_architectures: tuple[str, ...]
    embed: str
    decoder_layers: str
    final_norm: str
    lm_head: str
    vision: str | None
    vision_layers: str | None
    vision_output: tuple[str, str] | None
    vision_config: str
    projector: tuple[str, ...]
    projector_merger: str | None
    projector_parts: dict[str, str]
    image_token: str | None
    boundary_tokens: tuple[str, ...]
    boundary_patterns: tuple[str, ...]
    text_config: str
    attention_call: str
    nest_images: bool
    drop_keys: tuple[str, ...]
    per_token_keys: tuple[str, ...]
    branch_outputs: dict[str, str]
    key_projection_call: str
    output_projection_call: str
    tiny: str | None
    client: str | None
    _fields = ("family", "model_class", "config_architectures", "embed", "decoder_layers", "final_norm",
               "lm_head", "vision", "vision_layers", "vision_output", "vision_config", "projector", "projector_merger", "projector_parts", "image_token",
               "boundary_tokens", "boundary_patterns", "text_config", "mrope", "deepstack", "prefix_lm",
               "position_offset", "tower_prefix_rows", "attention_call", "nest_images",
               "drop_keys", "per_token_keys", "branch_outputs", "key_projection_call", "output_projection_call", "logit_scale", "logit_softcap",
               "router", "router_logits", "geometry", "cross_attention_layers", "layer_types", "attention_types",
               "packed_connector", "hub_id", "tiny", "client")
    _defaults = {"vision": None, "vision_layers": None, "vision_output": None, "vision_config": "vision_config",
                 "projector": (), "projector_merger": None, "image_token": None,
                 "boundary_tokens": (), "boundary_patterns": (), "text_config": "text_config",
                 "mrope": False, "deepstack": False, "prefix_lm": False, "position_offset": 0,
                 "tower_prefix_rows": 0,
                 "attention_call": "attention_interface_1", "nest_images": False,
                 "drop_keys": ("token_type_ids",), "per_token_keys": ("input_ids", "attention_mask"),
                 "branch_outputs": BRANCH_OUTPUTS, "key_projection_call": "self_k_proj_0",
                 "output_projection_call": "self_o_proj_0",
                 "logit_scale": None, "logit_softcap": None, "router": None, "router_logits": 0,
                 "geometry": None, "cross_attention_layers": None, "layer_types": None,
                 "attention_types": ("full_attention", "sliding_attention"), "packed_connector": False,
                 "hub_id": None, "tiny": None, "client": None}
    _factories = {"projector_parts": dict}
    # the family's quirks, typed (the other fields are module paths and token names: strings)
    mrope: bool
    deepstack: bool
    prefix_lm: bool
    position_offset: int
    tower_prefix_rows: int
    logit_scale: str | None
    logit_softcap: str | None
    router: str | None
    router_logits: int
    geometry: PatchGeometry | None
    cross_attention_layers: str | None
    layer_types: str | None
    attention_types: tuple[str, ...]
    packed_connector: bool

    @property
    def is_multimodal(self) -> bool:
        return self.vision is not None


def is_boundary_token(arch: Architecture, token: str) -> bool:
    """Whether `token` frames an image in this family (client side: the encoder labels tokens)."""
    import re  # client only: not on NDIF's whitelist

    return token in arch.boundary_tokens or any(re.fullmatch(p, token) for p in arch.boundary_patterns)
