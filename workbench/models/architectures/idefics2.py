"""Idefics2: SigLIP-style tower at native resolution, connector = MLP `modality_projection` then
a Perceiver resampler (a fixed number of latents per image), Mistral decoder; each image framed by
<fake_token_around_image>."""

from .base import Architecture, no_positions

IDEFICS2 = Architecture(
    family="idefics2",
    model_class="Idefics2ForConditionalGeneration",
    config_architectures=("Idefics2ForConditionalGeneration",),
    embed="model.text_model.embed_tokens",
    decoder_layers="model.text_model.layers",
    final_norm="model.text_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    vision_layers="model.vision_model.encoder.layers",
    vision_output=("model.connector", "input"),
    projector=("model.connector",),
    projector_merger="model.connector",
    projector_parts={"modality_projection": "model.connector.modality_projection",
                     "perceiver_resampler": "model.connector.perceiver_resampler"},
    image_token="<image>",
    boundary_tokens=("<fake_token_around_image>",),
    nest_images=True,  # the processor takes images per sample: [[img]]
    hub_id="HuggingFaceM4/idefics2-8b",
    geometry=no_positions("its Perceiver resampler pools every patch into a fixed set of latents: a latent "
                            "has no place in the image"),
    tiny="tiny-idefics2",
    client="tiny_idefics2",
)

ARCHITECTURES = (IDEFICS2,)
