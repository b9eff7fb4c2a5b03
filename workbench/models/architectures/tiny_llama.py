"""Client side of the Llama family: its tiny offline model and its tokenizer (transformers;
never shipped to a server)."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _VOCAB_SIZE, _byte_level_tokenizer, _ids, _init_model, _save, load_tokenizer

# Llama-3-style template. Like the real Llama 3 it starts with bos_token AND the tokenizer adds BOS
# itself, so text rendered with tokenize=False must be tokenized with add_special_tokens=False.
LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'text' %}{{- content['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


LLAMA_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]



def build_tiny_llama(out_dir: Path, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        LLAMA_SPECIAL_TOKENS,
        chat_template=LLAMA_CHAT_TEMPLATE,
        add_bos="<|begin_of_text|>",  # Llama 3's tokenizer prepends BOS itself
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
    )
    bos, eos, end_of_text = _ids(tokenizer, "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>")
    config = LlamaConfig(
        vocab_size=_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        bos_token_id=bos,
        eos_token_id=[eos, end_of_text],
        pad_token_id=end_of_text,
        tie_word_embeddings=False,
    )
    model = _init_model(LlamaForCausalLM, config, seed)
    _save(model, tokenizer, out_dir)




def load_processor(model_dir):
    """The tokenizer alone; its chat template: chat_template.jinja or tokenizer_config.json."""
    return load_tokenizer(model_dir)


build_tiny = build_tiny_llama
