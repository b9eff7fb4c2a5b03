"""Client side of the Aya Vision family: its tiny offline model and its processor (transformers;
never shipped to a server). AyaVisionProcessor needs no video processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import (
    _VOCAB_SIZE,
    _byte_level_tokenizer,
    _ids,
    _init_model,
    _save,
    check_processor,
    image_processor_and_template,
)

# aya-vision-8b's template, reduced (no system preamble, no tools): Cohere turns, the image as
# `<image>`, which the processor expands into tiles.
AYA_VISION_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|START_OF_TURN_TOKEN|>' + ('<|USER_TOKEN|>' if message['role'] == 'user' else '<|CHATBOT_TOKEN|>') }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|END_OF_TURN_TOKEN|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif %}"
)
AYA_VISION_SPECIAL_TOKENS = [
    "<PAD>", "<UNK>", "<BOS_TOKEN>", "<EOS_TOKEN>",
    "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
    "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>",
    "TILE", "TILE_GLOBAL", *[f"TILE_{i}" for i in range(1, 7)],
]

TILE, PATCH, DOWNSAMPLE = 32, 8, 2
MAX_TILES = 6  # tiles of 32 px besides the global view (real: 364 px, up to 12)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import AyaVisionConfig, AyaVisionForConditionalGeneration, GotOcr2ImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(AYA_VISION_SPECIAL_TOKENS, chat_template=AYA_VISION_CHAT_TEMPLATE,
                                      bos_token="<BOS_TOKEN>", eos_token="<|END_OF_TURN_TOKEN|>",
                                      pad_token="<PAD>", unk_token="<UNK>")
    pad, bos, eos, patch = _ids(tokenizer, "<PAD>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|IMG_PATCH|>")
    image_processor = GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True,
                                               min_patches=1, max_patches=MAX_TILES,
                                               image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    config = AyaVisionConfig(
        text_config=dict(
            model_type="cohere2", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
            layer_types=["sliding_attention", "full_attention"], sliding_window=4096,
            bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=True,
            # not 1 (real: 0.0625), so the oracle tests see whether the sites apply it
            logit_scale=0.5,
        ),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, image_size=TILE, patch_size=PATCH,
                           vision_use_head=False),
        downsample_factor=DOWNSAMPLE,
        image_token_index=patch,
        tie_word_embeddings=True,  # as aya-vision-8b
    )
    model = _init_model(AyaVisionForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    # (32/8)^2 patches per tile, pixel-shuffled by 2x2: 4 patch tokens per tile (real: 169)
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "AyaVisionProcessor", "img_size": TILE, "patch_size": PATCH * DOWNSAMPLE}})


def load_processor(model_dir):
    """AutoTokenizer + GotOcr2ImageProcessorPil in an AyaVisionProcessor; img_size and patch_size
    (the tile's side, and the vision patch times the pixel shuffle) from processor_config.json."""
    from transformers import AyaVisionProcessor, GotOcr2ImageProcessorPil

    tokenizer, image_processor, template, processor_dict = image_processor_and_template(
        model_dir, AyaVisionProcessor, GotOcr2ImageProcessorPil)
    processor = AyaVisionProcessor(image_processor, tokenizer, chat_template=template,
                                   img_size=processor_dict.get("img_size", 364),
                                   patch_size=processor_dict.get("patch_size", 28),
                                   downsample_factor=processor_dict.get("downsample_factor", 1))
    return check_processor(processor, AyaVisionProcessor)
