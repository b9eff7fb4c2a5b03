"""Client side of the PaliGemma family: its tiny offline model and its processor (transformers;
never shipped to a server). PaliGemmaProcessor needs no video processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import (
    _VOCAB_SIZE,
    _byte_level_tokenizer,
    _ids,
    _init_model,
    _save,
    check_processor,
    load_tokenizer,
)

# PaliGemma checkpoints ship no chat template: the prompt is the question, after the image (the
# processor then writes "<image>"*N + "<bos>" + prompt + "\n"). This template renders exactly that
# prompt; load_processor uses it for checkpoints without one.
PALIGEMMA_PROMPT_TEMPLATE = (
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}{%- endif %}{%- endfor %}"
)
PALIGEMMA_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<image>"]

TILE, PATCH = 32, 8
IMAGE_SEQ_LENGTH = (TILE // PATCH) ** 2  # 16 image tokens (real: 256 at 224 px)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(PALIGEMMA_SPECIAL_TOKENS, chat_template=PALIGEMMA_PROMPT_TEMPLATE,
                                      bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                      extra_special_tokens={"image_token": "<image>"})
    pad, eos, bos, image = _ids(tokenizer, "<pad>", "<eos>", "<bos>", "<image>")
    image_processor = SiglipImageProcessorPil(size={"height": TILE, "width": TILE})
    # saved in preprocessor_config.json, as real ones; not an attribute the class declares
    setattr(image_processor, "image_seq_length", IMAGE_SEQ_LENGTH)
    config = PaliGemmaConfig(
        text_config=dict(
            model_type="gemma", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
            rms_norm_eps=1e-6, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
            # PaliGemma 2's cap of the head's output (30 there; small here, so it bites on a tiny
            # model's logits and the oracle tests see whether the sites apply it)
            final_logit_softcapping=2.0,
        ),
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=TILE, patch_size=PATCH, projection_dim=64,
        ),
        image_token_index=image, projection_dim=64, hidden_size=64, vocab_size=_VOCAB_SIZE,
    )
    model = _init_model(PaliGemmaForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {"processor_class": "PaliGemmaProcessor"}})


def load_processor(model_dir):
    """AutoTokenizer + SiglipImageProcessorPil in a PaliGemmaProcessor; the prompt template above
    when the checkpoint has none."""
    from transformers import PaliGemmaProcessor, SiglipImageProcessorPil

    model_dir = str(model_dir)
    tokenizer = load_tokenizer(model_dir)
    image_processor = SiglipImageProcessorPil.from_pretrained(model_dir)
    processor_dict, _ = PaliGemmaProcessor.get_processor_dict(model_dir)
    template = processor_dict.get("chat_template") or tokenizer.chat_template or PALIGEMMA_PROMPT_TEMPLATE
    processor = PaliGemmaProcessor(image_processor, tokenizer, chat_template=template)
    return check_processor(processor, PaliGemmaProcessor)
