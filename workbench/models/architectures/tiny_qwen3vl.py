"""Client side of the Qwen3-VL family: its tiny offline model and its image-only processor
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

# Qwen3-VL's template, reduced to what the workbench uses (no tools, no reasoning blocks). Like the
# real one it adds no default system prompt.
QWEN3VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Same order as the real Qwen vocab (151643...), so relative layout matches.
QWEN3VL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

QWEN_PATCH = 8
QWEN_MERGE = 2
_QWEN_FACTOR = QWEN_PATCH * QWEN_MERGE  # images are resized to multiples of 16 px; 1 merged token each


def build_tiny_qwen3vl(out_dir: Path, seed: int) -> None:
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        QWEN3VL_SPECIAL_TOKENS,
        chat_template=QWEN3VL_CHAT_TEMPLATE,
        # Roles as in Qwen3-VL's tokenizer_config: no BOS, eos <|im_end|>, pad <|endoftext|>.
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    eot, eos, v_start, v_end, image, video = _ids(
        tokenizer,
        "<|endoftext|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    )

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=QWEN_PATCH,
        temporal_patch_size=2,
        merge_size=QWEN_MERGE,
        # Between 4 and 32 merged tokens per image (a 96x64 image gives 6x4 = 24).
        min_pixels=4 * _QWEN_FACTOR**2,
        max_pixels=32 * _QWEN_FACTOR**2,
        image_mean=[0.5, 0.5, 0.5],  # Qwen3-VL's normalisation
        image_std=[0.5, 0.5, 0.5],
    )
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=_VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            # mrope_section sums to head_dim/2 = 8. The interleaved layout gives H and W every third
            # frequency from offsets 1 and 2 up to 3*section, so sections must satisfy
            # 3*max(h, w) <= 8: [4, 2, 2] (real: [24, 20, 20] of 64). transformers 5.x always
            # interleaves for Qwen3-VL; mrope_interleaved is recorded as in the real config.
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
            bos_token_id=eot,
            eos_token_id=eos,
            pad_token_id=eot,
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=QWEN_PATCH,  # must match the image processor
            spatial_merge_size=QWEN_MERGE,
            temporal_patch_size=2,
            out_hidden_size=64,  # must equal the text hidden size
            num_position_embeddings=64,  # a perfect square (8x8 grid, interpolated per image)
            # Vision blocks 0 and 1 feed DeepStack adds after decoder layers 0 and 1: fewer than the
            # 3 decoder layers, so the last decoder layer has no DeepStack add (as in the real model).
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=v_start,
        vision_end_token_id=v_end,
        tie_word_embeddings=True,  # tied lm_head, like Qwen3-VL-2B
    )
    model = _init_model(Qwen3VLForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = [eos, eot]
    model.generation_config.pad_token_id = eot
    processor_config = {"processor_class": "Qwen3VLProcessor"}
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": processor_config})




def load_processor(model_dir):
    """AutoTokenizer + Qwen2VLImageProcessorPil in a Qwen3VLProcessor subclass without video."""
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLProcessor

    tokenizer, image_processor, template, _ = image_processor_and_template(
        model_dir, Qwen3VLProcessor, Qwen2VLImageProcessorPil)
    processor = image_only_class(Qwen3VLProcessor)(image_processor, tokenizer, chat_template=template)
    return check_processor(processor, Qwen3VLProcessor)


build_tiny = build_tiny_qwen3vl
