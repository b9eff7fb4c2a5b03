"""Client side of the Mistral 3 family: its tiny offline model and its processor (transformers;
never shipped to a server).

transformers' PixtralProcessor needs torchvision (it imports the torchvision image processor at
module level, transformers 5.25.0 models/pixtral/processing_pixtral.py), which must not be
installed beside this torch: `PixtralImageOnlyProcessor` below is its image-token expansion on a
plain ProcessorMixin, with the PIL image processor."""

from __future__ import annotations

from pathlib import Path

from ..tinykit import _byte_level_tokenizer, _ids, _init_model, _save, _VOCAB_SIZE, saved_processor

# Mistral-Small-3.1's template, reduced (no system prompt, no tools): "<s>[INST][IMG]{text}[/INST]";
# the template writes <s>, as the real one does.
MISTRAL3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST]' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '[IMG]' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{{- message['content'][0]['text'] }}{%- endif %}{{- eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)
MISTRAL3_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]"]

PATCH, MERGE = 8, 2
LONGEST_EDGE = 96  # a 96x64 image: 12x8 patches, 6x4 image tokens after the merge (real: 1540 px, 14 px patches)


def pixtral_processor_class():
    """PixtralProcessor's expansion without torchvision: each image becomes rows of `[IMG]`, one
    per merged patch, each row ended by `[IMG_BREAK]` and the last by `[IMG_END]` (as
    transformers 5.25.0 models/pixtral/processing_pixtral.py `replace_image_token`)."""
    from transformers import ProcessorMixin

    class PixtralImageOnlyProcessor(ProcessorMixin):
        def __init__(self, image_processor, tokenizer, patch_size: int = 16, spatial_merge_size: int = 1,
                     chat_template=None, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                     image_end_token="[IMG_END]", **kwargs):
            super().__init__(image_processor, tokenizer, chat_template=chat_template)
            self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
            self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token
            self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)

        def _process_images(self, images, **images_kwargs):
            # the image is resized to a multiple of the merged patch
            images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
            return super()._process_images(images, **images_kwargs)

        def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
            step = self.patch_size * self.spatial_merge_size
            height, width = (int(x) for x in image_inputs["image_sizes"][image_idx])
            rows = [self.image_token * (width // step) + self.image_break_token] * (height // step)
            return "".join(rows)[: -len(self.image_break_token)] + self.image_end_token

    return PixtralImageOnlyProcessor


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(MISTRAL3_SPECIAL_TOKENS, chat_template=MISTRAL3_CHAT_TEMPLATE,
                                      bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    bos, eos, image, pad = _ids(tokenizer, "<s>", "</s>", "[IMG]", "<pad>")
    image_processor = PixtralImageProcessorPil(size={"longest_edge": LONGEST_EDGE},
                                               patch_size={"height": PATCH, "width": PATCH})
    config = Mistral3Config(
        text_config=dict(
            model_type="mistral", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
            rms_norm_eps=1e-5, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            head_dim=16, image_size=LONGEST_EDGE, patch_size=PATCH,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        image_token_index=image, spatial_merge_size=MERGE, vision_feature_layer=-1, tie_word_embeddings=False,
    )
    model = _init_model(Mistral3ForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {
        "processor_class": "PixtralProcessor", "patch_size": PATCH, "spatial_merge_size": MERGE,
        "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}})


def load_processor(model_dir):
    """AutoTokenizer + PixtralImageProcessorPil in a PixtralImageOnlyProcessor; patch size, merge
    size and the image tokens from processor_config.json."""
    from transformers import PixtralImageProcessorPil

    PixtralProcessor = pixtral_processor_class()

    return saved_processor(model_dir, PixtralProcessor, PixtralImageProcessorPil,
                           ("patch_size", "spatial_merge_size", "image_token", "image_break_token", "image_end_token"))
