"""Client side of the Qwen3-VL-MoE family: its tiny offline model (Qwen3-VL's tiny model with
sparse MoE decoder MLPs) and its image-only processor (transformers; never shipped to a server)."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _VOCAB_SIZE, _byte_level_tokenizer, _ids, _init_model, _save
from .tiny_qwen3vl import (
    _QWEN_FACTOR,
    QWEN3VL_CHAT_TEMPLATE,
    QWEN3VL_SPECIAL_TOKENS,
    QWEN_MERGE,
    QWEN_PATCH,
)
from .tiny_qwen3vl import load_processor as load_processor  # the same processor (Qwen3VLProcessor)

# 8 experts, 2 per token (real 30B-A3B: 128 experts, 8 per token), every decoder layer sparse
N_EXPERTS, TOP_K = 8, 2


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(QWEN3VL_SPECIAL_TOKENS, chat_template=QWEN3VL_CHAT_TEMPLATE,
                                      eos_token="<|im_end|>", pad_token="<|endoftext|>")
    eot, eos, v_start, v_end, image, video = _ids(
        tokenizer, "<|endoftext|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=QWEN_PATCH, temporal_patch_size=2, merge_size=QWEN_MERGE,
        min_pixels=4 * _QWEN_FACTOR**2, max_pixels=32 * _QWEN_FACTOR**2,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    config = Qwen3VLMoeConfig(
        text_config=dict(
            vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [4, 2, 2],
                             "mrope_interleaved": True},
            num_experts=N_EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=32, decoder_sparse_step=1,
            bos_token_id=eot, eos_token_id=eos, pad_token_id=eot, tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=QWEN_PATCH,
            spatial_merge_size=QWEN_MERGE, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=image, video_token_id=video, vision_start_token_id=v_start, vision_end_token_id=v_end,
        tie_word_embeddings=False,  # untied, as Qwen3-VL-30B-A3B
    )
    model = _init_model(Qwen3VLMoeForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = [eos, eot]
    model.generation_config.pad_token_id = eot
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {"processor_class": "Qwen3VLProcessor"}})
