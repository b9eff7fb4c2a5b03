"""Checks on captured tensors before they are stored: NaN and Inf are found and reported per
(model, sample, condition, variable, layer), never silently stored as if they were values.

Captures are float32 in the store; models run in float32, bfloat16 or float16, all of whose
finite values float32 holds exactly, so nothing is clipped on the way in. A value that overflowed
inside the model arrives as Inf and is reported here."""

from __future__ import annotations

from typing import Any

import numpy as np

LAYER_DIMS = ("layer", "decoder_layer", "vision_layer")


def nonfinite(name: str, dims: tuple[str, ...], data: np.ndarray, coords: dict[str, np.ndarray]) -> list[str]:
    """One line per layer (or one for the variable) that holds NaN or Inf."""
    if data.dtype.kind != "f":
        return []
    bad = ~np.isfinite(data)
    if not bad.any():
        return []
    layer_dim = next((d for d in dims if d in LAYER_DIMS), None)
    if layer_dim is None:
        return [f"{name}: {int(np.isnan(data).sum())} NaN, {int(np.isinf(data).sum())} Inf"]
    axis = dims.index(layer_dim)
    labels = coords.get(layer_dim, np.arange(data.shape[axis]))
    lines = []
    for i, label in enumerate(labels):
        part = np.take(data, i, axis=axis)
        n_nan, n_inf = int(np.isnan(part).sum()), int(np.isinf(part).sum())
        if n_nan or n_inf:
            lines.append(f"{name} {layer_dim} {int(label)}: {n_nan} NaN, {n_inf} Inf")
    return lines


def nonfinite_report(variables: dict[str, Any]) -> list[str]:
    """Lines for every non-finite capture among a run's store variables."""
    lines: list[str] = []
    for name, var in variables.items():
        lines += nonfinite(name, var.dims, np.asarray(var.data), var.coords)
    return lines
