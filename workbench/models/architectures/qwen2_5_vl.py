"""Qwen2.5-VL: ViT with window attention, patch merger (RMSNorm + MLP), Qwen2 decoder with M-RoPE."""

from .base import Architecture, PatchGeometry

QWEN2_5_VL = Architecture(
    family="qwen2_5_vl",
    model_class="Qwen2_5_VLForConditionalGeneration",
    config_architectures=("Qwen2_5_VLForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.visual",
    vision_layers="model.visual.blocks",
    vision_output=("model.visual.merger", "input"),
    # the merger (2x2 patch merge: RMSNorm ln_q, then a 2-layer MLP) is the whole connector
    projector=("model.visual.merger",),
    projector_merger="model.visual.merger",
    projector_parts={"ln_q": "model.visual.merger.ln_q", "mlp": "model.visual.merger.mlp"},
    image_token="<|image_pad|>",
    boundary_tokens=("<|vision_start|>", "<|vision_end|>"),
    mrope=True,  # `rope_deltas` cached on the model between forwards
    per_token_keys=("input_ids", "attention_mask", "mm_token_type_ids"),
    hub_id="Qwen/Qwen2.5-VL-3B-Instruct",
    geometry=PatchGeometry(layout="merged_grid"),
    tiny="tiny-qwen2_5_vl",
    client="tiny_qwen2_5_vl",
)

ARCHITECTURES = (QWEN2_5_VL,)
