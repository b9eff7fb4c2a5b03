"""Client side of the Gemma-3 family: its tiny offline model and its processor (transformers;
never shipped to a server). Gemma3Processor needs no video processor."""

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

# Gemma-3's template, reduced (no system turn folding, no tools): like the real one it starts with
# bos_token, and an image is written as <start_of_image> (the processor expands it).
GEMMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
GEMMA3_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                         "<start_of_image>", "<end_of_image>", "<image_soft_token>"]

TILE, PATCH = 32, 8
MM_TOKENS_PER_IMAGE = 4  # (32/8)^2 = 16 patches, 2x2 average-pooled (real: 4096 -> 256)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        GEMMA3_SPECIAL_TOKENS, chat_template=GEMMA3_CHAT_TEMPLATE,
        bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        # as in the real tokenizer_config: Gemma3Processor reads these attributes
        extra_special_tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                              "eoi_token": "<end_of_image>"},
    )
    pad, eos, bos, boi, eoi, image, eot = _ids(tokenizer, "<pad>", "<eos>", "<bos>", "<start_of_image>",
                                               "<end_of_image>", "<image_soft_token>", "<end_of_turn>")
    image_processor = Gemma3ImageProcessorPil(size={"height": TILE, "width": TILE})
    config = Gemma3Config(
        text_config=dict(
            vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
            max_position_embeddings=8192, rms_norm_eps=1e-6, sliding_window=512,
            layer_types=["sliding_attention", "full_attention"],  # real: 5 sliding, then 1 full
            bos_token_id=bos, eos_token_id=[eos, eot], pad_token_id=pad, tie_word_embeddings=True,
        ),
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=TILE, patch_size=PATCH, vision_use_head=False,
        ),
        mm_tokens_per_image=MM_TOKENS_PER_IMAGE, boi_token_index=boi, eoi_token_index=eoi,
        image_token_index=image, tie_word_embeddings=True,
    )
    model = _init_model(Gemma3ForConditionalGeneration, config, seed)
    # transformers initialises the connector's projection weight to zeros (image features all zero,
    # unlike any trained checkpoint): give it random weights, a function of the seed
    import torch

    weight = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed)) / weight.shape[0] ** 0.5)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = [eos, eot]
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "Gemma3Processor", "image_seq_length": MM_TOKENS_PER_IMAGE}})


def load_processor(model_dir):
    """AutoTokenizer + Gemma3ImageProcessorPil in a Gemma3Processor; image_seq_length from
    processor_config.json."""
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    tokenizer, image_processor, template, processor_dict = image_processor_and_template(
        model_dir, Gemma3Processor, Gemma3ImageProcessorPil)
    processor = Gemma3Processor(image_processor, tokenizer, chat_template=template,
                                image_seq_length=processor_dict.get("image_seq_length", 256))
    return check_processor(processor, Gemma3Processor)
