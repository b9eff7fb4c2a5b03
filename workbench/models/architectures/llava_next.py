"""LLaVA-NeXT (LLaVA-1.6): CLIP ViT tower read at its penultimate layer (CLS row dropped), 2-layer
MLP connector, Mistral/Vicuna decoder. AnyRes: a base tile of the whole image, then the image's
best-fit grid of tiles, unpadded to the image's aspect, with a learned `image_newline` row after
each row of features."""

from .base import Architecture, PatchGeometry

LLAVA_NEXT = Architecture(
    family="llava_next",
    model_class="LlavaNextForConditionalGeneration",
    config_architectures=("LlavaNextForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    # every tile's selected feature layer (vision_feature_layer, -2) without its CLS row
    vision_output=("model.multi_modal_projector", "input"),
    # linear_1 -> GELU -> linear_2. The `image_newline` rows (a parameter, appended after the
    # projector while packing the tiles) are not projector output: a projector edit leaves them.
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    # every feature row, newline rows included, is an `<image>` position: all are labelled vision
    # (they carry what the image side put there); no framing tokens
    tower_prefix_rows=1,   # CLS (transformers 5.25 models/llava/modeling_llava.py get_image_features)
    image_token="<image>",
    hub_id="llava-hf/llava-v1.6-mistral-7b-hf",
    geometry=PatchGeometry(layout="anyres"),
    tiny="tiny-llava_next",
    client="tiny_llava_next",
)

ARCHITECTURES = (LLAVA_NEXT,)
