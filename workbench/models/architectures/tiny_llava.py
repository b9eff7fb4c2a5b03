"""Client side of the LLaVA-1.5 family: its tiny offline model and its processor (transformers;
never shipped to a server). LlavaProcessor needs no video processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _byte_level_tokenizer, _ids, _init_model, _save, _VOCAB_SIZE, saved_processor

# llava-hf/llava-1.5-7b-hf's template: "USER: <image>\n{text} ASSISTANT:"; the Llama-2 tokenizer
# adds <s> itself.
LLAVA_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] != 'system' %}{{- message['role'].upper() + ': ' }}{%- endif %}"
    "{%- if message['content'] is string %}{{- message['content'] + ' ' }}"
    "{%- else %}"
    "{%- for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{- '<image>\\n' }}{%- endfor %}"
    "{%- for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{- content['text'] + ' ' }}{%- endfor %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'ASSISTANT:' }}{%- endif %}"
)
LLAVA_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]

IMAGE, PATCH = 32, 8
NUM_PATCHES = (IMAGE // PATCH) ** 2  # 16 image tokens: the CLS row is dropped (real: 576 at 336 px)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(LLAVA_SPECIAL_TOKENS, chat_template=LLAVA_CHAT_TEMPLATE, add_bos="<s>",
                                      bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                      extra_special_tokens={"image_token": "<image>"})
    bos, eos, image, pad = _ids(tokenizer, "<s>", "</s>", "<image>", "<pad>")
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE})
    # pad_token_id: transformers 5.25 configuration_utils.py wraps every config's init to take extra
    # kwargs (`__init_subclass__`), which its dataclass_transform does not tell a type checker
    config = LlavaConfig(  # type: ignore[call-arg]
        text_config=dict(
            model_type="llama", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-5,
            bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=2, image_size=IMAGE, patch_size=PATCH, projection_dim=32,
        ),
        # the penultimate tower layer, CLS row dropped, as LLaVA-1.5
        image_token_index=image, vision_feature_select_strategy="default", vision_feature_layer=-2,
        image_seq_length=NUM_PATCHES, pad_token_id=pad, tie_word_embeddings=False,
    )
    model = _init_model(LlavaForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "LlavaProcessor", "patch_size": PATCH, "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1}})


def load_processor(model_dir):
    """AutoTokenizer + CLIPImageProcessorPil in a LlavaProcessor; patch size, feature strategy and
    the CLS count from processor_config.json."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    return saved_processor(model_dir, LlavaProcessor, CLIPImageProcessorPil,
                           ("patch_size", "vision_feature_select_strategy", "num_additional_image_tokens"))
