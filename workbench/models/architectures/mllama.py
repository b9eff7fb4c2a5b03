"""Mllama (Llama 3.2 Vision): a ViT over up to 4 tiles (local then gated global layers, CLS row
per tile), a linear projector over the tower's output concatenated with intermediate layers, and
a Llama decoder in which every few layers (`cross_attention_layers`) is a gated cross-attention
layer whose K/V are the projected image (transformers 5.25 models/mllama/modeling_mllama.py).

The image never enters the token sequence: the residual stream holds text positions and the
`<|image|>` marker (an ordinary embedding, labelled boundary); the image reaches it only through
the cross-attention layers, whose K/V (one row per vision token, every tile's CLS included) are
the site `cross_kv`, and which `kv_swap` takes from a donor image. Self-attention sites (`keys`,
`values`, `keys_pre`, `attention`, `attn_out`, `mlp_out`) exist at the other layers only."""

from .base import Architecture, no_positions

MLLAMA = Architecture(
    family="mllama",
    model_class="MllamaForConditionalGeneration",
    config_architectures=("MllamaForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.norm",
    lm_head="lm_head",
    vision="model.vision_model",
    # none: the tower's layers pad each tile's rows to a multiple of 8 and run one hidden size
    # narrower than its output (the projector reads the output concatenated with intermediate
    # layers), so their rows are not the `vision` rows
    vision_layers=None,
    # (batch, images, tiles, patches + CLS, vision_output_dim): the rows the cross-attention reads
    vision_output=("model.multi_modal_projector", "input"),
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    image_token="<|image|>",
    cross_attention_layers="cross_attention_layers",
    # the cross-attention mask is per token: cut with the prompt (kv_swap's truncated prefill)
    per_token_keys=("input_ids", "attention_mask", "cross_attention_mask"),
    geometry=no_positions("the image enters through the cross-attention layers' K/V, never the token "
                          "sequence: no token of the residual stream has a place in it"),
    hub_id="meta-llama/Llama-3.2-11B-Vision-Instruct",
    tiny="tiny-mllama",
    client="tiny_mllama",
)

ARCHITECTURES = (MLLAMA,)
