"""DeepSeek-VL (1.3B / 7B, the SigLIP-only variant): SigLIP ViT tower read at its output (after
`post_layernorm`), a 2-layer MLP aligner (linear1 -> GELU -> linear2), Llama decoder. One fixed
384 px image of 576 `<image_placeholder>` tokens, no framing tokens (transformers 5.25
models/deepseek_vl/modeling_deepseek_vl.py)."""

from .base import Architecture, PatchGeometry

DEEPSEEK_VL = Architecture(
    family="deepseek_vl",
    model_class="DeepseekVLForConditionalGeneration",
    config_architectures=("DeepseekVLForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    vision_layers="model.vision_model.encoder.layers",
    # the tower's last_hidden_state, one row per patch (no CLS in SigLIP), as the aligner receives it
    vision_output=("model.aligner", "input"),
    projector=("model.aligner",),
    projector_merger="model.aligner",
    projector_parts={"linear1": "model.aligner.linear1", "linear2": "model.aligner.linear2"},
    image_token="<image_placeholder>",
    # the longest side resized, centred on a square of the background colour, one token per patch
    geometry=PatchGeometry(layout="padded_square_grid"),
    hub_id="deepseek-community/deepseek-vl-1.3b-chat",
    tiny="tiny-deepseek_vl",
    client="tiny_deepseek_vl",
)

ARCHITECTURES = (DEEPSEEK_VL,)
