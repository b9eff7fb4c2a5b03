"""Figures of a store as files (PNG, SVG or PDF): `Plot`, the life of one figure as an analysis
draws it, and `write_figures`, which writes every registered analysis's figures.

Every curve is the mean over samples with its 95% bootstrap CI as a shaded band or error bars;
how figures are drawn (colours, axes, legends, titles) is `analyses.plotting`.

A figure is drawn only from what the store holds: a curve over layers needs two or more layers
(`two_layers`), a modality is drawn only where it has tokens; a figure none of the models can fill,
or whose every curve would be a single point, is skipped with the reason (`FigureFile.skipped`),
never written empty.

An analysis's figure function, in outline:

    def my_figure(models, options, out):
        plot = Plot("my_figure", "What it shows", options, out)
        ready = plot.ready(models, need)          # the models `need` finds nothing lacking in
        if not ready:
            return plot.file                      # skipped, with what each model lacks
        fig, axes = plot.grid(1, 2)
        ...                                       # band(...), layer_axis(...), alpha_axis(...)
        return plot.finish(legend="model")        # legend, titles, checks, the file written
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .cache import MissingInputs
from .plotting import MODALITY_COLORS, band, data_axes, grid, layer_axis, points, tidy
from .registry import analyses
from .tables import Options, Table, sweep_conditions

DPI = 100


@dataclass
class FigureFile:
    name: str                       # the file's name, its suffix the format: kl_vs_alpha.png
    title: str
    path: Path | None = None        # where it was written; None: skipped
    skipped: str | None = None      # why it was not drawn
    figure: Figure | None = None    # the drawn figure (a notebook shows it; the HTML report embeds it)


def save(fig: Figure, out: Path, name: str) -> Path:
    """Write `fig` as out/name, in the format its suffix names (png, svg, pdf)."""
    path = out / name
    fig.savefig(path, dpi=DPI, format=path.suffix.lstrip(".") or "png")
    return path


class Plot:
    """One figure of an analysis while it is drawn: its file (named in the options' format), the
    models that can fill it, and, once drawn, the finishing every figure gets (`finish`)."""

    def __init__(self, name: str, title: str, options: Options, out: Path):
        self.file = FigureFile(f"{name}.{options.figure_format}", title)
        self.out = Path(out)
        self.fig: Figure | None = None

    def skip(self, reason: str) -> FigureFile:
        self.file.skipped = reason
        return self.file

    def ready(self, models: dict[str, xr.Dataset], need: Callable[[xr.Dataset], list[str]]) -> dict[str, xr.Dataset]:
        """The models `need` finds nothing lacking in; none: the figure is skipped with a line per model."""
        ok, missing = usable(models, need)
        if not ok:
            self.skip("; ".join(missing))
        return ok

    def table(self, build: Callable[[dict[str, xr.Dataset], Options], Table], models: dict[str, xr.Dataset],
              options: Options) -> xr.Dataset | None:
        """A figure drawn from a table's data: the data, or None (skipped with the table's reason)."""
        table = build(models, options)
        if table.skipped or table.data is None:
            self.skip(table.skipped or "no model in the store")
            return None
        return table.data

    def grid(self, n_rows: int, n_cols: int, width: float = 4.8, height: float = 3.4,
             sharey: bool = False) -> tuple[Figure, np.ndarray]:
        self.fig, axes = grid(n_rows, n_cols, width, height, sharey)
        return self.fig, axes

    def finish(self, legend: str | None = None) -> FigureFile:
        """The legend (titled `legend`; None: no legend), grids and titles (`plotting.tidy`), then the
        file written, unless every panel would show a single point (skipped, saying so)."""
        if self.fig is None:
            raise RuntimeError(f"{self.file.name}: Plot.finish() before Plot.grid()")
        panels = data_axes(self.fig)
        if not panels or all(points(ax) < 2 for ax in panels):
            return self.skip("every curve would be a single point (a curve needs two or more values on its axis)")
        tidy(self.fig, self.file.title, legend)
        self.file.path = save(self.fig, self.out, self.file.name)
        self.file.figure = self.fig
        return self.file


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


def modality_panels(plot: Plot, data: xr.Dataset, x: str, panels: tuple[tuple[str, str], ...], xlabel: str,
                    ylabel: str) -> FigureFile:
    """One row of panels per model (one per (variable, label) of `panels`), one line per modality
    with its CI band, over the layer dim `x`."""
    if x in data.dims and data.sizes[x] < 2:
        return plot.skip(f"two or more values of {x} for a curve (the store holds {x} "
                         f"{', '.join(str(int(v)) for v in data[x].values)})")
    _, axes = plot.grid(len(data.model), len(panels))
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        for col, (name, label) in enumerate(panels):
            ax: Axes = axes[row, col]
            for modality, color in MODALITY_COLORS.items():
                if modality in values.modality:
                    band(ax, values[x], values[name].sel(modality=modality), color, modality, marker="o")
            ax.set(title=f"{model}: {label}", ylabel=ylabel)
            layer_axis(ax.xaxis, xlabel)
    return plot.finish("modality")


def draw(make: Callable[[dict[str, xr.Dataset], Options, Path], FigureFile], models: dict[str, xr.Dataset],
         options: Options, out: Path) -> FigureFile:
    """One figure written into `out`, or skipped with the inputs it found missing."""
    try:
        return make(models, options, out)
    except MissingInputs as err:
        return FigureFile(f"{make.__name__}.{options.figure_format}", make.__name__, skipped=str(err))


def write_figures(models: dict[str, xr.Dataset], options: Options, out: str | Path,
                  names: list[str] | None = None) -> list[FigureFile]:
    """Every registered analysis's figures (or those of the analyses `names`), in the registry's order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [draw(make, models, options, out) for analysis in analyses()
            if names is None or analysis.name in names for make in analysis.figures]
