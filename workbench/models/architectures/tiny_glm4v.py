"""Client side of the Glm4v family: its tiny offline model and its image-only processor
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

# GLM-4.1V's template, reduced (no thinking, no tools): "[gMASK]<sop><|user|>\n<|begin_of_image|>
# <|image|><|end_of_image|>question<|assistant|>\n"
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<|begin_of_image|><|image|><|end_of_image|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)
GLM4V_SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>",
                        "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
                        "<|image|>", "<|video|>"]

PATCH, MERGE = 8, 2
_FACTOR = PATCH * MERGE


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration, Glm4vImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(GLM4V_SPECIAL_TOKENS, chat_template=GLM4V_CHAT_TEMPLATE,
                                      eos_token="<|user|>", pad_token="<|endoftext|>")
    eot, user, b_img, e_img, b_vid, e_vid, image, video = _ids(
        tokenizer, "<|endoftext|>", "<|user|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
        "<|end_of_video|>", "<|image|>", "<|video|>")
    # between 4 and 32 merged tokens per image (real: 112x112 px to 28*28*15000)
    # transformers 5.25 image_processing_pil_glm4v.py: the class takes Glm4vImageProcessorKwargs (its
    # valid_kwargs) through the base __init__, typed with the base ImagesKwargs
    image_processor = Glm4vImageProcessorPil(  # type: ignore[call-arg]
        patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE,
        size={"shortest_edge": 4 * _FACTOR**2, "longest_edge": 32 * _FACTOR**2})
    config = Glm4vConfig(
        text_config=dict(
            vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rms_norm_eps=1e-5,
            # head_dim 16, half of it rotated: mrope_section sums to 4 (real: [8, 12, 12] of 128 / 2)
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "mrope_section": [2, 1, 1]},
            pad_token_id=eot,
        ),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, image_size=4 * PATCH,
                           patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=64),
        image_token_id=image, video_token_id=video, image_start_token_id=b_img, image_end_token_id=e_img,
        video_start_token_id=b_vid, video_end_token_id=e_vid, tie_word_embeddings=False,
    )
    model = _init_model(Glm4vForConditionalGeneration, config, seed)
    model.generation_config.eos_token_id = [eot, user]
    model.generation_config.pad_token_id = eot
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {"processor_class": "Glm4vProcessor"}})


def load_processor(model_dir):
    """AutoTokenizer + Glm4vImageProcessorPil in a Glm4vProcessor subclass without video."""
    from transformers import Glm4vImageProcessorPil, Glm4vProcessor

    tokenizer, image_processor, template, _ = image_processor_and_template(
        model_dir, Glm4vProcessor, Glm4vImageProcessorPil)
    processor = image_only_class(Glm4vProcessor)(image_processor, tokenizer, chat_template=template)
    return check_processor(processor, Glm4vProcessor)
