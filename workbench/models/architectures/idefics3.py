"""Idefics3: SigLIP tower, pixel-shuffle + linear connector, Llama-3 decoder; each image split into
tiles (`<row_i_col_j>`) plus a global image, framed by `<fake_token_around_image>`. SmolVLM
subclasses it and keeps its module tree (transformers 5.25 models/smolvlm/modular_smolvlm.py)."""

from .base import Architecture, PatchGeometry

IDEFICS3 = Architecture(
    family="idefics3",
    model_class="Idefics3ForConditionalGeneration",
    config_architectures=("Idefics3ForConditionalGeneration",),
    embed="model.text_model.embed_tokens",
    decoder_layers="model.text_model.layers",
    final_norm="model.text_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    vision_layers="model.vision_model.encoder.layers",
    vision_output=("model.connector", "input"),
    # pixel shuffle + linear; its output is exactly the image features scattered into the LLM input
    projector=("model.connector",),
    projector_merger="model.connector",
    projector_parts={"proj": "model.connector.modality_projection.proj"},
    image_token="<image>",
    boundary_tokens=("<fake_token_around_image>", "<global-img>"),
    boundary_patterns=(r"<row_\d+_col_\d+>",),
    nest_images=True,  # the processor takes images per sample: [[img]]
    hub_id="HuggingFaceM4/Idefics3-8B-Llama3",
    geometry=PatchGeometry(layout="split_tiles_global"),
    tiny="tiny-idefics3",
    client="tiny_idefics3",
)

ARCHITECTURES = (IDEFICS3,)
