"""LLaVA-1.5: CLIP ViT tower read at its penultimate layer (CLS row dropped), 2-layer MLP connector,
Llama decoder. One fixed-size image (576 tokens at 336 px), no tiles, no framing tokens."""

from .base import Architecture, PatchGeometry

LLAVA = Architecture(
    family="llava",
    model_class="LlavaForConditionalGeneration",
    config_architectures=("LlavaForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    # the selected feature layer (vision_feature_layer, -2 in LLaVA-1.5) without its CLS row
    vision_output=("model.multi_modal_projector", "input"),
    # linear_1 -> GELU -> linear_2: its output is the image features, row for row
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    tower_prefix_rows=1,   # CLS (transformers 5.25 models/llava/modeling_llava.py get_image_features)
    image_token="<image>",  # no framing tokens
    hub_id="llava-hf/llava-1.5-7b-hf",
    geometry=PatchGeometry(layout="center_crop_grid"),
    tiny="tiny-llava",
    client="tiny_llava",
)

ARCHITECTURES = (LLAVA,)
