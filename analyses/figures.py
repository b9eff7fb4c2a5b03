"""Figures of a store as PNG files: the pieces every analysis's figures are drawn with, and
`write_figures`, which writes every registered analysis's figures.

matplotlib with no display: `Figure` objects render with the Agg canvas. Every curve is the mean
over samples with its 95% bootstrap CI as a shaded band (`band`) or error bars. Colours are fixed
across figures: one per modality (`MODALITY_COLORS`), one per model (`model_colors`, in the
store's model order), one per compared condition (`condition_colors`).

A figure is drawn only from what the store holds: a curve over layers needs two or more layers
(`two_layers`), a modality is drawn only where it has tokens; a figure none of the models can fill
is skipped with the reason (`FigureFile.skipped`), never written empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from numpy.typing import ArrayLike

from .cache import MissingInputs
from .registry import analyses
from .tables import Options, Table, sweep_conditions


MODALITY_COLORS = {"vision": "#1f77b4", "text": "#d62728", "boundary": "#7f7f7f"}
_MODEL_PALETTE = ("#2ca02c", "#9467bd", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#8c6d31")
_CONDITION_PALETTE = ("#000000", "#ff7f0e", "#8c564b", "#637939", "#7b4173")
LAYER_LABEL = "layer l (0 = LLM input; l = after l decoder layers)"
DECODER_LAYER_LABEL = "decoder layer"
ALPHA_LABEL = "α, scale factor of the projector output (log scale)"
DPI = 100


def model_colors(models: list[str]) -> dict[str, str]:
    return {m: _MODEL_PALETTE[i % len(_MODEL_PALETTE)] for i, m in enumerate(models)}


def condition_colors(conditions: list[str]) -> dict[str, str]:
    return {c: _CONDITION_PALETTE[i % len(_CONDITION_PALETTE)] for i, c in enumerate(conditions)}


@dataclass
class FigureFile:
    name: str
    title: str
    path: Path | None = None
    skipped: str | None = None


def band(ax: Axes, x: ArrayLike, est: xr.DataArray, color: str, label: str, linestyle: str = "-", marker: str | None = None) -> None:
    value, low, high = (np.asarray(est.sel(stat=s).values, float) for s in ("value", "ci_low", "ci_high"))
    ok = np.isfinite(value)
    if not ok.any():
        return
    x = np.asarray(x)[ok]
    ax.plot(x, value[ok], color=color, label=label, linestyle=linestyle, marker=marker, markersize=4)
    ax.fill_between(x, low[ok], high[ok], color=color, alpha=0.18, linewidth=0)


def grid(n_rows: int, n_cols: int, width: float = 4.8, height: float = 3.4) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width * n_cols, height * n_rows), layout="constrained")
    axes = np.atleast_2d(fig.subplots(n_rows, n_cols, squeeze=False))
    return fig, axes


def save(fig: Figure, out: Path, name: str) -> Path:
    for ax in fig.axes:
        if ax.get_xscale() == "linear":  # layer axes: whole layers only
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        low, high = ax.get_ylim()
        if ax.get_yscale() == "log" and 0 < low and high / low < 10:
            # less than a decade: plain numbers ("0.18") rather than "1.8×10⁻¹" at every minor tick
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    path = out / name
    fig.savefig(path, dpi=DPI)
    return path


def two_layers(ds: xr.Dataset) -> list[str]:
    """A curve over layers needs two or more layers stored."""
    if "layer" in ds.dims and ds.sizes["layer"] < 2:
        held = ", ".join(str(int(l)) for l in ds["layer"].values)
        return [f"two or more layers for a curve over layers (the store holds layer {held})"]
    return []


def usable(models: dict[str, xr.Dataset],
           need: Callable[[xr.Dataset], list[str]]) -> tuple[dict[str, xr.Dataset], list[str]]:
    """The models `need` finds nothing lacking in, and a line for each of the others."""
    ok, missing = {}, []
    for model, ds in models.items():
        lacking = need(ds)
        if lacking:
            missing.append(f"{model}: needs {', '.join(lacking)}")
        else:
            ok[model] = ds
    return ok, missing


def alpha_series(ds: xr.Dataset, est: xr.DataArray, sweep: str) -> tuple[np.ndarray, xr.DataArray]:
    """The swept values of `sweep` in order, and `est` at their conditions."""
    conditions = sweep_conditions(ds, sweep)
    names = [c for c, _, _ in conditions if c in est.condition.values]
    values = np.array([v for c, v, _ in conditions if c in names])
    return values, est.sel(condition=names)


def from_table(name: str, title: str, build: Callable[[dict[str, xr.Dataset], Options], Table],
               models: dict[str, xr.Dataset], options: Options) -> tuple[FigureFile, xr.Dataset | None]:
    """A figure drawn from a table's data: the data, or None with the table's reason to skip."""
    fig_file = FigureFile(name, title)
    table = build(models, options)
    if table.skipped or table.data is None:
        fig_file.skipped = table.skipped or "no model in the store"
        return fig_file, None
    return fig_file, table.data


def modality_panels(data: xr.Dataset, x: str, panels: tuple[tuple[str, str], ...], xlabel: str, ylabel: str,
                    title: str, fig_file: FigureFile, out: Path) -> FigureFile:
    """One row of panels per model (one per (variable, label) of `panels`), one line per modality
    with its CI band, over the dim `x`."""
    fig, axes = grid(len(data.model), len(panels))
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        for col, (name, label) in enumerate(panels):
            ax = axes[row, col]
            for modality, color in MODALITY_COLORS.items():
                if modality in values.modality:
                    band(ax, values[x], values[name].sel(modality=modality), color, modality, marker="o")
            ax.set(title=f"{model}: {label}", xlabel=xlabel, ylabel=ylabel)
    return finish(fig, axes, "modality", title, fig_file, out)


def finish(fig: Figure, axes: np.ndarray, legend: str, title: str, fig_file: FigureFile, out: Path) -> FigureFile:
    """Legends (titled `legend`) and grids on every panel, the title, and the file written."""
    for ax in axes.flat:
        ax.legend(title=legend, fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = save(fig, out, fig_file.name)
    return fig_file


def draw(make: Callable[[dict[str, xr.Dataset], Options, Path], FigureFile], models: dict[str, xr.Dataset],
         options: Options, out: Path) -> FigureFile:
    """One figure written into `out`, or skipped with the inputs it found missing."""
    try:
        return make(models, options, out)
    except MissingInputs as err:
        return FigureFile(make.__name__ + ".png", make.__name__, skipped=str(err))


def write_figures(models: dict[str, xr.Dataset], options: Options, out: str | Path) -> list[FigureFile]:
    """Every registered analysis's figures, in the registry's order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [draw(make, models, options, out) for analysis in analyses() for make in analysis.figures]
