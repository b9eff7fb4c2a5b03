"""Mistral 3 (Mistral-Small-3.1): Pixtral ViT over native-resolution patches with 2-D RoPE,
connector RMSNorm -> 2x2 patch merger (a linear layer over each unfolded group) -> 2-layer MLP,
Mistral decoder. The image is a grid of `[IMG]` rows, each row ended by `[IMG_BREAK]` and the last
by `[IMG_END]`: learned tokens, not image features (labelled boundary)."""

from .base import Architecture, PatchGeometry

MISTRAL3 = Architecture(
    family="mistral3",
    model_class="Mistral3ForConditionalGeneration",
    config_architectures=("Mistral3ForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.transformer.layers",
    # the tower's selected layer (vision_feature_layer, -1: its output), patches of every image in a row
    vision_output=("model.multi_modal_projector", "input"),
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"norm": "model.multi_modal_projector.norm",
                     "patch_merger": "model.multi_modal_projector.patch_merger",
                     "linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    image_token="[IMG]",
    boundary_tokens=("[IMG_BREAK]", "[IMG_END]"),
    hub_id="mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    geometry=PatchGeometry(layout="native_rows"),
    tiny="tiny-mistral3",
    client="tiny_mistral3",
)

ARCHITECTURES = (MISTRAL3,)
