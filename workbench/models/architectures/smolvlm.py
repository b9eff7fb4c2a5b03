"""SmolVLM: SigLIP tower, pixel-shuffle + linear connector, Llama decoder (Idefics3's module tree,
its own model type; Idefics3 is the family `idefics3`)."""

from .base import Architecture, PatchGeometry

SMOLVLM = Architecture(
    family="smolvlm",
    model_class="SmolVLMForConditionalGeneration",
    config_architectures=("SmolVLMForConditionalGeneration",),
    embed="model.text_model.embed_tokens",
    decoder_layers="model.text_model.layers",
    final_norm="model.text_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    vision_layers="model.vision_model.encoder.layers",
    vision_output=("model.connector", "input"),
    # pixel shuffle + MLP; its output is exactly the image features scattered into the LLM input
    projector=("model.connector",),
    projector_merger="model.connector",
    projector_parts={"proj": "model.connector.modality_projection.proj"},
    image_token="<image>",
    boundary_tokens=("<fake_token_around_image>", "<global-img>"),
    boundary_patterns=(r"<row_\d+_col_\d+>",),
    nest_images=True,  # the processor splits images per sample: [[img]]
    hub_id="HuggingFaceTB/SmolVLM2-2.2B-Instruct",
    geometry=PatchGeometry(layout="split_tiles_global"),
    tiny="tiny-smolvlm",
    client="tiny_smolvlm",
)

ARCHITECTURES = (SMOLVLM,)
