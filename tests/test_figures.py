"""Every registered figure, drawn from synthetic stores (`analyses.synthetic`), checked on the drawn
matplotlib figure with matplotlib's own API: one colour per line, ordered sweep colours with a
colour bar, titles and legends inside the canvas and off the panels, no figure from a single
point, whole-number layer ticks, plain log ticks, one y scale across the norm ladder's families;
a store holding one layer draws no curve over layers and says why; `--format` writes SVG and PDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

from analyses import registry
from analyses.commands import main as analyses_main
from analyses.figures import FigureFile, write_figures
from analyses.synthetic import DEFAULT_MODELS, SyntheticModel, write_synthetic_store
from analyses.tables import Options, open_models

ALPHAS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)   # eight values: a qualitative palette would repeat
# a third family with its own tower and norms: the norm ladder compares two panels
WIDE = SyntheticModel("syn/c-wide", n_layers=2, dim=8, heads=2, kv=4, vocab=24, ratio=40.0, vision_layers=3)
OPTIONS = Options(n_resamples=20)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    return write_synthetic_store(tmp_path_factory.mktemp("small") / "small.zarr", models=DEFAULT_MODELS[:1],
                                 n_samples=3).path


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("figures")
    return write_synthetic_store(root / "sweep.zarr", models=(*DEFAULT_MODELS, WIDE), n_samples=3, alphas=ALPHAS,
                                 scan_layers=(0, 1, 2), scan_tokens=(4, 5, 6),
                                 scan_heads=(0, 1)).path


@pytest.fixture(scope="module")
def saes(tmp_path_factory) -> tuple[str, ...]:
    """SAEs in SAELens's format (initialized, untrained) for the first model's `hidden` at every
    layer (TransformerLens's hook names): the `sae` figure draws them."""
    import torch
    from sae_lens import TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    root, first = tmp_path_factory.mktemp("saes"), DEFAULT_MODELS[0]
    for layer in range(first.n_layers + 1):
        torch.manual_seed(layer)
        TopKSAE(TopKSAEConfig(d_in=first.dim, d_sae=4 * first.dim, k=4, metadata=SAEMetadata(
            hook_name=f"blocks.{layer}.hook_resid_pre"))).save_model(root / f"layer{layer}")
    return (str(root),)


@pytest.fixture(scope="module")
def drawn(sweep_store, saes, tmp_path_factory) -> dict[str, list[FigureFile]]:
    """Every registered figure, from all three models and from the first alone."""
    from analyses.sae import sae_directories

    models = open_models(sweep_store)
    first = next(iter(models))
    options = Options(n_resamples=OPTIONS.n_resamples, sae=tuple(sae_directories(saes)))
    return {"all models": write_figures(models, options, tmp_path_factory.mktemp("all")),
            "one model": write_figures({first: models[first]}, options, tmp_path_factory.mktemp("one"))}


def panels(fig: Figure) -> list[Axes]:
    """The axes that show data: not colour bars (matplotlib labels those "<colorbar>"), not panels set off."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.axison and ax.get_visible()]


def curves(ax: Axes) -> list:
    """The data lines of a panel: drawn in data coordinates (not axhline/axvline), with a label."""
    return [line for line in ax.get_lines() if line.get_transform() is ax.transData
            and not line.get_label().startswith("_")]


def finite_points(line) -> int:
    x, y = (np.asarray(v, dtype=float) for v in line.get_data())
    return int((np.isfinite(x) & np.isfinite(y)).sum())


def inside(box: Bbox, canvas: Bbox, slack: float = 1.0) -> bool:
    return (box.x0 >= canvas.x0 - slack and box.y0 >= canvas.y0 - slack and box.x1 <= canvas.x1 + slack
            and box.y1 <= canvas.y1 + slack)


def overlap(a: Bbox, b: Bbox, slack: float = 1.0) -> bool:
    return a.x0 < b.x1 - slack and b.x0 < a.x1 - slack and a.y0 < b.y1 - slack and b.y0 < a.y1 - slack


def luminance(color: str) -> float:
    r, g, b = to_rgb(color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def check(figure: FigureFile) -> None:
    """The properties every drawn figure has."""
    fig = figure.figure
    assert fig is not None and figure.path is not None and figure.path.exists(), figure.name
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    shown = panels(fig)
    assert shown, figure.name
    # one colour per line, within each panel
    for ax in shown:
        colors = [to_hex(line.get_color()) for line in curves(ax) if finite_points(line) >= 2]
        assert len(colors) == len(set(colors)), (figure.name, ax.get_title(), colors)
    # no figure from a single point: every panel has a curve of two or more points, or an image of two or more cells
    for ax in shown:
        most = max([finite_points(line) for line in ax.get_lines() if line.get_transform() is ax.transData]
                   + [int(np.size(image.get_array())) for image in ax.images] + [0])
        assert most >= 2, (figure.name, ax.get_title(), most)
    # titles and legends inside the canvas; legends off every panel; no title over another or over a legend
    title = next(t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle())
    texts = {"figure title": title.get_window_extent(renderer)}
    texts |= {f"title of panel {i}": ax.title.get_window_extent(renderer) for i, ax in enumerate(shown)
              if ax.get_title()}
    legends = [*fig.legends, *(ax.get_legend() for ax in shown if ax.get_legend() is not None)]
    texts |= {f"legend {i}": legend.get_window_extent(renderer) for i, legend in enumerate(legends)}
    for name, box in texts.items():
        assert inside(box, canvas), (figure.name, name, box, canvas)
    for i, legend in enumerate(legends):
        for ax in shown:
            assert not overlap(texts[f"legend {i}"], ax.get_window_extent(renderer)), (figure.name, ax.get_title())
    for i, ax in enumerate(shown):   # a panel's title stays off the other panels and their axis labels
        for other in shown:
            if other is not ax and ax.get_title():
                for box in (other.get_window_extent(renderer), other.yaxis.label.get_window_extent(renderer)):
                    assert not overlap(texts[f"title of panel {i}"], box), (figure.name, ax.get_title())
    names = list(texts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not overlap(texts[a], texts[b]), (figure.name, a, b)
    # a colour bar labels its length only (no stray "0 1" across it)
    for bar in (ax for ax in fig.axes if ax.get_label() == "<colorbar>"):
        box = bar.get_position()
        across = bar.xaxis if box.height > box.width else bar.yaxis
        assert not [t.get_text() for t in across.get_ticklabels() if t.get_text()], (figure.name, "colour bar")
    # whole layers at every tick of a layer axis; plain numbers on log axes (no "6×10⁻¹")
    for ax in shown:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            if "layer" in axis.get_label_text():
                ticks = [t for t in axis.get_majorticklocs() if low <= t <= high]
                assert ticks and all(float(t).is_integer() for t in ticks), (figure.name, axis.get_label_text(), ticks)
            labels = [t.get_text() for t in [*axis.get_majorticklabels(), *axis.get_minorticklabels()]]
            assert not any("times" in label or "×" in label for label in labels), (figure.name, labels)


@pytest.mark.slow   # ~40 s of CPU: a store of three models and every figure drawn twice
@pytest.mark.parametrize("which", ["all models", "one model"])
def test_every_registered_figure_is_drawn_and_follows_the_rules(drawn, which):
    figures = drawn[which]
    registered = [make.__name__ for analysis in registry.analyses() for make in analysis.figures]
    assert [Path(f.name).stem for f in figures] == registered
    for figure in figures:
        if which == "one model" and figure.name == "training_norms.png":
            # one checkpoint is one point per curve: a curve over training needs two
            assert "single point" in (figure.skipped or ""), figure.skipped
            continue
        assert figure.skipped is None, (figure.name, figure.skipped)
        check(figure)


@pytest.mark.slow   # the figures of the test above
def test_sweep_lines_take_ordered_colours_read_from_a_colour_bar(drawn):
    figure = next(f for f in drawn["all models"] if f.name == "trajectories_vs_alpha.png")
    fig = figure.figure
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes) and not fig.legends
    norm_panel = panels(fig)[0]   # vision ‖h_l‖ under α: the synthetic norm is α times the baseline's
    lines = curves(norm_panel)
    assert len(lines) == len(ALPHAS)
    by_norm = sorted(lines, key=lambda line: float(np.nanmean(line.get_ydata())))
    shades = [luminance(line.get_color()) for line in by_norm]
    assert shades == sorted(shades) and len(set(shades)) == len(ALPHAS)   # viridis brightens along α


@pytest.mark.slow   # the figures of the test above
def test_the_norm_ladder_puts_every_family_on_one_y_scale(drawn):
    fig = next(f for f in drawn["all models"] if f.name == "norm_ladder.png").figure
    shown = panels(fig)
    assert len(shown) == 2   # the two models with a vision tower
    assert shown[0].get_ylim() == shown[1].get_ylim()
    assert shown[0].get_shared_y_axes().joined(shown[0], shown[1])


def defective(kind: str, out: Path) -> FigureFile:
    """A figure with one of the defects the rules exclude, drawn with plain matplotlib."""
    fig = Figure(figsize=(4, 3), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    x = np.arange(2)
    if kind == "repeated colours":
        for i in range(3):
            ax.plot(x, x + i, color=["black", "orange"][i % 2], label=f"alpha={i}")
    elif kind == "colour-bar ticks":
        image = ax.imshow(np.arange(4.0).reshape(2, 2), extent=(-0.5, 1.5, -0.5, 1.5))
        bar = fig.colorbar(image, ax=ax)
        bar.ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # what one locator for every linear axis did
        bar.ax.xaxis.set_ticks_position("bottom")
    elif kind == "single points":
        ax.plot([0], [1.0], marker="o", label="alpha=1")
    else:
        ax.plot(x, x, label="a")
        ax.plot(x, 1 - x, label="b")
    if kind == "legend over the curves":
        ax.legend(loc="center")
    ax.set_xlabel("layer")
    ax.set_xticks([-0.5, 0.0, 0.5, 1.0] if kind == "half-layer ticks" else [0, 1])
    title = "Residual-stream norm and update magnitude per layer (baseline), every model" * (kind == "clipped title")
    fig.suptitle(title or "t")
    path = out / f"{kind}.png"
    fig.savefig(path)
    return FigureFile(path.name, title, path=path, figure=fig)


@pytest.mark.parametrize("kind", ["repeated colours", "single points", "legend over the curves", "half-layer ticks",
                                  "clipped title", "colour-bar ticks"])
def test_the_checks_catch_the_defects_they_name(kind, tmp_path):
    check(defective("none", tmp_path))   # the same figure without the defect passes
    with pytest.raises(AssertionError):
        check(defective(kind, tmp_path))


def test_a_store_of_one_layer_draws_no_curve_over_layers(tmp_path):
    store = write_synthetic_store(tmp_path / "l0.zarr", models=(SyntheticModel("syn/l0", n_layers=0),), n_samples=3,
                                  alphas=(0.1, 1.0, 3.0), extra_conditions=("blank",), variables=("hidden", "logprobs"))
    figures = {f.name: f for f in write_figures(open_models(store.path), OPTIONS, tmp_path / "figures")}
    for name in ("trajectories_vs_alpha.png", "norms_updates.png", "cosine_to_first.png", "text_curves.png",
                 "depth.png"):
        assert figures[name].path is None and "the store holds layer 0" in figures[name].skipped, name
    for figure in figures.values():
        if figure.path is not None:   # what is drawn (α on the x axis) follows the rules
            check(figure)
        else:
            assert figure.skipped and not (tmp_path / "figures" / figure.name).exists()


@pytest.mark.parametrize("fmt, magic", [("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_analyze_writes_the_figures_in_the_format_asked_for(small_store, tmp_path, capsys, fmt, magic):
    out = tmp_path / "figures"
    assert analyses_main(["analyze", str(small_store), "depth", "kv-substitution", "--figures", str(out),
                          "--format", fmt, "--resamples", "20"]) == 0
    captured = capsys.readouterr()
    assert "### Residual-stream norm and update size by depth" in captured.out
    assert sorted(p.name for p in out.iterdir()) == [f"depth.{fmt}", f"kv_substitution.{fmt}"]
    for path in out.iterdir():
        assert path.read_bytes().startswith(magic) and f"wrote {path}" in captured.err
