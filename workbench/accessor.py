"""`ds.wb`: selection by label across a store's row dims at once, and the common reductions.

A model's Dataset (`open_store(path, model)`) has rows along three dims, each with its own
labels: `token` (`condition`, the sweep values, `sample`, `modality`, ...), `run` (the same
names with a `run_` prefix, and `run_question`, `run_category`, ...) and the vision tower's
`vision_patch` (`patch_` prefix). `ds.sel(condition="baseline")` narrows the tokens only;
`ds.wb.sel(condition="baseline")` narrows every dim that carries the label, so `hidden` and
`logprobs` hold the same runs. A label only runs carry (`question`, `category`) narrows the
tokens too, to those of the chosen runs. Each value is one label, a list of labels, or a
`slice(lo, hi)` (both ends included, as in `.sel`). Dims that are not rows (`layer`, `step`)
are passed on to `.sel`.

Torch-free: the read side registers it when `workbench` is imported.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np
import pandas as pd
import xarray as xr

from .frames import to_dataframe
from .store.layout import PATCH_DIM

ROW_DIMS = {"token": "", "run": "run_", PATCH_DIM: "patch_"}  # row dim -> the prefix of its labels
# names whose prefixed form means something else on another dim (a token's position in its
# sequence, a patch's in the vision tower's rows): each selects on its own dim only
_OWN_DIM_ONLY = frozenset({"position"})
# (condition, sample) of a row, per dim: how a run-only label reaches the tokens and patches
_ROW_KEYS = {"token": ("condition", "sample"), "run": ("run_condition", "run_sample"),
             PATCH_DIM: ("patch_condition", "patch_sample")}


def _row_labels(ds: xr.Dataset, dim: str) -> list[str]:
    return [str(name) for name, coord in ds.coords.items() if coord.dims == (dim,) and name != dim]


def _match(values: np.ndarray, wanted: Any, label: str) -> np.ndarray:
    """Boolean mask of `values` equal to `wanted`, in the list `wanted`, or in the slice `wanted`
    (both ends included, an end of None open)."""
    if isinstance(wanted, slice):
        if wanted.step is not None:
            raise ValueError(f"{label}: got a slice with a step; expected slice(lo, hi) (both ends included)")
        mask = np.ones(len(values), dtype=bool)
        if wanted.start is not None:
            mask &= values >= wanted.start
        if wanted.stop is not None:
            mask &= values <= wanted.stop
        return mask
    if isinstance(wanted, (list, tuple, set, np.ndarray, pd.Index)):
        choices = list(wanted)
        return np.isin(values.astype(object), np.array(choices, dtype=object)) if choices else np.zeros(len(values), bool)
    return np.asarray(values == wanted, dtype=bool)


def _held(values: np.ndarray, limit: int = 12) -> str:
    unique = list(dict.fromkeys(v for v in values.tolist() if not (isinstance(v, float) and np.isnan(v))))
    shown = ", ".join(repr(v) for v in unique[:limit])
    return shown + (f", ... ({len(unique)} in all)" if len(unique) > limit else "")


@xr.register_dataset_accessor("wb")
class WorkbenchAccessor:
    """`ds.wb` on a model's Dataset from `workbench.open_store(path, model)`."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    @property
    def labels(self) -> dict[str, tuple[str, ...]]:
        """Each name `sel` takes (prefix dropped) -> the row dims it narrows."""
        found: dict[str, list[str]] = {}
        for dim, prefix in ROW_DIMS.items():
            for name in _row_labels(self._ds, dim):
                if prefix and name.startswith(prefix) and name[len(prefix):] not in _OWN_DIM_ONLY:
                    name = name[len(prefix):]
                found.setdefault(name, []).append(dim)
        return {name: tuple(dims) for name, dims in found.items()}

    def _coord_on(self, name: str, dim: str) -> str | None:
        """The coordinate along `dim` that label `name` means there, or None."""
        prefix = ROW_DIMS[dim]
        held = _row_labels(self._ds, dim)
        if name in held:
            return name
        if prefix and prefix + name in held and name not in _OWN_DIM_ONLY:
            return prefix + name
        return None

    def sel(self, **labels: Any) -> xr.Dataset:
        """The rows whose labels match, on every row dim that carries each label; `layer`, `step`
        and the other dims are selected with `Dataset.sel`. Each value is a label, a list of labels
        or a `slice(lo, hi)` (both ends included). A label no dim carries, or a value no row holds,
        raises KeyError naming what there is."""
        ds = self._ds
        masks = {dim: np.ones(ds.sizes[dim], dtype=bool) for dim in ROW_DIMS if dim in ds.dims}
        plain: dict[Hashable, Any] = {}
        run_only: list[str] = []
        for name, wanted in labels.items():
            coords = {dim: self._coord_on(name, dim) for dim in masks}
            coords = {dim: coord for dim, coord in coords.items() if coord is not None}
            if not coords:
                if name in ds.dims or name in ds.coords:
                    plain[name] = wanted
                    continue
                known = sorted(self.labels) + sorted(str(d) for d in ds.dims if d not in ROW_DIMS)
                raise KeyError(f"{name}: no dim of this Dataset carries it; expected one of {', '.join(known)}")
            for dim, coord in coords.items():
                values = np.asarray(ds[coord].values)
                mask = _match(values, wanted, name)
                if not isinstance(wanted, slice) and not mask.any() and values.size:
                    raise KeyError(f"{name}: got {wanted!r}; no row holds it (held: {_held(values)})")
                masks[dim] &= mask
            if "run" in coords and "token" not in coords:
                run_only.append(name)
        if run_only:  # the tokens (and patches) of the chosen runs only
            chosen = set(zip(*(np.asarray(ds[c].values[masks["run"]]).tolist() for c in _ROW_KEYS["run"])))
            for dim in masks.keys() - {"run"}:
                keys = zip(*(np.asarray(ds[c].values).tolist() for c in _ROW_KEYS[dim]))
                masks[dim] &= np.fromiter((key in chosen for key in keys), dtype=bool, count=ds.sizes[dim])
        picked = ds.isel({dim: np.flatnonzero(mask) for dim, mask in masks.items() if not mask.all()})
        return picked.sel(plain) if plain else picked

    def frame(self, variable: str = "hidden") -> pd.DataFrame:
        """Tidy rows of a per-token variable: one per token (and layer), every label a column, the
        L2 norm over its last dim as `norm` (`workbench.to_dataframe`)."""
        return to_dataframe(self._ds, variable)

    def runs(self) -> pd.DataFrame:
        """One row per run: its labels (`condition`, `sample`, the sweep values, `question`, ...,
        prefix dropped) and its per-run numbers (`n_tokens`, `nonfinite`)."""
        ds = self._ds.reset_index([d for d in ("run",) if d in self._ds.indexes])
        columns = {name[len("run_"):] if name.startswith("run_") else name: np.asarray(ds[name].values)
                   for name in _row_labels(ds, "run")}
        columns.update({str(name): np.asarray(ds[name].values) for name, v in ds.data_vars.items() if v.dims == ("run",)})
        return pd.DataFrame(columns)

    def norms(self, variable: str = "hidden", by: Sequence[str] = ("condition", "modality")) -> xr.DataArray:
        """The mean L2 norm (over the variable's last dim) of its tokens, per label in `by` and per
        layer: a DataArray with dims (*by, layer); a combination no token has is NaN. Tokens are
        pooled, every token weighing the same (`analyses.norms.norm_curves` gives the mean over
        samples of each sample's mean, with a bootstrap interval)."""
        by = list(by)
        frame = self.frame(variable)
        missing = [name for name in by if name not in frame.columns]
        if missing:
            raise KeyError(f"by: {', '.join(missing)} is not a token label; expected some of "
                           f"{', '.join(c for c in frame.columns if c != 'norm')}")
        keys = by + (["layer"] if "layer" in frame.columns else [])
        norms = frame.groupby(keys, sort=True, dropna=False).norm.mean().to_xarray()
        norms.name = "norm"
        norms.attrs["description"] = f"mean L2 norm of {variable} over its tokens"
        return norms

