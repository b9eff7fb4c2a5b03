"""LLaVA-OneVision: SigLIP tower, 2-layer MLP connector (LLaVA style), Qwen2 decoder; AnyRes tiles
with a learned `image_newline` row appended after each row of features."""

from .base import Architecture, PatchGeometry

LLAVA_ONEVISION = Architecture(
    family="llava_onevision",
    model_class="LlavaOnevisionForConditionalGeneration",
    config_architectures=("LlavaOnevisionForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    vision_output=("model.multi_modal_projector", "input"),
    # linear_1 -> GELU -> linear_2. The `image_newline` rows (a parameter, appended after the
    # projector while packing the tiles) are not projector output: a projector edit leaves them.
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    image_token="<image>",  # every feature row, newline rows included; no framing tokens
    hub_id="llava-hf/llava-onevision-qwen2-0.5b-ov-hf",
    geometry=PatchGeometry(layout="anyres"),
    tiny="tiny-llava_onevision",
    client="tiny_llava_onevision",
)

ARCHITECTURES = (LLAVA_ONEVISION,)
