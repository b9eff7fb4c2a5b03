"""Client side of the Mllama family (Llama 3.2 Vision): its tiny offline model and its processor
(transformers; never shipped to a server). MllamaProcessor needs no video processor.

transformers zero-initialises every `cross_attn_attn_gate` and `cross_attn_mlp_gate` (5.25
models/mllama/modeling_mllama.py `_init_weights`), as Meta's training starts: a random tiny Mllama
would ignore its image (tanh(0) = 0). The builder sets them to fixed non-zero values so the image
reaches the residual stream, as it does in the trained checkpoints."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _VOCAB_SIZE, _byte_level_tokenizer, _ids, _init_model, _save, check_processor, load_tokenizer

# Llama 3.2 Vision Instruct's template, reduced (no system prompt, no tools): the image marker
# opens the user turn's content, as in the real template.
MLLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<|image|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
MLLAMA_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                         "<|eot_id|>", "<|finetune_right_pad_id|>", "<|python_tag|>", "<|image|>"]

IMAGE, PATCH = 32, 8   # one 32 px tile: 16 patches + CLS = 17 vision tokens (real: 4 tiles of 1601 at 560 px)
CROSS_LAYERS = [1]  # of 3 decoder layers (real: every 5th of 40, from 3)
# tanh(0.5) = 0.46: the image moves the residual stream by a share comparable to a text branch
GATE = 0.5


def build_tiny(out_dir: Path, seed: int, tiles: int = 1) -> None:
    """The tiny model into `out_dir`. `tiles` > 1 (tests only): images of up to that many tiles,
    in every arrangement the image processor considers, so a square image fills one tile and the
    others are padding."""
    import torch
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaImageProcessorPil
    from transformers.models.mllama.image_processing_pil_mllama import get_all_supported_aspect_ratios

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(MLLAMA_SPECIAL_TOKENS, chat_template=MLLAMA_CHAT_TEMPLATE,
                                      bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                      pad_token="<|finetune_right_pad_id|>")
    bos, eos, end, pad, image = _ids(tokenizer, "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>",
                                     "<|finetune_right_pad_id|>", "<|image|>")
    # one tile per image: every image fills its tiles, so no tile is padding (real: up to 4)
    image_processor = MllamaImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, max_image_tiles=tiles)
    # the config's aspect-ratio embeddings are indexed by the processor's arrangements
    aspects = [list(a) for a in get_all_supported_aspect_ratios(tiles)]
    config = MllamaConfig(
        text_config=dict(
            vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
            cross_attention_layers=CROSS_LAYERS, bos_token_id=bos, eos_token_id=[eos, end], pad_token_id=pad,
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
            image_size=IMAGE, patch_size=PATCH, max_num_tiles=tiles, supported_aspect_ratios=aspects,
            # the projector reads the tower's output and these layers' outputs, concatenated
            intermediate_layers_indices=[0, 1], vision_output_dim=32 * 3,
        ),
        image_token_index=image,
    )
    model = _init_model(MllamaForConditionalGeneration, config, seed)
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            if hasattr(layer, "cross_attn_attn_gate"):
                layer.cross_attn_attn_gate.fill_(GATE)
                layer.cross_attn_mlp_gate.fill_(GATE)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = [eos, end]
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {"processor_class": "MllamaProcessor"}})


def load_processor(model_dir):
    """AutoTokenizer + MllamaImageProcessorPil in a MllamaProcessor."""
    from transformers import MllamaImageProcessorPil, MllamaProcessor

    model_dir = str(model_dir)
    tokenizer = load_tokenizer(model_dir)
    image_processor = MllamaImageProcessorPil.from_pretrained(model_dir)
    if type(image_processor) is not MllamaImageProcessorPil:
        raise TypeError(f"{model_dir}: expected MllamaImageProcessorPil, got {type(image_processor).__name__}")
    processor_dict, _ = MllamaProcessor.get_processor_dict(model_dir)
    template = processor_dict.get("chat_template") or tokenizer.chat_template
    if template is None:
        raise ValueError(f"{model_dir}: no chat template (chat_template.json/.jinja, processor or tokenizer config)")
    processor = MllamaProcessor(image_processor, tokenizer, chat_template=template)
    return check_processor(processor, MllamaProcessor)
