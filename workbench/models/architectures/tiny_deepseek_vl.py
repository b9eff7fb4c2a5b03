"""Client side of the DeepSeek-VL family: its tiny offline model and its processor (transformers;
never shipped to a server). DeepseekVLProcessor needs no video processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _byte_level_tokenizer, _ids, _init_model, _save, _VOCAB_SIZE, saved_processor

# DeepSeek-VL's chat format, reduced (no system prompt): "User: <image_placeholder>question\n\n
# Assistant:"; the tokenizer adds its BOS itself
DEEPSEEK_VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- message['role'].capitalize() + ': ' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<image_placeholder>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '\\n\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}"
)
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
DEEPSEEK_VL_SPECIAL_TOKENS = [BOS, EOS, "<image_placeholder>", "<pad>"]

IMAGE, PATCH = 32, 8
NUM_PATCHES = (IMAGE // PATCH) ** 2  # 16 image tokens (real: 576 at 384 px)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import DeepseekVLConfig, DeepseekVLForConditionalGeneration, DeepseekVLImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(DEEPSEEK_VL_SPECIAL_TOKENS, chat_template=DEEPSEEK_VL_CHAT_TEMPLATE,
                                      add_bos=BOS, bos_token=BOS, eos_token=EOS, pad_token="<pad>",
                                      extra_special_tokens={"image_token": "<image_placeholder>"})
    bos, eos, image, pad = _ids(tokenizer, BOS, EOS, "<image_placeholder>", "<pad>")
    image_processor = DeepseekVLImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, min_size=PATCH)
    config = DeepseekVLConfig(
        text_config=dict(
            model_type="llama", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
            bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=2, image_size=IMAGE, patch_size=PATCH, vision_use_head=False,
        ),
        image_token_id=image, tie_word_embeddings=False,
    )
    model = _init_model(DeepseekVLForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "DeepseekVLProcessor", "num_image_tokens": NUM_PATCHES}})


def load_processor(model_dir):
    """AutoTokenizer + DeepseekVLImageProcessorPil in a DeepseekVLProcessor; the image's token
    count from processor_config.json (`num_image_tokens`)."""
    from transformers import DeepseekVLImageProcessorPil, DeepseekVLProcessor

    return saved_processor(model_dir, DeepseekVLProcessor, DeepseekVLImageProcessorPil, ("num_image_tokens",))
