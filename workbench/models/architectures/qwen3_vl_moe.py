"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-VL's tower, DeepStack mergers and
interleaved M-RoPE, its decoder's MLPs sparse mixtures of experts (`mlp.gate` routes each token to its
top-k experts; transformers 5.25 models/qwen3_vl_moe/modeling_qwen3_vl_moe.py)."""

from .base import Architecture, PatchGeometry

QWEN3VLMOE = Architecture(
    family="qwen3_vl_moe",
    model_class="Qwen3VLMoeForConditionalGeneration",
    config_architectures=("Qwen3VLMoeForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.visual",
    vision_layers="model.visual.blocks",
    vision_output=("model.visual.merger", "input"),
    # DeepStack mergers run inside the vision tower (after their blocks), the merger last. Their
    # outputs are ADDED to the residual stream at vision positions after decoder layers 0..k, so a
    # faithful "projector output" intervention must reach all of them.
    projector=("model.visual.deepstack_merger_list.*", "model.visual.merger"),
    projector_merger="model.visual.merger",
    projector_parts={"deepstack": "model.visual.deepstack_merger_list.*", "merger": "model.visual.merger"},
    image_token="<|image_pad|>",
    boundary_tokens=("<|vision_start|>", "<|vision_end|>"),
    # M-RoPE: decode steps need explicit 3-D position ids; `rope_deltas` is cached on the model.
    # deepstack: its mergers run between vision blocks (the plan keeps their edits apart from the
    # vision-tower sites)
    mrope=True,
    deepstack=True,
    # required whenever image_grid_thw is passed, one entry per token
    per_token_keys=("input_ids", "attention_mask", "mm_token_type_ids"),
    # Qwen3VLMoeTextTopKRouter returns (logits, top-k weights, top-k indices)
    router="mlp.gate",
    router_logits=0,
    geometry=PatchGeometry(layout="merged_grid"),  # Qwen3-VL's processor
    hub_id="Qwen/Qwen3-VL-30B-A3B-Instruct",
    tiny="tiny-qwen3_vl_moe",
    client="tiny_qwen3_vl_moe",
)

ARCHITECTURES = (QWEN3VLMOE,)
