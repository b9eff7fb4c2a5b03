"""Client side of the LLaVA-NeXT family: its tiny offline model and its processor (transformers;
never shipped to a server). LlavaNextProcessor needs no video processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _byte_level_tokenizer, _ids, _init_model, _save, _VOCAB_SIZE, saved_processor

# llava-hf/llava-v1.6-mistral-7b-hf's template, reduced: "[INST] <image>\n{text} [/INST]"; the
# Mistral tokenizer adds <s> itself.
LLAVA_NEXT_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}"
    "{%- for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{- '<image>\\n' }}{%- endfor %}"
    "{%- for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{- content['text'] }}{%- endfor %}"
    "{%- endif %}{{- ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{{- message['content'][0]['text'] }}{%- endif %}{{- '</s> ' }}"
    "{%- endif %}"
    "{%- endfor %}"
)
LLAVA_NEXT_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]

TILE, PATCH = 32, 8  # 16 features per tile, CLS dropped (real: 576 at 336 px)
# AnyRes resolutions (height, width) in tiles of 32 px (real: 336 px tiles, up to 2x2 / 1x3)
GRID_PINPOINTS = [[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(LLAVA_NEXT_SPECIAL_TOKENS, chat_template=LLAVA_NEXT_CHAT_TEMPLATE,
                                      add_bos="<s>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                      pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})
    bos, eos, image, pad = _ids(tokenizer, "<s>", "</s>", "<image>", "<pad>")
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": TILE}, crop_size={"height": TILE, "width": TILE},
                                                 image_grid_pinpoints=GRID_PINPOINTS)
    # pad_token_id: transformers 5.25 configuration_utils.py wraps every config's init to take extra
    # kwargs (`__init_subclass__`), which its dataclass_transform does not tell a type checker
    config = LlavaNextConfig(  # type: ignore[call-arg]
        text_config=dict(
            model_type="mistral", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
            rms_norm_eps=1e-5, sliding_window=None, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=2, image_size=TILE, patch_size=PATCH, projection_dim=32,
        ),
        # the penultimate tower layer, CLS row dropped, as LLaVA-1.6
        image_token_index=image, vision_feature_select_strategy="default", vision_feature_layer=-2,
        image_grid_pinpoints=GRID_PINPOINTS, image_seq_length=(TILE // PATCH) ** 2, pad_token_id=pad,
        tie_word_embeddings=False,
    )
    model = _init_model(LlavaNextForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "LlavaNextProcessor", "patch_size": PATCH, "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1}})


def load_processor(model_dir):
    """AutoTokenizer + LlavaNextImageProcessorPil in a LlavaNextProcessor; patch size, feature
    strategy and the CLS count from processor_config.json."""
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    return saved_processor(model_dir, LlavaNextProcessor, LlavaNextImageProcessorPil,
                           ("patch_size", "vision_feature_select_strategy", "num_additional_image_tokens"))
