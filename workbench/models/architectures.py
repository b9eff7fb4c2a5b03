"""One small declarative description per model family, registered by config architecture.

Adding a family is adding one `Architecture(...)` to `ARCHITECTURES`: module paths of the named
sites, the tokens that frame an image, and the family's quirks. Nothing else in the workbench
knows a module path.
"""

from __future__ import annotations

import re

from ..records import Record


class Architecture(Record):
    """Fields:
    family: "smolvlm" | "qwen3vl" | "llama": picks the processor builder
    model_class: transformers class that loads the checkpoint; config_architectures
    embed (token embedding module), decoder_layers (ModuleList of decoder layers), final_norm, lm_head
    vision: the vision tower (None: a text model)
    projector: modules whose outputs together form "the projector output as it enters the LLM",
      in execution order; projector_merger: the main merger alone ("projector.merger")
    image_token: placeholder scattered with image features
    boundary_tokens: literal framing tokens; boundary_patterns: regexes for numbered ones
      (matched on the client only, by `is_boundary_token`: `re` is not on NDIF's whitelist)
    text_config: sub-config holding the LLM dims; quirks: per-family flags
    attention_call: the `.source` name (nnsight) of the attention call in a decoder layer's
      self-attention forward, whose inputs (q, k, mask) give the attention probabilities
      (transformers 5.x: `attention_interface_1`, after the `attention_interface_0` lookup)
    A `Record`: it travels to NDIF servers inside the plan."""

    _fields = ("family", "model_class", "config_architectures", "embed", "decoder_layers", "final_norm",
               "lm_head", "vision", "projector", "projector_merger", "image_token", "boundary_tokens",
               "boundary_patterns", "text_config", "quirks", "attention_call")
    _defaults = {"vision": None, "projector": (), "projector_merger": None, "image_token": None,
                 "boundary_tokens": (), "boundary_patterns": (), "text_config": "text_config",
                 "attention_call": "attention_interface_1"}
    _factories = {"quirks": dict}

    @property
    def is_multimodal(self) -> bool:
        return self.vision is not None


def is_boundary_token(arch: Architecture, token: str) -> bool:
    """Whether `token` frames an image in this family (client side: the encoder labels tokens)."""
    return token in arch.boundary_tokens or any(re.fullmatch(p, token) for p in arch.boundary_patterns)


SMOLVLM = Architecture(
    family="smolvlm",
    model_class="SmolVLMForConditionalGeneration",
    config_architectures=("SmolVLMForConditionalGeneration",),
    embed="model.text_model.embed_tokens",
    decoder_layers="model.text_model.layers",
    final_norm="model.text_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    # pixel shuffle + MLP; its output is exactly the image features scattered into the LLM input
    projector=("model.connector",),
    projector_merger="model.connector",
    image_token="<image>",
    boundary_tokens=("<fake_token_around_image>", "<global-img>"),
    boundary_patterns=(r"<row_\d+_col_\d+>",),
)

# Idefics3 is SmolVLM's parent class with the same module tree.
IDEFICS3 = Architecture(
    **{**SMOLVLM.__dict__, "model_class": "Idefics3ForConditionalGeneration",
       "config_architectures": ("Idefics3ForConditionalGeneration",)}
)

QWEN3VL = Architecture(
    family="qwen3vl",
    model_class="Qwen3VLForConditionalGeneration",
    config_architectures=("Qwen3VLForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.visual",
    # DeepStack mergers run inside the vision tower (after their blocks), the merger last. Their
    # outputs are ADDED to the residual stream at vision positions after decoder layers 0..k, so a
    # faithful "projector output" intervention must reach all of them.
    projector=("model.visual.deepstack_merger_list.*", "model.visual.merger"),
    projector_merger="model.visual.merger",
    image_token="<|image_pad|>",
    boundary_tokens=("<|vision_start|>", "<|vision_end|>"),
    # M-RoPE: decode steps need explicit 3-D position ids; `rope_deltas` is cached on the model
    quirks={"mrope": True},
)

LLAMA = Architecture(
    family="llama",
    model_class="LlamaForCausalLM",
    config_architectures=("LlamaForCausalLM",),
    embed="model.embed_tokens",
    decoder_layers="model.layers",
    final_norm="model.norm",
    lm_head="lm_head",
    text_config=None,
)

ARCHITECTURES: tuple[Architecture, ...] = (SMOLVLM, IDEFICS3, QWEN3VL, LLAMA)


def architecture_for(config_architectures: list[str] | None) -> Architecture:
    """The registered description for a config's `architectures` list."""
    for name in config_architectures or []:
        for arch in ARCHITECTURES:
            if name in arch.config_architectures:
                return arch
    known = sorted(n for a in ARCHITECTURES for n in a.config_architectures)
    raise ValueError(f"unsupported architecture {config_architectures}; supported: {', '.join(known)}")
