"""Client side of the Idefics2 family: its tiny offline model and its processor (transformers;
never shipped to a server). Idefics2Processor needs no video processor."""

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

# idefics2-8b's template: "User:<image>question<end_of_utterance>\nAssistant:" after BOS.
IDEFICS2_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}{{- message['role'] | capitalize }}"
    "{%- if message['content'][0]['type'] == 'image' %}{{- ':' }}{%- else %}{{- ': ' }}{%- endif %}"
    "{%- for line in message['content'] %}"
    "{%- if line['type'] == 'text' %}{{- line['text'] }}"
    "{%- elif line['type'] == 'image' %}{{- '<image>' }}{%- endif %}"
    "{%- endfor %}{{- '<end_of_utterance>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}"
)
IDEFICS2_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<fake_token_around_image>", "<image>", "<end_of_utterance>"]

TILE, PATCH = 32, 8
N_LATENTS = 4  # image tokens per image: the resampler's latents (real: 64)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Idefics2Config, Idefics2ForConditionalGeneration, Idefics2ImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(IDEFICS2_SPECIAL_TOKENS, chat_template=IDEFICS2_CHAT_TEMPLATE,
                                      bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    unk, bos, eos, image, eou = _ids(tokenizer, "<unk>", "<s>", "</s>", "<image>", "<end_of_utterance>")
    image_processor = Idefics2ImageProcessorPil(size={"shortest_edge": TILE, "longest_edge": 2 * TILE},
                                                do_image_splitting=False)
    config = Idefics2Config(
        text_config=dict(
            model_type="mistral", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=None,
            bos_token_id=bos, eos_token_id=eos, pad_token_id=unk, tie_word_embeddings=False,
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=2 * TILE, patch_size=PATCH),
        perceiver_config=dict(hidden_size=64, resampler_n_latents=N_LATENTS, resampler_depth=1, resampler_n_heads=2,
                              resampler_head_dim=16, num_key_value_heads=1),
        image_token_id=image, tie_word_embeddings=False,
    )
    model = _init_model(Idefics2ForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = [eos, eou]
    model.generation_config.pad_token_id = unk
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "Idefics2Processor", "image_seq_len": N_LATENTS}})


def load_processor(model_dir):
    """AutoTokenizer + Idefics2ImageProcessorPil in an Idefics2Processor; image_seq_len from
    processor_config.json."""
    from transformers import Idefics2ImageProcessorPil, Idefics2Processor

    tokenizer, image_processor, template, processor_dict = image_processor_and_template(
        model_dir, Idefics2Processor, Idefics2ImageProcessorPil)
    processor = Idefics2Processor(image_processor, tokenizer, chat_template=template,
                                  image_seq_len=processor_dict.get("image_seq_len", 64))
    return check_processor(processor, Idefics2Processor)
