"""Per-patch values over a sample's own image: which vision tokens a sample has, where each one
sits (the store's geometry labels, `workbench.models.geometry`), the sample's image regenerated
from the run's data source, and the values drawn over it.

Values, each for the vision tokens of one sample (definitions):
- token norm: ‖h_l(t)‖₂ of `hidden` at layer l, in the reference condition;
- prefill attention: (1/(L·H)) Σ_l Σ_h Σ_{q ∈ text} a_{l,h}(q, t), the attention vision key t
  receives from the prompt's text queries, summed over them and averaged over the stored decoder
  layers and heads (`prefill_text_attention`);
- decode attention: (1/(L·H)) Σ_l Σ_h a_{s,l,h}(t), the decode query's attention at step s on
  vision key t, averaged over the stored decoder layers and heads (`decode_attention`);
- a condition's effect at layer l: Δnorm(t) = ‖h_c(t)‖ − ‖h_ref(t)‖ and cos(h_c(t), h_ref(t)),
  token by token (the two conditions' prompts must be the same token sequence);
- the patching effect per patch: for a scan whose position groups are token indices (one vision
  token each, or several patched together), the sample's own normalized effect of the run that
  patched the group holding t, (m_run − m_base) / (m_donor − m_base) on the chosen metric
  (`analyses.patching.metric_values`), drawn on every box of the group.

Where tokens of several tiles cover one pixel (crops and a global image or thumbnail), the map
paints the crops, the finest view; a family of one tile paints that tile.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from PIL import Image

from workbench.names import GEOMETRY_LABELS

from .commands import DEFAULT_OVERLAY_SAMPLES
from .patching import scan_runs
from .plotting import colorbar
from .streaming import as_str

BOXES = GEOMETRY_LABELS[4:]


def geometry_reason(ds: xr.Dataset) -> str | None:
    """Why a model's store has no patch geometry to draw on, or None where it has."""
    if "tile" in ds.coords:
        return None
    from workbench.models.architectures import ARCHITECTURES

    family = str(ds.attrs.get("family") or "")
    arch = next((a for a in ARCHITECTURES if a.family == family), None)
    if arch is not None and not arch.is_multimodal:
        return f"{family} is a text model: it has no vision tokens"
    if arch is not None and arch.geometry is not None and arch.geometry.layout is None:
        return f"the family {family} keeps no positions: {arch.geometry.reason}"
    return "the store holds no patch geometry (it was written before vision tokens were placed on the image)"


def chosen_samples(ds: xr.Dataset, condition: str, named: Sequence[str]) -> list[str]:
    """The samples to draw: those named that the condition holds, else its first few."""
    held = list(dict.fromkeys(as_str(ds["run_sample"].values[as_str(ds["run_condition"].values) == condition])))
    return [s for s in named if s in held] if named else held[:DEFAULT_OVERLAY_SAMPLES]


def token_rows(ds: xr.Dataset, condition: str, sample: str) -> np.ndarray:
    """Row indices (token dim) of one sample's prompt in one condition, in position order."""
    rows = np.flatnonzero((as_str(ds["condition"].values) == condition) & (as_str(ds["sample"].values) == sample))
    return rows[np.argsort(np.asarray(ds["position"].values)[rows], kind="stable")]


@dataclass
class Patches:
    """One sample's vision tokens that a map paints: their rows (token dim), boxes (x0, y0, x1, y1)
    in the original image, and the image's size (the regenerated image's, else the boxes' extent)."""

    rows: np.ndarray
    boxes: np.ndarray
    size: tuple[int, int]
    view: str


def patches(ds: xr.Dataset, rows: np.ndarray, image: Image.Image | None) -> Patches | None:
    """The vision tokens of `rows` to paint (the crops where a global view covers them too)."""
    tile = np.asarray(ds["tile"].values)[rows]
    placed = rows[tile >= 0]
    if not len(placed):
        return None
    boxes = np.stack([np.asarray(ds[name].values)[placed] for name in BOXES], axis=1).astype(float)
    tiles = np.asarray(ds["tile"].values)[placed]
    extent = boxes[:, 2].max(), boxes[:, 3].max()
    full = [t for t in np.unique(tiles) if _covers(boxes[tiles == t], extent)]
    crops = [t for t in np.unique(tiles) if t not in full]
    keep = np.isin(tiles, crops if crops else full[:1])
    view = "crop tiles" if crops and full else ("tiles" if crops else "whole image")
    size = image.size if image is not None else (int(np.ceil(extent[0])), int(np.ceil(extent[1])))
    return Patches(placed[keep], boxes[keep], size, view)


def _covers(boxes: np.ndarray, extent: tuple[float, float]) -> bool:
    return bool(boxes[:, 0].min() <= 0.5 and boxes[:, 1].min() <= 0.5 and boxes[:, 2].max() >= extent[0] - 0.5
                and boxes[:, 3].max() >= extent[1] - 0.5)


def hidden_norm(ds: xr.Dataset, rows: np.ndarray, layer: int) -> np.ndarray:
    h = np.asarray(ds["hidden"].isel(token=rows).sel(layer=layer).values, dtype=np.float64)
    return np.linalg.norm(h, axis=-1)


def effect(ds: xr.Dataset, rows: np.ndarray, reference: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(Δnorm, cos) of the condition's tokens `rows` against the reference's `reference`."""
    h = np.asarray(ds["hidden"].isel(token=rows).sel(layer=layer).values, dtype=np.float64)
    r = np.asarray(ds["hidden"].isel(token=reference).sel(layer=layer).values, dtype=np.float64)
    nh, nr = np.linalg.norm(h, axis=-1), np.linalg.norm(r, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return nh - nr, (h * r).sum(-1) / (nh * nr)


def decode_attention(ds: xr.Dataset, rows: np.ndarray, step: int) -> np.ndarray:
    a = np.asarray(ds["decode_attention"].isel(token=rows).sel(step=step).values, dtype=np.float64)
    return a.reshape(len(rows), -1).mean(axis=-1)


def prefill_attention(ds: xr.Dataset, rows: np.ndarray) -> np.ndarray:
    a = np.asarray(ds["prefill_text_attention"].isel(token=rows).values, dtype=np.float64)
    return a.reshape(len(rows), -1).mean(axis=-1)


@dataclass(frozen=True)
class PatchScan:
    """The runs of one scan, direction and layer that patched groups of token indices: `cells`
    maps each group (prompt positions) to the run (condition) that patched it."""

    scan: str
    direction: str
    layer: int
    site: str
    base: str
    donor: str
    cells: dict[tuple[int, ...], str]


def patch_scans(ds: xr.Dataset) -> list[PatchScan]:
    """Every (scan, direction, layer) of a model with runs over token indices (`3`, `3+4`)."""
    found: dict[tuple[str, str, int, str, str, str], dict[tuple[int, ...], str]] = {}
    for run in scan_runs(ds):
        if re.fullmatch(r"[0-9]+(\+[0-9]+)*", run.position):
            key = (run.scan, run.direction, run.layer, run.site, run.base, run.donor)
            found.setdefault(key, {})[tuple(int(p) for p in run.position.split("+"))] = run.condition
    return [PatchScan(*key, cells=cells) for key, cells in found.items()]


def patch_effect(values: xr.DataArray, scan: PatchScan, sample: str, positions: np.ndarray) -> np.ndarray:
    """Per painted token (its prompt position in `positions`): the sample's normalized effect of
    the run that patched the group holding it, NaN where no group of only painted tokens holds it.
    `values`: the metric per (condition, sample) (`analyses.patching.metric_values`)."""
    at = values.sel(sample=sample)
    held = set(as_str(at["condition"].values).tolist())
    out = np.full(len(positions), np.nan)
    if scan.base not in held or scan.donor not in held:
        return out
    base, donor = float(at.sel(condition=scan.base)), float(at.sel(condition=scan.donor))
    index = {int(p): i for i, p in enumerate(positions)}
    for group, run in scan.cells.items():
        if run in held and all(p in index for p in group):
            with np.errstate(invalid="ignore", divide="ignore"):
                out[[index[p] for p in group]] = (float(at.sel(condition=run)) - base) / np.float64(donor - base)
    return out


def paint(fig: Figure, ax: Axes, image: Image.Image | None, where: Patches, values: np.ndarray, label: str,
          cmap: str = "magma", centred: bool = False, limits: tuple[float, float] | None = None) -> None:
    """`values` (one per painted token) as a half-transparent map over the image."""
    width, height = where.size
    if image is not None:
        ax.imshow(np.asarray(image.convert("RGB")), extent=(0, width, height, 0), interpolation="nearest")
    else:
        ax.imshow(np.full((1, 1, 3), 0.85), extent=(0, width, height, 0))
    heat = np.full((height, width), np.nan)
    for (x0, y0, x1, y1), value in zip(where.boxes, values):
        heat[int(np.floor(y0)):int(np.ceil(y1)), int(np.floor(x0)):int(np.ceil(x1))] = value
    finite = values[np.isfinite(values)]
    if limits is None:
        if centred:
            reach = float(np.abs(finite).max()) if len(finite) else 1.0
            limits = (-reach or -1.0, reach or 1.0)
        else:
            limits = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
            # one value up to float32 rounding (a uniform map): no scale spanning the rounding noise
            if np.isclose(limits[0], limits[1], rtol=1e-6, atol=0.0):
                limits = (limits[0] - 0.5, limits[1] + 0.5)
    shown = ax.imshow(heat, extent=(0, width, height, 0), cmap=cmap, alpha=0.6, vmin=limits[0], vmax=limits[1],
                      interpolation="nearest")
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    colorbar(fig, shown, [ax], label)


def sample_images(ds: xr.Dataset, samples: Sequence[str]) -> tuple[dict[str, Image.Image], str | None]:
    """The samples' own images, regenerated from the data source of the runs that wrote the store
    (`effective_spec.data` of its provenance) and checked against the input digest stored per run
    (`run_input`): an image that differs is not drawn on. The reason any is missing, or None."""
    from workbench.data import input_hash, iter_samples
    from workbench.spec import DataSpec

    wanted = set(samples)
    digests = dict(zip(as_str(ds["run_sample"].values), as_str(ds["run_input"].values))) if "run_input" in ds else {}
    found: dict[str, Image.Image] = {}
    reasons: list[str] = []
    for run in reversed(json.loads(ds.attrs.get("provenance") or "[]")):
        data: Any = (run.get("effective_spec") or {}).get("data")
        if not data or not wanted - set(found):
            continue
        try:
            for sample in iter_samples(DataSpec.model_validate(data)):
                if sample.id in wanted and sample.id not in found and sample.image is not None:
                    if digests.get(sample.id) not in (None, input_hash(sample)):
                        reasons.append(f"sample {sample.id}'s image in {data.get('source')} differs from the one run")
                    else:
                        found[sample.id] = sample.image
                if not wanted - set(found):
                    break
        except Exception as exc:  # a data source that is gone or offline: the maps are drawn on a plain canvas
            reasons.append(f"the data source {data.get('source')} cannot be read again ({type(exc).__name__}: {exc})")
    lost = sorted(wanted - set(found))
    if lost and not reasons:
        reasons.append("no run of the store records a data source holding it")
    return found, (f"image of {', '.join(lost)} not drawn: " + "; ".join(dict.fromkeys(reasons))) if lost else None
