"""Drawing the report's figures: colours, curves with their CI bands, axes, colour bars, legends
and titles that fit.

matplotlib with no display: `Figure` objects render with the Agg canvas, laid out by the
constrained layout engine. The rules every figure follows:

- colours: one per modality (`MODALITY_COLORS`), one per model (`model_colors`), one per compared
  condition (`condition_colors`), all distinct for any number of lines (`distinct_colors`); lines
  that are values of a sweep take ordered colours of a sequential map along the swept value, read
  from a colour bar (`sweep_colors`, `colorbar`), not from a legend;
- layer axes carry whole layers only (`layer_axis`); α axes are logarithmic with the unscaled
  value 1 marked (`alpha_axis`); log axes print plain numbers ("0.6", "40"), never "6×10⁻¹";
- legends stand outside the panels (`legend_outside`), and titles wrap to the width they have
  (`fit_titles`), so neither covers a curve nor runs off the canvas;
- `points` counts what a panel shows: a figure whose every curve is a single point is not drawn.
"""

from __future__ import annotations

import textwrap
from typing import Iterable, Sequence

import numpy as np
import xarray as xr
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm, Normalize, to_hex
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter, MaxNLocator, ScalarFormatter
from numpy.typing import ArrayLike

MODALITY_COLORS = {"vision": "#1f77b4", "text": "#d62728", "boundary": "#7f7f7f"}
_MODEL_PALETTE = ("#2ca02c", "#9467bd", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#8c6d31")
_CONDITION_PALETTE = ("#000000", "#ff7f0e", "#8c564b", "#637939", "#7b4173")
SWEEP_COLORMAP = "viridis"   # sequential and perceptually uniform: the order of the values reads off the colour
LAYER_LABEL = "layer l (0 = LLM input; l = after l decoder layers)"
DECODER_LAYER_LABEL = "decoder layer"
ALPHA_LABEL = "α, scale factor of the projector output (log scale)"
LEGEND_FONTSIZE = 8


def distinct_colors(labels: Sequence[str], palette: Sequence[str]) -> dict[str, str]:
    """One colour per label, all different: the palette's, then evenly spaced hues of a cyclic map
    for labels past its end (a palette that wrapped around would give two lines one colour)."""
    extra = max(0, len(labels) - len(palette))
    more = [to_hex(colormaps["hsv"](i / extra)) for i in range(extra)]
    return dict(zip(labels, [*palette[:len(labels)], *more]))


def model_colors(models: Sequence[str]) -> dict[str, str]:
    return distinct_colors(list(models), _MODEL_PALETTE)


def condition_colors(conditions: Sequence[str]) -> dict[str, str]:
    return distinct_colors(list(conditions), _CONDITION_PALETTE)


def sweep_colors(values: Sequence[float]) -> tuple[list[str], ScalarMappable]:
    """Ordered colours for the values of a sweep (a log scale where they are positive and span
    more than a factor 10), and the mappable a colour bar reads them from."""
    array = np.asarray(values, dtype=float)
    low, high = float(np.min(array)), float(np.max(array))
    if low > 0 and high / low > 10:
        norm: Normalize = LogNorm(low, high)
    else:
        norm = Normalize(low, high if high > low else low + 1)
    mappable = ScalarMappable(norm=norm, cmap=colormaps[SWEEP_COLORMAP])
    return [to_hex((float(r), float(g), float(b), float(a))) for r, g, b, a in mappable.to_rgba(array)], mappable


def grid(n_rows: int, n_cols: int, width: float = 4.8, height: float = 3.4,
         sharey: bool = False) -> tuple[Figure, np.ndarray]:
    """A figure of n_rows × n_cols panels (a 2-D array of axes), laid out by constrained layout."""
    fig = Figure(figsize=(width * n_cols, height * n_rows), layout="constrained")
    FigureCanvasAgg(fig)   # no display: draws (fig.canvas.draw) and measures text with Agg
    axes = np.atleast_2d(fig.subplots(n_rows, n_cols, squeeze=False, sharey=sharey))
    return fig, axes


def band(ax: Axes, x: ArrayLike, est: xr.DataArray, color: str, label: str | None, linestyle: str = "-",
         marker: str | None = None) -> None:
    """The estimate's value as a line and its 95% CI as a shaded band (stat: value, ci_low, ci_high)."""
    value, low, high = (np.asarray(est.sel(stat=s).values, float) for s in ("value", "ci_low", "ci_high"))
    ok = np.isfinite(value)
    if not ok.any():
        return
    x = np.asarray(x)[ok]
    ax.plot(x, value[ok], color=color, label=label, linestyle=linestyle, marker=marker, markersize=4)
    ax.fill_between(x, low[ok], high[ok], color=color, alpha=0.18, linewidth=0)


def layer_axis(axis: Axis, label: str = LAYER_LABEL) -> None:
    """An axis of layers: its label, and ticks at whole layers only."""
    axis.set_label_text(label)
    axis.set_major_locator(MaxNLocator(integer=True))


def alpha_axis(ax: Axes, label: str = ALPHA_LABEL) -> None:
    """A logarithmic x axis of the swept scale, the unscaled value 1 marked by a dashed line."""
    ax.set(xscale="log", xlabel=label)
    ax.axvline(1.0, color="#999999", linestyle="--", linewidth=0.8)


def _plain(value: float, _position: object = None) -> str:
    """A tick label as a plain number: "0.6", "40", "12000" (mathtext 10^k only far from 1)."""
    if value <= 0 or not np.isfinite(value):
        return ""
    if 1e-4 <= value < 1e6:
        return np.format_float_positional(value, precision=3, unique=True, fractional=False, trim="-")
    return f"$10^{{{np.log10(value):.0f}}}$" if np.isclose(np.log10(value), round(np.log10(value))) else f"{value:.2g}"


def plain_log_ticks(axis: Axis) -> None:
    """Plain numbers at a log axis's ticks. Minor ticks are labelled where few decades leave the
    major ones sparse: all of them within one decade, those at 2 and 5 within two, none beyond."""

    def minor(value: float, _position: object = None) -> str:
        low, high = sorted(axis.get_view_interval())
        decades = np.log10(high / low) if low > 0 else np.inf
        mantissa = round(value / 10 ** np.floor(np.log10(value) + 1e-9), 6) if value > 0 else 0
        return _plain(value) if decades <= 1 or (decades <= 2 and mantissa in (2, 5)) else ""

    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_formatter(FuncFormatter(minor))


def colorbar(fig: Figure, mappable: ScalarMappable, axes: Iterable[Axes], label: str) -> None:
    """One colour bar beside `axes`, for the sweep colours of their lines."""
    bar = fig.colorbar(mappable, ax=list(axes), label=label, fraction=0.05, pad=0.02)
    if isinstance(mappable.norm, LogNorm):
        plain_log_ticks(bar.ax.yaxis)
    elif isinstance(bar.formatter, ScalarFormatter):
        bar.formatter.set_useOffset(False)  # ticks read as values, never "1e-7 + 1.5e1"


def heatmap(fig: Figure, ax: Axes, values: xr.DataArray, x: str, y: str, label: str, vmin: float | None = None,
            vmax: float | None = None) -> None:
    """`values` (dims y, x) as an image with whole-number ticks on both axes and its colour bar
    (vmin, vmax: one colour scale across panels)."""
    image = ax.imshow(values.transpose(y, x).values, aspect="auto", origin="lower", cmap="viridis", vmin=vmin, vmax=vmax,
                      extent=(-0.5, values.sizes[x] - 0.5, -0.5, values.sizes[y] - 0.5))
    for axis, dim in ((ax.xaxis, x), (ax.yaxis, y)):
        axis.set_major_locator(MaxNLocator(integer=True))
        axis.set_major_formatter(FuncFormatter(lambda v, _, c=values[dim].values: _coordinate(c, v)))
    fig.colorbar(image, ax=ax, label=label)


def _coordinate(coords: np.ndarray, position: float) -> str:
    """The coordinate at an image's cell index (a layer or head number), blank between cells."""
    i = int(round(position))
    return str(coords[i]) if 0 <= i < len(coords) and np.isclose(position, i) else ""


def not_stored(ax: Axes, reason: str) -> None:
    """A panel with nothing to draw: no axes, the reason in words."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, textwrap.fill(reason, 40), ha="center", va="center", transform=ax.transAxes, fontsize=9,
            color="#555555")


def data_axes(fig: Figure) -> list[Axes]:
    """The panels of a figure that show data: not colour bars, not panels set off."""
    # matplotlib labels the axes it makes for a colour bar "<colorbar>" (3.11 lib/matplotlib/colorbar.py, make_axes)
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.axison and ax.get_visible()]


def points(ax: Axes) -> int:
    """How many data points a panel draws at most in one artist: a curve's finite points (markers
    with error bars included), an image's cells."""
    counts = [0]
    for line in ax.get_lines():
        if line.get_transform() is ax.transData:   # data, not a reference line (axhline, axvline)
            x, y = (np.asarray(v, dtype=float) for v in line.get_data())
            counts.append(int((np.isfinite(x) & np.isfinite(y)).sum()))
    counts += [int(np.size(cells)) for im in ax.images
               if isinstance(im, AxesImage) and (cells := im.get_array()) is not None]
    return max(counts)


def legend_outside(fig: Figure, title: str | None) -> None:
    """One legend for the figure, below the panels (the titles are above them): every labelled line
    once (a label means the same colour in every panel), in as many columns as the canvas is wide
    enough for. None where no line has a label."""
    entries: dict[str, Artist] = {}
    for ax in data_axes(fig):
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            entries.setdefault(label, handle)
    if not entries:
        return
    for ncols in range(len(entries), 0, -1):
        legend = fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=ncols,
                            title=title, fontsize=LEGEND_FONTSIZE, title_fontsize=LEGEND_FONTSIZE + 1)
        if ncols == 1 or legend.get_window_extent().width <= fig.bbox.width * 0.95:
            return
        legend.remove()


def _wrap_to(text: Text, width_px: float, renderer: RendererBase) -> None:
    """Wrap `text` onto more lines until it is no wider than `width_px`."""
    words = " ".join(text.get_text().split("\n"))
    chars = len(words)
    while chars > 10 and text.get_window_extent(renderer).width > width_px:
        chars = int(chars * 0.85)
        text.set_text(textwrap.fill(words, chars, break_long_words=False))


def fit_titles(fig: Figure, title: str) -> Text:
    """The figure's title, and each panel's, wrapped to the width they have: the figure's to the
    canvas, a panel's to its panel. Returns the figure title."""
    suptitle = fig.suptitle(title)
    canvas = fig.canvas
    if not isinstance(canvas, FigureCanvasAgg):  # every figure here is made by `grid`, on Agg
        raise TypeError(f"fit_titles measures text on an Agg canvas; got {type(canvas).__name__}")
    canvas.draw()   # the layout and the renderer the extents are measured with
    renderer = canvas.get_renderer()
    for ax in data_axes(fig):
        _wrap_to(ax.title, ax.get_window_extent(renderer).width, renderer)
    _wrap_to(suptitle, fig.bbox.width * 0.95, renderer)
    return suptitle


def tidy(fig: Figure, title: str, legend: str | None) -> None:
    """What every figure gets last: a light grid, plain numbers on log axes, the legend outside the
    panels (titled `legend`; None: no legend), and titles that fit."""
    for ax in data_axes(fig):
        if not ax.images:   # a grid over a heat map hides its cells
            ax.grid(alpha=0.3, which="both" if ax.get_xscale() == "log" else "major")
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                plain_log_ticks(axis)
    if legend is not None:
        legend_outside(fig, legend)
    fit_titles(fig, title)


def marker_line(ax: Axes, x: ArrayLike, est: xr.DataArray, color: str, label: str, marker: str = "o") -> None:
    """Estimates at categorical positions: markers with their 95% CI as error bars, no line between."""
    value, low, high = (np.asarray(est.sel(stat=s).values, float) for s in ("value", "ci_low", "ci_high"))
    ok = np.isfinite(value)
    x = np.asarray(x, dtype=float)[ok]
    ax.errorbar(x, value[ok], yerr=[value[ok] - low[ok], high[ok] - value[ok]], color=color, marker=marker,
                linestyle="none", capsize=3, label=label)

