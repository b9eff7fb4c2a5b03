"""LFM2-VL: a SigLIP2 NaFlex tower over native-resolution patches, a connector of a 2x2 pixel
unshuffle, LayerNorm and a 2-layer MLP, and LFM2, a hybrid decoder whose layers are short gated
convolutions or grouped-query attention (`layer_types`; transformers 5.25
models/lfm2_vl/modeling_lfm2_vl.py, models/lfm2/modeling_lfm2.py).

The residual stream is every layer's. Only the attention layers have a KV cache, attention and
keys: `keys`, `values`, `keys_pre`, `attention`, `attn_out` (and `mlp_out`, since a store keeps one
`decoder_layer` coordinate) take those layers (`all` means them,
and the stored `decoder_layer` coordinate names them); a convolution layer's cache is a rolling
state of its last `conv_L_cache` inputs, not K/V per position, so `kv_swap` swaps the attention
layers' K/V and refuses convolution layers with the reason. Large images are split into 512 px
tiles plus a thumbnail, framed by `<|img_row_i_col_j|>` and `<|img_thumbnail|>`."""

from .base import Architecture, PatchGeometry

LFM2_VL = Architecture(
    family="lfm2_vl",
    model_class="Lfm2VlForConditionalGeneration",
    config_architectures=("Lfm2VlForConditionalGeneration",),
    embed="model.language_model.embed_tokens",
    decoder_layers="model.language_model.layers",
    final_norm="model.language_model.embedding_norm",   # LFM2's final norm (applied after the layers)
    lm_head="lm_head",
    vision="model.vision_tower",
    vision_layers="model.vision_tower.encoder.layers",
    # the tower's output (after post_layernorm), one row per patch, before the 2x2 unshuffle
    vision_output=("model.vision_tower", "output"),
    projector=("model.multi_modal_projector",),
    projector_merger="model.multi_modal_projector",
    projector_parts={"layer_norm": "model.multi_modal_projector.layer_norm",
                     "linear_1": "model.multi_modal_projector.linear_1",
                     "linear_2": "model.multi_modal_projector.linear_2"},
    image_token="<image>",
    boundary_tokens=("<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"),
    boundary_patterns=(r"<\|img_row_\d+_col_\d+\|>",),
    branch_outputs={"attn_out": "self_attn", "mlp_out": "feed_forward"},
    output_projection_call="self_out_proj_0",  # Lfm2Attention's projection is `out_proj`
    layer_types="layer_types",
    # the projector reads one grid of every image's patches (`get_image_features`): batch dim 1
    packed_connector=True,
    # a family layout: one smart-resized grid, or tiles and a thumbnail (tiny_lfm2_vl.layout)
    geometry=PatchGeometry(layout="layout"),
    hub_id="LiquidAI/LFM2-VL-1.6B",
    tiny="tiny-lfm2_vl",
    client="tiny_lfm2_vl",
)

ARCHITECTURES = (LFM2_VL,)
