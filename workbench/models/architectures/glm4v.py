"""GLM-4.1V / GLM-4.5V-style (Glm4v): ViT with 2-D RoPE and interpolated absolute positions, a
connector of a 2x2 strided conv (`downsample`) and a gated MLP (`merger`), GLM-4 decoder with
sandwich norms (each branch's output normed before it is added) and M-RoPE over (t, h, w), with
`rope_deltas` cached on the model as Qwen2-VL's (transformers 5.25 models/glm4v/modeling_glm4v.py)."""

from .base import Architecture, PatchGeometry

GLM4V = Architecture(
    family="glm4v",
    model_class="Glm4vForConditionalGeneration",
    config_architectures=("Glm4vForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.visual",
    vision_layers="model.visual.blocks",
    # the tower's output (after its last RMSNorm), one row per patch, before the conv merges 2x2
    vision_output=("model.visual.post_layernorm", "output"),
    projector=("model.visual.merger",),
    projector_merger="model.visual.merger",
    projector_parts={"downsample": "model.visual.downsample", "proj": "model.visual.merger.proj",
                     "down_proj": "model.visual.merger.down_proj"},
    image_token="<|image|>",
    boundary_tokens=("<|begin_of_image|>", "<|end_of_image|>"),
    mrope=True,  # `rope_deltas` cached on the model between forwards
    per_token_keys=("input_ids", "attention_mask", "mm_token_type_ids"),
    # sandwich norms: what each branch adds is the output of the norm after it
    branch_outputs={"attn_out": "post_self_attn_layernorm", "mlp_out": "post_mlp_layernorm"},
    hub_id="zai-org/GLM-4.1V-9B-Thinking",
    geometry=PatchGeometry(layout="merged_grid"),
    tiny="tiny-glm4v",
    client="tiny_glm4v",
)

ARCHITECTURES = (GLM4V,)
