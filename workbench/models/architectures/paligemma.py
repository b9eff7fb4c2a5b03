"""PaliGemma: SigLIP tower, one linear connector, Gemma decoder; a prefix-LM: the image and the
prompt (token_type_ids 0) attend to each other bidirectionally, so the processor's
`token_type_ids` must reach the model, and a prompt cannot be split into a prefill and a decode
step without changing it (kv_swap is refused)."""

from .base import Architecture, PatchGeometry

PALIGEMMA = Architecture(
    family="paligemma",
    model_class="PaliGemmaForConditionalGeneration",
    config_architectures=("PaliGemmaForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    vision_output=("model.multi_modal_projector", "input"),
    # a single linear layer; the model divides its output by sqrt(hidden) before the scatter
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"linear": "model.multi_modal_projector.linear"},
    image_token="<image>",  # the image tokens come first, then <bos>: no framing tokens
    # KEEP token_type_ids: they make the prompt a bidirectional prefix; the processor's training
    # `labels` are left out
    drop_keys=("labels",),
    per_token_keys=("input_ids", "attention_mask", "token_type_ids"),
    # PaliGemma 2's Gemma-2 decoder caps the head's output (transformers 5.25
    # models/paligemma/modeling_paligemma.py); None in PaliGemma 1's config
    logit_softcap="final_logit_softcapping",
    # the whole prompt is one bidirectional prefix: kv_swap (prefill n-1 tokens, decode the last)
    # would compute another model; the plan refuses it
    # positions are 1-based (the model adds 1 to the cache index): a padded decode step passes its own
    prefix_lm=True,
    position_offset=1,
    hub_id="google/paligemma2-3b-pt-224",
    geometry=PatchGeometry(layout="square_grid"),
    tiny="tiny-paligemma",
    client="tiny_paligemma",
)

ARCHITECTURES = (PALIGEMMA,)
