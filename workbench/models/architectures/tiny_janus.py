"""Client side of the Janus family: its tiny offline model and its processor (transformers; never
shipped to a server). JanusProcessor needs no video processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _byte_level_tokenizer, _ids, _init_model, _save, _VOCAB_SIZE, saved_processor

# Janus-Pro's chat format, reduced (no system prompt): "<|User|>: <image_placeholder>\nquestion\n\n
# <|Assistant|>:"; the processor expands the placeholder to <begin_of_image>, N image tokens,
# <end_of_image>; the tokenizer adds its BOS itself
JANUS_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'].capitalize() + '|>: ' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<image_placeholder>\\n' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '\\n\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|Assistant|>:' }}{%- endif %}"
)
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
JANUS_SPECIAL_TOKENS = [BOS, EOS, "<image_placeholder>", "<begin_of_image>", "<end_of_image>", "<pad>"]

IMAGE, PATCH = 32, 8
NUM_PATCHES = (IMAGE // PATCH) ** 2  # 16 image tokens (real: 576 at 384 px)


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import JanusConfig, JanusForConditionalGeneration, JanusImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        JANUS_SPECIAL_TOKENS, chat_template=JANUS_CHAT_TEMPLATE, add_bos=BOS, bos_token=BOS, eos_token=EOS,
        pad_token="<pad>", extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>",
                                                 "eoi_token": "<end_of_image>"})
    bos, eos, image, pad = _ids(tokenizer, BOS, EOS, "<image_placeholder>", "<pad>")
    image_processor = JanusImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, min_size=PATCH)
    config = JanusConfig(
        text_config=dict(
            model_type="llama", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
            bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False,
        ),
        # aligner depth 2: fc1 -> GELU -> one hidden layer (as Janus-Pro)
        vision_config=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=IMAGE,
                           patch_size=PATCH, mlp_ratio=2.0, projection_dim=64, depth=2, num_image_tokens=NUM_PATCHES),
        # the image-generation VQ-VAE, as small as its GroupNorm(32 groups) allows; unused when reading images
        vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, num_patches=4, projection_dim=64, image_token_embed_dim=64,
                       num_hidden_layers=1),
        image_token_id=image, tie_word_embeddings=False,
    )
    model = _init_model(JanusForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "JanusProcessor", "num_image_tokens": NUM_PATCHES}})


def load_processor(model_dir):
    """AutoTokenizer + JanusImageProcessorPil in a JanusProcessor; the image's token count from
    processor_config.json (`num_image_tokens`)."""
    from transformers import JanusImageProcessorPil, JanusProcessor

    return saved_processor(model_dir, JanusProcessor, JanusImageProcessorPil, ("num_image_tokens",))
