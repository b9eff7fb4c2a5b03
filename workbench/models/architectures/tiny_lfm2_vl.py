"""Client side of the LFM2-VL family: its tiny offline model and its processor (transformers;
never shipped to a server).

transformers 5.25 ships LFM2-VL's image processor for torchvision only
(models/lfm2_vl/image_processing_lfm2_vl.py), which must not be installed beside this torch. So
the processor here is `Lfm2VlProcessor` with `Lfm2VlImageProcessorPil`: the same single-image
path in PIL and numpy (smart resize to multiples of patch x downsample, rescale, normalize, patches
of (row, column, channel)), each image's patches padded only to the longest image of the call (the
model masks pads, so a lone image is unpadded). Images that the torchvision processor would split
into tiles (larger than `max_image_tokens` allows, with splitting on) are refused with the reason.

`layout` is the family's patch geometry (`Architecture.geometry`, workbench/models/geometry.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..geometry import GeometryContext, GeometryUnavailable, Place, grid
from ..tinykit import _VOCAB_SIZE, _byte_level_tokenizer, _ids, _init_model, _save, check_processor, load_tokenizer

# LFM2-VL's template, reduced (no system prompt, no tools)
LFM2_VL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LFM2_VL_SPECIAL_TOKENS = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>",
                          "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]

PATCH, DOWNSAMPLE = 8, 2
# layer kinds of the tiny decoder: an attention layer between two short convolutions (real
# LFM2-VL-1.6B: 16 layers, attention at 2, 5, 8, 10, 12, 14)
LAYER_TYPES = ["conv", "full_attention", "conv"]


def _image_processor_class() -> Any:
    from transformers import BatchFeature
    from transformers.image_processing_utils import BaseImageProcessor
    from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    from transformers.processing_utils import ImagesKwargs

    class Lfm2VlImageKwargs(ImagesKwargs, total=False):
        downsample_factor: int
        do_image_splitting: bool
        min_tiles: int
        max_tiles: int
        use_thumbnail: bool
        min_image_tokens: int
        max_image_tokens: int
        encoder_patch_size: int
        tile_size: int
        max_pixels_tolerance: float
        return_row_col_info: bool

    class Lfm2VlImageProcessorPil(BaseImageProcessor):
        """LFM2-VL's single-image preprocessing in PIL and numpy (see the module docstring)."""

        model_input_names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]
        valid_kwargs = Lfm2VlImageKwargs
        downsample_factor, do_image_splitting, min_tiles, max_tiles, use_thumbnail = 2, True, 2, 10, True
        min_image_tokens, max_image_tokens, encoder_patch_size, tile_size, max_pixels_tolerance = 64, 256, 16, 512, 2.0
        rescale_factor, image_mean, image_std = 1 / 255, IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        return_row_col_info = False

        def __init__(self, **kwargs: Any):
            super().__init__(**kwargs)
            for name in Lfm2VlImageKwargs.__annotations__:
                if name in kwargs:
                    setattr(self, name, kwargs[name])

        def to_dict(self) -> dict[str, Any]:
            out = super().to_dict()
            out.update({k: getattr(self, k) for k in Lfm2VlImageKwargs.__annotations__ if hasattr(self, k)})
            out.update(image_mean=list(self.image_mean), image_std=list(self.image_std))
            return out

        def _size(self, height: int, width: int) -> tuple[int, int]:
            """(height, width) after the smart resize (transformers 5.25 Lfm2VlImageProcessor.smart_resize)."""
            factor = self.encoder_patch_size * self.downsample_factor
            low = self.min_image_tokens * self.encoder_patch_size ** 2 * self.downsample_factor ** 2
            high = self.max_image_tokens * self.encoder_patch_size ** 2 * self.downsample_factor ** 2
            h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
            if self.do_image_splitting and h * w > high * self.max_pixels_tolerance:
                raise ValueError(f"an image of {width}x{height} px would be split into tiles, which LFM2-VL's image "
                                 "processor does with torchvision only (not installed beside this torch); expected a "
                                 f"smaller image (at most {high} px after resizing) or do_image_splitting: false")
            if h * w > high:
                beta = math.sqrt(height * width / high)
                h = max(factor, math.floor(height / beta / factor) * factor)
                w = max(factor, math.floor(width / beta / factor) * factor)
            elif h * w < low:
                beta = math.sqrt(low / (height * width))
                h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
            return h, w

        def preprocess(self, images: Any, return_tensors: Any = None, return_row_col_info: bool | None = None,
                       **kwargs: Any) -> Any:
            from PIL import Image

            flat = [im for group in (images if isinstance(images, (list, tuple)) else [images])
                    for im in (group if isinstance(group, (list, tuple)) else [group])]
            p = self.encoder_patch_size
            patches, shapes, sizes = [], [], []
            for image in flat:
                h, w = self._size(image.height, image.width)
                pixels = np.asarray(image.convert("RGB").resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)
                pixels = (pixels * self.rescale_factor - np.asarray(self.image_mean)) / np.asarray(self.image_std)
                grid = pixels.reshape(h // p, p, w // p, p, 3).transpose(0, 2, 1, 3, 4)   # (row, col, py, px, c)
                patches.append(grid.reshape((h // p) * (w // p), p * p * 3))
                shapes.append([h // p, w // p])
                sizes.append([h, w])
            longest = max(len(x) for x in patches)
            values = np.zeros((len(patches), longest, p * p * 3), dtype=np.float32)
            mask = np.zeros((len(patches), longest), dtype=np.int32)
            for i, x in enumerate(patches):
                values[i, :len(x)], mask[i, :len(x)] = x, 1
            data: dict[str, Any] = {"pixel_values": values, "pixel_attention_mask": mask,
                                    "spatial_shapes": np.asarray(shapes, dtype=np.int64)}
            if self.return_row_col_info if return_row_col_info is None else return_row_col_info:
                data.update(image_rows=[1] * len(flat), image_cols=[1] * len(flat), image_sizes=sizes)
            return BatchFeature(data=data, tensor_type=return_tensors)

    return Lfm2VlImageProcessorPil


def layout(ctx: GeometryContext) -> list[Place]:
    """LFM2-VL's patch geometry. One tile: the whole image smart-resized to a multiple of
    patch x downsample (not square, sides rounded), its (h, w) patch grid in `spatial_shapes`, each
    token a downsample x downsample block of patches, row-major (transformers 5.25
    models/lfm2_vl/modeling_lfm2_vl.py `get_image_features`). Tiled, as the torchvision processor
    makes it (image_processing_lfm2_vl.py `crop_image_to_patches`; processing_lfm2_vl.py): the
    image resized to rows x cols tiles of `tile_size`, each after its `<|img_row_R_col_C|>`,
    row-major, then the whole image as a thumbnail (`<|img_thumbnail|>`, last). The processor
    here refuses images it would tile, so only the one-tile path is reached with it."""
    w, h = ctx.image_size
    factor = int(ctx.image_processor.downsample_factor)
    shapes = [(int(r) // factor, int(c) // factor) for r, c in np.asarray(ctx.encoding["spatial_shapes"]).reshape(-1, 2)]
    tiles = [tuple(int(v) for v in m.groups()) for t in ctx.tokens
             if (m := re.fullmatch(r"<\|img_row_(\d+)_col_(\d+)\|>", t))]
    rows, cols = (max(r for r, _ in tiles), max(c for _, c in tiles)) if tiles else (1, 1)
    rects = [((c - 1) * w / cols, (r - 1) * h / rows, c * w / cols, r * h / rows) for r, c in tiles]
    if len(shapes) == len(rects) + 1:  # the thumbnail (or the one untiled image)
        rects.append((0.0, 0.0, float(w), float(h)))
    if len(shapes) != len(rects):
        raise GeometryUnavailable(f"{len(shapes)} spatial shapes for {len(tiles)} tiles")
    places: list[Place] = []
    for tile, ((gh, gw), rect) in enumerate(zip(shapes, rects)):
        places += grid(tile, rect, gh, gw)
    return places


def build_tiny(out_dir: Path, seed: int) -> None:
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(LFM2_VL_SPECIAL_TOKENS, chat_template=LFM2_VL_CHAT_TEMPLATE,
                                      bos_token="<|startoftext|>", eos_token="<|im_end|>", pad_token="<|pad|>",
                                      extra_special_tokens={"image_token": "<image>"})
    pad, bos, eos, image = _ids(tokenizer, "<|pad|>", "<|startoftext|>", "<|im_end|>", "<image>")
    # 4 to 16 image tokens (real: 64 to 256, tiles of 512 px beyond)
    image_processor = _image_processor_class()(encoder_patch_size=PATCH, downsample_factor=DOWNSAMPLE,
                                               min_image_tokens=4, max_image_tokens=16, do_image_splitting=False)
    config = Lfm2VlConfig(
        text_config=dict(
            model_type="lfm2", vocab_size=_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
            num_hidden_layers=len(LAYER_TYPES), num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=8192, layer_types=LAYER_TYPES, conv_L_cache=3, block_auto_adjust_ff_dim=False,
            bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, patch_size=PATCH, num_patches=16, vision_use_head=False,
        ),
        image_token_id=image, downsample_factor=DOWNSAMPLE, projector_hidden_size=64, tie_word_embeddings=False,
    )
    model = _init_model(Lfm2VlForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": {"processor_class": "Lfm2VlProcessor"}})


def load_processor(model_dir: Any) -> Any:
    """AutoTokenizer + Lfm2VlImageProcessorPil (its settings from preprocessor_config.json) in an
    Lfm2VlProcessor."""
    from transformers import Lfm2VlProcessor

    model_dir = str(model_dir)
    tokenizer = load_tokenizer(model_dir)
    cls = _image_processor_class()
    settings, _ = cls.get_image_processor_dict(model_dir)
    image_processor = cls(**{k: v for k, v in settings.items() if k in cls.valid_kwargs.__annotations__
                             or k in ("image_mean", "image_std", "rescale_factor")})
    processor_dict, _ = Lfm2VlProcessor.get_processor_dict(model_dir)
    template = processor_dict.get("chat_template") or tokenizer.chat_template
    if template is None:
        raise ValueError(f"{model_dir}: no chat template (chat_template.json/.jinja, processor or tokenizer config)")
    processor = Lfm2VlProcessor(image_processor, tokenizer, chat_template=template)
    return check_processor(processor, Lfm2VlProcessor)
