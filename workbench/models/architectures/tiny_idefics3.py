"""Client side of the Idefics3 family: its tiny offline model and its processor (transformers;
never shipped to a server). Idefics3Processor needs no video processor."""

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

# Idefics3-8B-Llama3's template: "<|begin_of_text|>User:<image>question<end_of_utterance>\nAssistant:".
IDEFICS3_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IDEFICS3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
]

TILE, PATCH, SCALE = 32, 8, 2
# (32/8)^2 patches per tile, pixel-shuffled by 2x2: 4 <image> tokens per tile (real: 169 of 364 px)
IMAGE_SEQ_LEN = (TILE // PATCH) ** 2 // SCALE**2


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(IDEFICS3_SPECIAL_TOKENS, chat_template=IDEFICS3_CHAT_TEMPLATE,
                                      bos_token="<|begin_of_text|>", eos_token="<end_of_utterance>",
                                      pad_token="<|reserved_special_token_0|>", unk_token="<|end_of_text|>")
    bos, eot, pad, image, eou = _ids(tokenizer, "<|begin_of_text|>", "<|end_of_text|>",
                                     "<|reserved_special_token_0|>", "<image>", "<end_of_utterance>")
    # tiles of TILE px plus the global image; a 96x64 image gives 2 rows x 3 cols (real: 364 px tiles, 4x364 max)
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=True, max_image_size={"longest_edge": TILE},
                                                size={"longest_edge": 3 * TILE})
    # pad_token_id: transformers 5.25 configuration_utils.py wraps every config's init to take extra
    # kwargs (`__init_subclass__`), which its dataclass_transform does not tell a type checker
    config = Idefics3Config(  # type: ignore[call-arg]
        text_config=dict(
            model_type="llama", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            bos_token_id=bos, eos_token_id=eot, pad_token_id=pad, tie_word_embeddings=False,
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=TILE, patch_size=PATCH),  # image_size == max_image_size.longest_edge
        scale_factor=SCALE,
        image_token_id=image,
        pad_token_id=pad,  # otherwise 128002, outside this vocab
        tie_word_embeddings=False,
    )
    model = _init_model(Idefics3ForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = [eou, eot]
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "Idefics3Processor", "image_seq_len": IMAGE_SEQ_LEN}})


def load_processor(model_dir):
    """AutoTokenizer + Idefics3ImageProcessorPil in an Idefics3Processor; image_seq_len from
    processor_config.json (169, the real checkpoints', when absent)."""
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    tokenizer, image_processor, template, processor_dict = image_processor_and_template(
        model_dir, Idefics3Processor, Idefics3ImageProcessorPil)
    processor = Idefics3Processor(image_processor, tokenizer, chat_template=template,
                                  image_seq_len=processor_dict.get("image_seq_len", 169))
    return check_processor(processor, Idefics3Processor)
