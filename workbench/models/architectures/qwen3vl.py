"""Qwen3-VL: ViT with DeepStack mergers, patch merger, Qwen3 decoder with interleaved M-RoPE."""

from .base import Architecture, PatchGeometry

QWEN3VL = Architecture(
    family="qwen3vl",
    model_class="Qwen3VLForConditionalGeneration",
    config_architectures=("Qwen3VLForConditionalGeneration",),
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
    hub_id="Qwen/Qwen3-VL-2B-Instruct",
    geometry=PatchGeometry(layout="merged_grid"),
    tiny="tiny-qwen3vl",
    client="tiny_qwen3vl",
)

ARCHITECTURES = (QWEN3VL,)
