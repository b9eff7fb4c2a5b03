"""Client side of the Qwen2-VL family: its tiny offline model and its image-only processor
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
from .tiny_qwen2_5_vl import QWEN2_5_VL_CHAT_TEMPLATE, QWEN2_5_VL_SPECIAL_TOKENS

# Qwen2-VL's template and special tokens are Qwen2.5-VL's (reduced the same way: no tools, no video)
QWEN2_VL_CHAT_TEMPLATE = QWEN2_5_VL_CHAT_TEMPLATE
QWEN2_VL_SPECIAL_TOKENS = QWEN2_5_VL_SPECIAL_TOKENS

PATCH, MERGE = 8, 2
_FACTOR = PATCH * MERGE


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(QWEN2_VL_SPECIAL_TOKENS, chat_template=QWEN2_VL_CHAT_TEMPLATE,
                                      eos_token="<|im_end|>", pad_token="<|endoftext|>")
    eot, eos, v_start, v_end, image, video = _ids(tokenizer, "<|endoftext|>", "<|im_end|>", "<|vision_start|>",
                                                 "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    image_processor = Qwen2VLImageProcessorPil(patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE,
                                               min_pixels=4 * _FACTOR**2, max_pixels=32 * _FACTOR**2)
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-6,
            # head_dim 16: mrope_section sums to 8 (real: [16, 24, 24] of 64)
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]},
            bos_token_id=eot, eos_token_id=eos, pad_token_id=eot, tie_word_embeddings=True,
        ),
        # hidden_size is the merger's output width: the LLM's (real: embed_dim 1280, depth 32)
        vision_config=dict(
            depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=PATCH,
            spatial_merge_size=MERGE, temporal_patch_size=2,
        ),
        image_token_id=image, video_token_id=video, vision_start_token_id=v_start, vision_end_token_id=v_end,
        tie_word_embeddings=True,  # tied, like Qwen2-VL-2B
    )
    model = _init_model(Qwen2VLForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = [eos, eot]
    model.generation_config.pad_token_id = eot
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {"processor_class": "Qwen2VLProcessor"}})


def load_processor(model_dir):
    """AutoTokenizer + Qwen2VLImageProcessorPil in a Qwen2VLProcessor subclass without video."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor

    tokenizer, image_processor, template, _ = image_processor_and_template(
        model_dir, Qwen2VLProcessor, Qwen2VLImageProcessorPil)
    processor = image_only_class(Qwen2VLProcessor)(image_processor, tokenizer, chat_template=template)
    return check_processor(processor, Qwen2VLProcessor)
