"""What the trained tiny models' vision tower learns before it learns any answer: for each vision
token, what the built-in scene holds under it (a dense, per-token target, as a detection or
segmentation pre-training gives a real VLM's tower its objects).

Each vision token's pixel box (the workbench's patch geometry, `workbench.models.geometry`) is laid
over the scene's object mask (`workbench.data.object_mask`). The token's targets are:

- `color`, `kind`: the object covering most of its box (at least `COVER` of it, or the one whose
  centre lies in it), 0 for the background;
- `centre`: 1 where an object's centroid lies in the box (one token per object and view);
- `copies`: how many objects of that colour and kind the token's view shows (0 on the background);
- `x`, `y`: the box's centre, as a fraction of the view's width and height;
- one relation per colour c (`RELATIONS`): where the token's object is against the one object of
  colour c in the view, in the grid of cells: in its row to the left of it or to the right, in its
  column above it or below; 0 where there is no such object, or several, or they share neither row
  nor column (the scene graph a relation question reads).

A view is what one pass of the tower sees: the whole image (Qwen3-VL), or one of SmolVLM's crops
or its global image. A crop's tower cannot see past the crop's edges, so its tokens are given only
what the crop shows.

A linear `SceneHead` reads them from the vision tokens as the language model receives them (the
projector's output placed in the sequence), so the tower and the projector learn them together.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..data import COLORS, SHAPES, SceneObject, object_mask

COLOR_NAMES = tuple(sorted(COLORS))
MAX_COPIES = 4  # the built-in counting questions ask about 1 to 4 objects
COVER = 0.1  # the least fraction of a token's box an object must cover to be its object
RELATIONS = ("left", "right", "above", "below")  # 1..4 in a relation target; 0: none
FIELDS = ("color", "kind", "centre", "copies", "x", "y", *(f"relation_{c}" for c in COLOR_NAMES))
# the head's output columns: class logits per categorical field, one logit for centre, x and y
_SPANS = {"color": (0, 1 + len(COLOR_NAMES)), "kind": (7, 7 + 1 + len(SHAPES)), "centre": (11, 12),
          "copies": (12, 13 + MAX_COPIES), "xy": (17, 19), "relations": (19, 19 + len(COLOR_NAMES) * 5)}
HEAD_OUTPUTS = 19 + len(COLOR_NAMES) * 5
NO_PLACE = -1.0  # every target of a token without a place in the image (it is left out of the loss)


def token_targets(size: tuple[int, int], objects: list[SceneObject], boxes: np.ndarray,
                  views: np.ndarray | None = None) -> np.ndarray:
    """(tokens, len(FIELDS)) float32 targets of vision tokens with pixel `boxes` (x0, y0, x1, y1;
    -1 for a token without a place) in an image of `size` (width, height) holding `objects`.

    `views` (the geometry's `tile` of each token; one view if None) says which tokens one pass of
    the tower sees together: a crop of the image (SmolVLM's tiles) cannot see past its edges, so
    its tokens' `x`, `y` are taken in the crop and `copies` and the relations count only the
    objects the crop shows (any of their pixels); the view of the whole image counts them all."""
    mask = object_mask(size, objects)
    views = np.zeros(len(boxes), dtype=np.int64) if views is None else np.asarray(views)
    centres = [(xs.mean() + 0.5, ys.mean() + 0.5) for ys, xs in
               (np.nonzero(mask == i) for i in range(1, len(objects) + 1))]
    out = np.full((len(boxes), len(FIELDS)), NO_PLACE, dtype=np.float32)
    placed = boxes[:, 0] >= 0
    for view in np.unique(views[placed]):
        rows = np.flatnonzero(placed & (views == view))
        out[rows] = _view_targets(mask, objects, centres, boxes[rows])
    return out


def _view_targets(mask: np.ndarray, objects: list[SceneObject], centres: list[tuple[float, float]],
                  boxes: np.ndarray) -> np.ndarray:
    """The targets of one view's tokens (all placed; `centres`: each object's centroid in pixels);
    the view is the rectangle their boxes span."""
    height, width = mask.shape
    left, top, right, bottom = boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()
    window = mask[max(int(np.floor(top)), 0):min(int(np.ceil(bottom)), height),
                  max(int(np.floor(left)), 0):min(int(np.ceil(right)), width)]
    shown = [objects[i - 1] for i in np.unique(window) if i]
    kinds = [(o.color, o.kind) for o in shown]
    out = np.zeros((len(boxes), len(FIELDS)), dtype=np.float32)
    for t, (x0, y0, x1, y1) in enumerate(boxes):
        covered = mask[max(int(np.floor(y0)), 0):min(int(np.ceil(y1)), height),
                       max(int(np.floor(x0)), 0):min(int(np.ceil(x1)), width)]
        counts = np.bincount(covered.ravel(), minlength=len(objects) + 1)[1:]
        obj = int(counts.argmax()) + 1 if covered.size and counts.max() >= COVER * covered.size else 0
        inside = [i for i, (cx, cy) in enumerate(centres, 1) if x0 <= cx < x1 and y0 <= cy < y1]
        if inside:
            obj = inside[0]
        out[t, 2] = float(bool(inside))
        if obj:
            o = objects[obj - 1]
            out[t, 0] = COLOR_NAMES.index(o.color) + 1
            out[t, 1] = SHAPES.index(o.kind) + 1
            out[t, 3] = kinds.count((o.color, o.kind))
            out[t, 6:] = _relations(o, shown)
        out[t, 4] = ((x0 + x1) / 2 - left) / (right - left)
        out[t, 5] = ((y0 + y1) / 2 - top) / (bottom - top)
    return out


def _relations(obj: SceneObject, objects: list[SceneObject]) -> list[int]:
    """`obj`'s relation (1 + its index in RELATIONS, 0 none) to the one object of each colour."""
    colours = [o.color for o in objects]
    (col, row), out = obj.cell, []
    for colour in COLOR_NAMES:
        if colour == obj.color or colours.count(colour) != 1:
            out.append(0)
            continue
        other_col, other_row = objects[colours.index(colour)].cell
        if row == other_row:
            out.append(1 if col < other_col else 2)
        elif col == other_col:
            out.append(3 if row < other_row else 4)
        else:
            out.append(0)
    return out


def vision_boxes(geometry: dict[str, np.ndarray], modality: np.ndarray) -> np.ndarray:
    """The (vision tokens, 4) pixel boxes of one encoded prompt, in sequence order."""
    vision = modality == "vision"
    return np.stack([geometry[k][vision] for k in ("box_x0", "box_y0", "box_x1", "box_y1")], axis=1)


def vision_views(geometry: dict[str, np.ndarray], modality: np.ndarray) -> np.ndarray:
    """The view (the geometry's `tile`) of each vision token of one encoded prompt, in sequence order."""
    return np.asarray(geometry["tile"][modality == "vision"])


class SceneHead(torch.nn.Module):
    """A linear read-out of `token_targets` from vision-token embeddings."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, HEAD_OUTPUTS)

    def loss(self, vision: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The summed losses of every field over the tokens with a place (cross-entropy for the
        classes, logistic for centre, 10 x squared error for x and y: their variance is ~1/12)."""
        placed = targets[:, 0] >= 0
        logits, targets = self.linear(vision[placed]), targets[placed]
        f = torch.nn.functional

        def span(name: str) -> torch.Tensor:
            a, b = _SPANS[name]
            return logits[:, a:b]

        return (f.cross_entropy(span("color"), targets[:, 0].long())
                + f.cross_entropy(span("kind"), targets[:, 1].long())
                + f.binary_cross_entropy_with_logits(span("centre")[:, 0], targets[:, 2])
                + f.cross_entropy(span("copies"), targets[:, 3].long())
                + 10 * f.mse_loss(span("xy"), targets[:, 4:6])
                + len(COLOR_NAMES) * f.cross_entropy(span("relations").reshape(-1, 5), targets[:, 6:].reshape(-1).long()))


class StopAtLanguageModel(Exception):
    """Raised by `LanguageModelInputs` in a forward that needs nothing past the LLM's input."""


class LanguageModelInputs:
    """Holds the embeddings the language model last received (a forward pre-hook), from which the
    vision tokens' rows are read: the projector's output as the sequence carries it. With `stop`
    set the forward ends there (`StopAtLanguageModel`): the tower stage trains nothing the language
    model computes, so it skips its forward."""

    def __init__(self, model: Any):
        inner = model.model
        language_model = getattr(inner, "language_model", None) or inner.text_model
        self.embeds: torch.Tensor | None = None
        self.stop = False
        self.handle = language_model.register_forward_pre_hook(self._grab, with_kwargs=True)

    def _grab(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.embeds = kwargs["inputs_embeds"]
        if self.stop:
            raise StopAtLanguageModel

    def vision(self, input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
        assert self.embeds is not None, "no forward has run"
        return self.embeds[input_ids == image_token_id]

    def remove(self) -> None:
        self.handle.remove()
