"""Qwen2-VL: ViT with 2-D RoPE over native-resolution patches (full attention in every block),
patch merger (LayerNorm + MLP over 2x2 patches), Qwen2 decoder with M-RoPE."""

from .base import Architecture, PatchGeometry

QWEN2_VL = Architecture(
    family="qwen2_vl",
    model_class="Qwen2VLForConditionalGeneration",
    config_architectures=("Qwen2VLForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.visual",
    vision_layers="model.visual.blocks",
    vision_output=("model.visual.merger", "input"),
    # the merger (LayerNorm ln_q, then a 2-layer MLP over each 2x2 patch group) is the whole connector
    projector=("model.visual.merger",),
    projector_merger="model.visual.merger",
    projector_parts={"ln_q": "model.visual.merger.ln_q", "mlp": "model.visual.merger.mlp"},
    image_token="<|image_pad|>",
    boundary_tokens=("<|vision_start|>", "<|vision_end|>"),
    mrope=True,  # `rope_deltas` cached on the model between forwards
    per_token_keys=("input_ids", "attention_mask", "mm_token_type_ids"),
    hub_id="Qwen/Qwen2-VL-2B-Instruct",
    geometry=PatchGeometry(layout="merged_grid"),
    tiny="tiny-qwen2_vl",
    client="tiny_qwen2_vl",
)

ARCHITECTURES = (QWEN2_VL,)
