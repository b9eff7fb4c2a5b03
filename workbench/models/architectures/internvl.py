"""InternVL (transformers' InternVL-hf layout): InternViT tower, pixel shuffle then LayerNorm ->
linear -> GELU -> linear connector, Qwen2 decoder; dynamic tiles plus a thumbnail, each framed
by <img> ... </img>."""

from .base import Architecture, PatchGeometry

INTERNVL = Architecture(
    family="internvl",
    model_class="InternVLForConditionalGeneration",
    config_architectures=("InternVLForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layer",
    vision_output=("model.vision_tower", "output"),
    # pixel shuffle happens before it (in get_image_features); its output is the image features
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"layer_norm": "model.multi_modal_projector.layer_norm",
                     "linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    image_token="<IMG_CONTEXT>",
    boundary_tokens=("<img>", "</img>"),
    hub_id="OpenGVLab/InternVL3-1B-hf",
    geometry=PatchGeometry(layout="dynamic_tiles"),
    tiny="tiny-internvl",
    client="tiny_internvl",
)

ARCHITECTURES = (INTERNVL,)
