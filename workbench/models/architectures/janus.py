"""Janus / Janus-Pro (understanding path): SigLIP-style ViT tower read at its output (after
`post_layernorm`), an MLP aligner (fc1, then GELU + linear per hidden layer), Llama decoder; one
fixed 384 px image of 576 tokens framed by `<begin_of_image>` / `<end_of_image>`. The image
generation parts (VQ-VAE, generation head) do not run when reading an image (transformers 5.25
models/janus/modeling_janus.py)."""

from .base import Architecture, PatchGeometry

JANUS = Architecture(
    family="janus",
    model_class="JanusForConditionalGeneration",
    config_architectures=("JanusForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    vision_layers="model.vision_model.encoder.layers",
    # the tower's last_hidden_state, one row per patch, as the aligner receives it
    vision_output=("model.aligner", "input"),
    projector=("model.aligner",),
    projector_merger="model.aligner",
    projector_parts={"fc1": "model.aligner.fc1", "hidden_layers": "model.aligner.hidden_layers.*"},
    image_token="<image_placeholder>",
    # the longest side resized, centred on a square of the background colour, one token per patch
    geometry=PatchGeometry(layout="padded_square_grid"),
    boundary_tokens=("<begin_of_image>", "<end_of_image>"),
    hub_id="deepseek-community/Janus-Pro-1B",
    tiny="tiny-janus",
    client="tiny_janus",
)

ARCHITECTURES = (JANUS,)
