"""Client side of the LLaVA-OneVision family: its tiny offline model and its image-only processor
(transformers; never shipped to a server)."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _byte_level_tokenizer, _ids, _init_model, _save, _VOCAB_SIZE, image_only_class, saved_processor

# llava-onevision-qwen2's template, reduced (no video): Qwen2 chat with the default system prompt,
# the image token on its own line before the text.
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<image>\\n' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAVA_ONEVISION_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]

TILE, PATCH = 32, 8
NUM_IMAGE_TOKENS = (TILE // PATCH) ** 2  # 16 features per tile (real: 729 = (384/14)^2)
# AnyRes resolutions (height, width) in tiles of 32 px (real: 384 px tiles up to 6x6)
GRID_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [64, 96], [96, 64]]


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessorPil)

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(LLAVA_ONEVISION_SPECIAL_TOKENS, chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
                                      eos_token="<|im_end|>", pad_token="<|endoftext|>")
    eot, eos, image, video = _ids(tokenizer, "<|endoftext|>", "<|im_end|>", "<image>", "<video>")
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": TILE, "width": TILE},
                                                      image_grid_pinpoints=GRID_PINPOINTS)
    config = LlavaOnevisionConfig(
        text_config=dict(
            model_type="qwen2", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            bos_token_id=eot, eos_token_id=eos, pad_token_id=eot, tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=TILE, patch_size=PATCH, vision_use_head=False,
        ),
        image_token_index=image, video_token_index=video,
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=GRID_PINPOINTS, tie_word_embeddings=False,
    )
    model = _init_model(LlavaOnevisionForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eot
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "LlavaOnevisionProcessor", "num_image_tokens": NUM_IMAGE_TOKENS,
        "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9"}})


def load_processor(model_dir):
    """AutoTokenizer + LlavaOnevisionImageProcessorPil in a LlavaOnevisionProcessor subclass
    without video; num_image_tokens and the feature strategy from processor_config.json."""
    from transformers import LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor

    return saved_processor(model_dir, LlavaOnevisionProcessor, LlavaOnevisionImageProcessorPil,
                           ("num_image_tokens", "vision_feature_select_strategy", "vision_aspect_ratio"),
                           image_only_class(LlavaOnevisionProcessor))
