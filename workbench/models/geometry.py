"""Patch geometry: where each vision token of a prompt sits in its image (client side only: it
reads the processor's outputs and settings; never shipped to a server).

A family declares its layout in its architecture module (`Architecture.geometry`, a
`PatchGeometry`): the name of a layout below, or of a function `layout(ctx)` in the family's
client module (`tiny_<family>.py`), or `no_positions(reason)`. A layout returns, for each vision
token of the prompt in order, a `Place`: the tile (crop, global image or thumbnail, numbered in the
order the processor makes them), the row and column in that tile's token grid, and the pixel box
`(x0, y0, x1, y1)` it covers in the original image (continuous coordinates, x1/y1 exclusive; a
merged token covers every patch merged into it). A token with no patch of its own (LLaVA-NeXT's
`image_newline`) or wholly over a processor's padding (`padded_square_grid`) is `NO_PLACE`: -1 in
every label.

The store keeps them as the token labels `image`, `tile`, `patch_row`, `patch_col` (int32) and
`box_x0`, `box_y0`, `box_x1`, `box_y1` (float32); every other token holds -1 in each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from .architectures.base import Architecture

GEOMETRY_INTS = ("image", "tile", "patch_row", "patch_col")
GEOMETRY_BOXES = ("box_x0", "box_y0", "box_x1", "box_y1")
GEOMETRY_LABELS = GEOMETRY_INTS + GEOMETRY_BOXES
NONE = -1  # the value every geometry label holds on a token without a place in an image


class GeometryUnavailable(Exception):
    """This prompt's geometry cannot be derived (a processor setting no layout knows): stored as none."""


class Place(NamedTuple):
    tile: int
    row: int
    col: int
    x0: float
    y0: float
    x1: float
    y1: float


NO_PLACE = Place(NONE, NONE, NONE, NONE, NONE, NONE, NONE)


@dataclass(frozen=True)
class GeometryContext:
    """What a layout reads: the image's (width, height) as given, the processor's outputs (numpy),
    each token's string and modality, the processor and the model's config."""

    image_size: tuple[int, int]
    encoding: dict[str, np.ndarray]
    tokens: list[str]
    modality: np.ndarray
    processor: Any
    config: Any

    @property
    def n_vision(self) -> int:
        return int((self.modality == "vision").sum())

    @property
    def image_processor(self) -> Any:
        return getattr(self.processor, "image_processor", self.processor)


Layout = Callable[[GeometryContext], list[Place]]


def grid(tile: int, rect: tuple[float, float, float, float], rows: int, cols: int,
         bounds: tuple[float, float] | None = None) -> list[Place]:
    """A tile's `rows` x `cols` token grid laid row-major over `rect` (original-image pixels),
    each box clipped to the image (`bounds`: width, height) where the rect holds padding."""
    x0, y0, x1, y1 = rect
    w, h = (x1 - x0) / cols, (y1 - y0) / rows
    places = []
    for r in range(rows):
        for c in range(cols):
            box = [x0 + c * w, y0 + r * h, x0 + (c + 1) * w, y0 + (r + 1) * h]
            if bounds is not None:
                box = [min(max(v, 0.0), bounds[i % 2]) for i, v in enumerate(box)]
            places.append(Place(tile, r, c, *box))
    return places


def _square(n: int, what: str) -> int:
    side = math.isqrt(n)
    if side * side != n:
        raise GeometryUnavailable(f"{what}: {n} tokens are not a square grid")
    return side


# ------------------------------------------------------------------------------------------ layouts
def square_grid(ctx: GeometryContext) -> list[Place]:
    """One image resized to a square, a k x k grid over all of it (PaliGemma; Gemma-3, whose
    `avg_pool` pools the patch grid to k x k). Gemma-3's pan-and-scan crops are not laid out."""
    if getattr(ctx.image_processor, "do_pan_and_scan", False):
        raise GeometryUnavailable("pan-and-scan crops have no layout")
    w, h = ctx.image_size
    side = _square(ctx.n_vision, "square grid")
    return grid(0, (0, 0, w, h), side, side)


def center_crop_grid(ctx: GeometryContext) -> list[Place]:
    """CLIP's preprocessing (LLaVA): the shortest edge resized to `size`, a centred crop of
    `crop_size`; the k x k patch grid covers the crop (transformers 5.2 image_transforms.py,
    `get_resize_output_image_size`, `center_crop`)."""
    ip, (w, h) = ctx.image_processor, ctx.image_size
    side = _square(ctx.n_vision, "centre crop")
    size = dict(ip.size)
    if "shortest_edge" in size and size["shortest_edge"]:
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = size["shortest_edge"], int(size["shortest_edge"] * long / short)
        new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    else:
        new_w, new_h = size["width"], size["height"]
    rect = (0.0, 0.0, float(new_w), float(new_h))
    if getattr(ip, "do_center_crop", False):
        cw, ch = ip.crop_size["width"], ip.crop_size["height"]
        top, left = (new_h - ch) // 2, (new_w - cw) // 2
        rect = (left, top, left + cw, top + ch)
    sx, sy = w / new_w, h / new_h
    return grid(0, (rect[0] * sx, rect[1] * sy, rect[2] * sx, rect[3] * sy), side, side)


def padded_square_grid(ctx: GeometryContext) -> list[Place]:
    """DeepSeek-VL / Janus: the longest side resized to `size` (the other `round`ed, at least
    `min_size`), the image centred on a square of the background colour, a k x k grid over the
    square (transformers 5.25 models/janus/image_processing_pil_janus.py `resize`,
    `pad_to_square`). A token partly over the padding has its box clipped to the image; a token
    wholly over it covers no pixel of the image and is NO_PLACE."""
    ip, (w, h) = ctx.image_processor, ctx.image_size
    canvas_h, canvas_w = (int(v) for v in ctx.encoding["pixel_values"].shape[-2:])
    new_w, new_h = w, h
    if getattr(ip, "do_resize", True):
        target = int(ip.size["height"])
        min_size = int(getattr(ip, "min_size", 0) or 0)
        new_h, new_w = max(round(h * target / max(w, h)), min_size), max(round(w * target / max(w, h)), min_size)
    if new_w > canvas_w or new_h > canvas_h:
        raise GeometryUnavailable(f"a {new_w} x {new_h} resize does not fit the {canvas_w} x {canvas_h} pixel values")
    left, top = (canvas_w - new_w) // 2, (canvas_h - new_h) // 2
    side = _square(ctx.n_vision, "padded square")
    sx, sy = w / new_w, h / new_h
    rect = (-left * sx, -top * sy, (canvas_w - left) * sx, (canvas_h - top) * sy)
    return [p if p.x0 < p.x1 and p.y0 < p.y1 else NO_PLACE for p in grid(0, rect, side, side, (float(w), float(h)))]


def merged_grid(ctx: GeometryContext) -> list[Place]:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V: the whole image resized to a multiple of
    patch x merge (`smart_resize`), its (h, w) patch grid in `image_grid_thw`, each token a
    merge x merge block of patches, row-major."""
    _, gh, gw = (int(v) for v in ctx.encoding["image_grid_thw"][0])
    merge = int(ctx.image_processor.merge_size)
    w, h = ctx.image_size
    return grid(0, (0, 0, w, h), gh // merge, gw // merge)


def split_tiles_global(ctx: GeometryContext) -> list[Place]:
    """Idefics3 / SmolVLM: the image resized to rows x cols crops of `max_image_size` (the tokens
    `<row_i_col_j>` name them), then the whole image as one more (`<global-img>`, last); each
    crop's patch grid pixel-shuffled to a k x k token grid."""
    w, h = ctx.image_size
    crops = [tuple(int(v) for v in m.groups()) for t in ctx.tokens if (m := re.fullmatch(r"<row_(\d+)_col_(\d+)>", t))]
    rows, cols = (max(r for r, _ in crops), max(c for _, c in crops)) if crops else (0, 0)
    side = _square(ctx.n_vision // (len(crops) + 1), "pixel-shuffled tile")
    places: list[Place] = []
    for tile, (r, c) in enumerate(crops):
        rect = ((c - 1) * w / cols, (r - 1) * h / rows, c * w / cols, r * h / rows)
        places += grid(tile, rect, side, side)
    return places + grid(len(crops), (0, 0, w, h), side, side)


def dynamic_tiles(ctx: GeometryContext) -> list[Place]:
    """InternVL / Aya Vision (GotOcr2's `crop_to_patches`): the image resized to cols x rows tiles
    of `size`, the grid picked by `get_optimal_tiled_canvas`, tiles row-major, then a thumbnail
    of the whole image where there are several; each tile's patches pixel-shuffled to k x k."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

    ip, (w, h) = ctx.image_processor, ctx.image_size
    n_tiles = int(ctx.encoding["pixel_values"].shape[0])
    cols, rows = (1, 1)
    if getattr(ip, "crop_to_patches", False):
        cols, rows = get_optimal_tiled_canvas((h, w), (ip.size["height"], ip.size["width"]), ip.min_patches, ip.max_patches)
    if n_tiles not in (rows * cols, rows * cols + 1):
        raise GeometryUnavailable(f"{n_tiles} tiles for a {rows} x {cols} grid")
    side = _square(ctx.n_vision // n_tiles, "pixel-shuffled tile")
    if n_tiles == 1:  # one tile: the whole image
        return grid(0, (0, 0, w, h), side, side)
    places: list[Place] = []
    for tile in range(rows * cols):
        r, c = divmod(tile, cols)
        places += grid(tile, (c * w / cols, r * h / rows, (c + 1) * w / cols, (r + 1) * h / rows), side, side)
    thumbnail = grid(rows * cols, (0, 0, w, h), side, side) if n_tiles == rows * cols + 1 else []
    return places + thumbnail


def native_rows(ctx: GeometryContext) -> list[Place]:
    """Pixtral / Mistral3: the image at native resolution (resized to fit, a multiple of the
    patch; `image_sizes`), one row of tokens per row of (merged) patches, rows ended by
    `[IMG_BREAK]`; Mistral3's patch merger makes each token a spatial_merge_size^2 block."""
    w, h = ctx.image_size
    resized_h, resized_w = (int(v) for v in ctx.encoding["image_sizes"][0])
    patch = ctx.image_processor.patch_size
    patch = int(patch["height"] if isinstance(patch, dict) else patch)
    cell = patch * int(getattr(ctx.config, "spatial_merge_size", 1) or 1)
    vision = np.flatnonzero(ctx.modality == "vision")
    breaks = sum(1 for i in range(vision[0], vision[-1]) if ctx.tokens[i] == "[IMG_BREAK]")
    rows = breaks + 1
    cols = ctx.n_vision // rows
    sx, sy = w / resized_w, h / resized_h
    return grid(0, (0, 0, cols * cell * sx, rows * cell * sy), rows, cols)


def anyres(ctx: GeometryContext) -> list[Place]:
    """LLaVA-NeXT / LLaVA-OneVision (AnyRes): the whole image resized to one tile first (tile 0),
    then the image resized to the best grid resolution keeping its aspect, padded to it and cut
    into tiles (1...); the model lays the tiles' patches out as one grid, drops the padding's rows
    or columns (`unpad_image`), OneVision shrinks a grid over `anyres_max_N` tiles (bilinear), and
    ends each row with `image_newline` (NO_PLACE). transformers 5.2: image_processing_utils.py
    `select_best_resolution`, `get_patch_output_size`; modeling_llava_next.py `pack_image_features`."""
    from transformers.image_processing_utils import select_best_resolution

    ip, config, (w, h) = ctx.image_processor, ctx.config, ctx.image_size
    g = int(config.vision_config.image_size) // int(config.vision_config.patch_size)
    places = grid(0, (0, 0, w, h), g, g)
    if int(ctx.encoding["pixel_values"].shape[1]) == 1:
        return places + [NO_PLACE]
    crop = getattr(ip, "crop_size", None)
    size = dict(ip.size)
    tile = int(crop["height"] if crop and crop.get("height") else size.get("height") or size["shortest_edge"])
    best_h, best_w = select_best_resolution((h, w), config.image_grid_pinpoints)
    scale_w, scale_h = best_w / w, best_h / h
    if scale_w < scale_h:
        new_w, new_h = best_w, min(math.ceil(h * scale_w), best_h)
    else:
        new_w, new_h = min(math.ceil(w * scale_h), best_w), best_h
    left, top = (best_w - new_w) // 2, (best_h - new_h) // 2
    n_cols, n_rows = best_w // tile, best_h // tile
    gh, gw = n_rows * g, n_cols * g
    # unpad_image, on the token grid
    r0, r1, c0, c1 = 0, gh, 0, gw
    if w / h > gw / gh:
        pad = (gh - int(round(h * gw / w, 7))) // 2
        r0, r1 = pad, gh - pad
    else:
        pad = (gw - int(round(w * gh / h, 7))) // 2
        c0, c1 = pad, gw - pad
    px = tile / g  # canvas pixels per token
    sx, sy = w / new_w, h / new_h
    bounds = (float(w), float(h))

    def rect(a: float, b: float, c: float, d: float) -> tuple[float, float, float, float]:
        return ((c * px - left) * sx, (a * px - top) * sy, (d * px - left) * sx, (b * px - top) * sy)

    aspect = str(getattr(config, "vision_aspect_ratio", "") or "")
    max_tiles = int(aspect.removeprefix("anyres_max_")) if aspect.startswith("anyres_max_") else None
    ratio = math.sqrt((r1 - r0) * (c1 - c0) / (max_tiles * g * g)) if max_tiles else 0.0
    if ratio > 1.1:  # OneVision's bilinear shrink: one grid over the kept region, tile 1
        rows, cols = int((r1 - r0) // ratio), int((c1 - c0) // ratio)
        shrunk = grid(1, rect(r0, r1, c0, c1), rows, cols, bounds)
        return places + [p for r in range(rows) for p in (*shrunk[r * cols:(r + 1) * cols], NO_PLACE)]
    for r in range(r0, r1):
        for c in range(c0, c1):
            box = [min(max(v, 0.0), bounds[i % 2]) for i, v in enumerate(rect(r, r + 1, c, c + 1))]
            places.append(Place(1 + (r // g) * n_cols + c // g, r % g, c % g, *box))
        places.append(NO_PLACE)
    return places


LAYOUTS: dict[str, Layout] = {f.__name__: f for f in (square_grid, padded_square_grid, center_crop_grid, merged_grid,
                                                       split_tiles_global, dynamic_tiles, native_rows, anyres)}


def layout_for(arch: Architecture) -> Layout | None:
    """The family's layout function (None: it declares no positions); a name not among LAYOUTS
    is looked up in the family's client module."""
    declared = arch.geometry
    if declared is None or declared.layout is None:
        return None
    if declared.layout in LAYOUTS:
        return LAYOUTS[declared.layout]
    import importlib

    module = importlib.import_module(f"{__package__}.architectures.{arch.client}")
    return getattr(module, declared.layout)


def token_geometry(arch: Architecture, ctx: GeometryContext) -> dict[str, np.ndarray] | None:
    """The geometry labels of every token of one prompt (one image: image 0), or None where the
    family keeps no positions. Raises GeometryUnavailable where the layout cannot place them."""
    layout = layout_for(arch)
    if layout is None or arch.geometry is None:
        return None
    n = len(ctx.modality)
    ints = np.full((n, len(GEOMETRY_INTS)), NONE, dtype=np.int32)
    boxes = np.full((n, len(GEOMETRY_BOXES)), NONE, dtype=np.float32)
    vision = np.flatnonzero(ctx.modality == "vision")
    if len(vision):
        places = layout(ctx)
        if len(places) != len(vision):
            raise GeometryUnavailable(f"layout {arch.geometry.layout} placed {len(places)} tokens; the prompt has "
                                      f"{len(vision)} vision tokens")
        table = np.array(places, dtype=np.float64).reshape(len(places), 7)
        ints[vision, 0] = 0
        ints[vision, 1:] = table[:, :3].astype(np.int32)
        boxes[vision] = table[:, 3:].astype(np.float32)
        unplaced = vision[table[:, 0] < 0]  # NO_PLACE: -1 in all eight, `image` included
        ints[unplaced, 0] = NONE
        boxes[unplaced] = NONE
    return {**{name: ints[:, i] for i, name in enumerate(GEOMETRY_INTS)},
            **{name: boxes[:, i] for i, name in enumerate(GEOMETRY_BOXES)}}
