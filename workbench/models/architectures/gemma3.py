"""Gemma-3: SigLIP tower, pooled connector (avg-pool -> RMSNorm `mm_soft_emb_norm` -> projection
weight), Gemma-3 decoder with peri-LN (norms before and after attention and MLP) and scaled
embeddings. Image tokens attend to each other bidirectionally within their image: the
processor's `token_type_ids` (1 at image tokens) must reach the model."""

from .base import Architecture, PatchGeometry

GEMMA3 = Architecture(
    family="gemma3",
    model_class="Gemma3ForConditionalGeneration",
    config_architectures=("Gemma3ForConditionalGeneration",),
    embed="model.language_model.embed_tokens",  # Gemma3TextScaledWordEmbedding: output x sqrt(hidden)
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    vision_output=("model.multi_modal_projector", "input"),
    # its output is (after the projection weight, a parameter) the image features
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"avg_pool": "model.multi_modal_projector.avg_pool",
                     "mm_soft_emb_norm": "model.multi_modal_projector.mm_soft_emb_norm"},
    image_token="<image_soft_token>",
    boundary_tokens=("<start_of_image>", "<end_of_image>"),
    # KEEP token_type_ids: without it the image block attends causally (a different model)
    drop_keys=(),
    per_token_keys=("input_ids", "attention_mask", "token_type_ids"),
    # peri-LN: what each branch adds to the residual stream is its post-norm's output
    # (post_attention_layernorm(self_attn(...)), post_feedforward_layernorm(mlp(...)))
    branch_outputs={"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"},
    hub_id="google/gemma-3-4b-it",
    geometry=PatchGeometry(layout="square_grid"),
    tiny="tiny-gemma3",
    client="tiny_gemma3",
)

ARCHITECTURES = (GEMMA3,)
