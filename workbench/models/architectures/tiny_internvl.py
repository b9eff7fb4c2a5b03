"""Client side of the InternVL family: its tiny offline model and its image-only processor
(transformers; never shipped to a server)."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import (
    _VOCAB_SIZE,
    _byte_level_tokenizer,
    _ids,
    _init_model,
    _save,
    check_processor,
    image_only_class,
    image_processor_and_template,
)

# InternVL3-hf's template, reduced (no video): Qwen2 chat, default system prompt, the image as
# <IMG_CONTEXT> on its own line (the processor expands it into <img> + tiles + </img>).
INTERNVL_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<IMG_CONTEXT>\\n' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
INTERNVL_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>",
                           "<video>"]

TILE, PATCH = 32, 8
IMAGE_SEQ_LENGTH = (TILE // PATCH) ** 2 // 4  # 16 patches, pixel-shuffled by 0.5 -> 4 tokens per tile (real: 256)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import GotOcr2ImageProcessorPil, InternVLConfig, InternVLForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        INTERNVL_SPECIAL_TOKENS, chat_template=INTERNVL_CHAT_TEMPLATE, eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # as in InternVL-hf's tokenizer_config: InternVLProcessor reads these attributes
        extra_special_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                              "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"},
    )
    eot, eos, image = _ids(tokenizer, "<|endoftext|>", "<|im_end|>", "<IMG_CONTEXT>")
    # dynamic tiling: up to 6 tiles of 32 px plus a thumbnail (real: 448 px, up to 12)
    image_processor = GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True,
                                               min_patches=1, max_patches=6)
    config = InternVLConfig(
        text_config=dict(
            model_type="qwen2", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            bos_token_id=eot, eos_token_id=eos, pad_token_id=eot, tie_word_embeddings=False,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            image_size=[TILE, TILE], patch_size=[PATCH, PATCH],
        ),
        image_token_id=image, image_seq_length=IMAGE_SEQ_LENGTH, downsample_ratio=0.5, tie_word_embeddings=False,
    )
    model = _init_model(InternVLForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eot
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "InternVLProcessor", "image_seq_length": IMAGE_SEQ_LENGTH}})


def load_processor(model_dir):
    """AutoTokenizer + GotOcr2ImageProcessorPil in an InternVLProcessor subclass without video;
    image_seq_length from processor_config.json."""
    from transformers import GotOcr2ImageProcessorPil, InternVLProcessor

    tokenizer, image_processor, template, processor_dict = image_processor_and_template(
        model_dir, InternVLProcessor, GotOcr2ImageProcessorPil)
    processor = image_only_class(InternVLProcessor)(image_processor, tokenizer, chat_template=template,
                                                     image_seq_length=processor_dict.get("image_seq_length", 256))
    return check_processor(processor, InternVLProcessor)
