"""Aya Vision: SigLIP tower, connector = pixel shuffle, LayerNorm, SwiGLU MLP (`linear_1`, `linear_2`),
Cohere2 decoder (parallel attention and MLP from one norm; sliding-window and global layers); each
image cropped into tiles plus a global view, each `TILE_<i>` / `TILE_GLOBAL` then its patch tokens,
the whole image between `<|START_OF_IMG|>` and `<|END_OF_IMG|>` (transformers 5.25
models/aya_vision/processing_aya_vision.py).

The model multiplies the head's output by `text_config.logit_scale` (0.0625 in aya-vision-8b;
transformers 5.25 models/aya_vision/modeling_aya_vision.py): the `logits` and `logit_lens` sites
apply it too (`logit_scale`)."""

from .base import Architecture, PatchGeometry

AYA_VISION = Architecture(
    family="aya_vision",
    model_class="AyaVisionForConditionalGeneration",
    config_architectures=("AyaVisionForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    # the selected feature layer (the last one's output, before SigLIP's post-layernorm)
    vision_output=("model.multi_modal_projector", "input"),
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"layernorm": "model.multi_modal_projector.layernorm",
                     "linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    # the processor expands `<image>` into patch tokens: `<|IMG_PATCH|>` is the config's image token
    image_token="<|IMG_PATCH|>",
    boundary_tokens=("<|START_OF_IMG|>", "<|END_OF_IMG|>", "TILE_GLOBAL"),
    boundary_patterns=(r"TILE_\d+",),
    logit_scale="logit_scale",
    hub_id="CohereLabs/aya-vision-8b",
    geometry=PatchGeometry(layout="dynamic_tiles"),
    tiny="tiny-aya_vision",
    client="tiny_aya_vision",
)

ARCHITECTURES = (AYA_VISION,)
