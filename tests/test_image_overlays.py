"""Patch geometry through a real run and the report's image overlays: a tiny model's run stores
each token's place as token labels (the encoder's, unpacked from one array), `report --samples`
draws the overlays over the sample's own image in report.md and report.html, a sample the store
does not hold is refused (exit 2), and a store without geometry (written before it was stored)
still reports, the section skipped with the reason. The maps of a synthetic store (prefill and
decode attention, the patching effect per patch) hold the values numpy computes from its arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyses.commands import main as analyses_main
from analyses.synthetic import DEFAULT_MODELS, write_synthetic_store
from workbench.cli import main
from workbench.data import builtin_samples
from workbench.models.model import InputEncoder, model_info
from workbench.names import GEOMETRY, GEOMETRY_LABELS, reserved_name_problem
from workbench.store import open_store, store_info

MODEL = "tiny-qwen3vl"
SPEC = f"""\
name: overlays
models: [{MODEL}]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
capture: [{{site: layer}}, {{site: attention}}, {{site: logits}}]
generate: {{max_new_tokens: 2}}
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory, workbench_cache) -> Path:
    root = tmp_path_factory.mktemp("overlays")
    spec = root / "overlays.yaml"
    spec.write_text(SPEC + f"store: {{path: {root / 'overlays.zarr'}}}\n")
    assert main(["run", str(spec), "-q"]) == 0
    return root / "overlays.zarr"


def test_a_run_stores_each_tokens_place_as_token_labels(store):
    ds = open_store(store, model=MODEL, index=False)
    sample = builtin_samples(1)[0]
    rows = np.flatnonzero((ds["condition"].values == "baseline") & (ds["sample"].values == sample.id))
    inputs = InputEncoder(model_info(MODEL)).encode(sample.image, sample.question)
    assert inputs.geometry is not None
    for name in GEOMETRY_LABELS:
        assert name in ds.coords, name
        np.testing.assert_array_equal(ds[name].values[rows], inputs.geometry[name], err_msg=name)
    assert ds["tile"].dtype == np.int32 and ds["box_x0"].dtype == np.float32
    vision = ds["modality"].values == "vision"
    assert (ds["tile"].values[vision] >= 0).all() and (ds["tile"].values[~vision] == -1).all()
    variables = store_info(store)["models"][MODEL]["conditions"]["baseline"]["variables"]
    assert GEOMETRY not in variables and not set(GEOMETRY_LABELS) & set(variables)
    assert all(reserved_name_problem(name) for name in (*GEOMETRY_LABELS, GEOMETRY))


def test_analyze_draws_the_overlays_of_a_named_sample(store, tmp_path, capsys):
    sample = builtin_samples(2)[1].id
    assert main(["analyze", str(store), "image-overlays", "--samples", sample, "--figures", str(tmp_path),
                 "--resamples", "20"]) == 0
    out = capsys.readouterr()
    assert f"| {MODEL} | {sample} |" in out.out and "regenerated" in out.out
    for name in ("overlay_norms", "overlay_attention", "overlay_effects"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0, out.err


def test_a_sample_the_store_lacks_is_refused(store, tmp_path, capsys):
    assert main(["analyze", str(store), "image-overlays", "--samples", "builtin/nope/000"]) == 2
    assert "--samples[0]: no sample 'builtin/nope/000'" in capsys.readouterr().err


@pytest.mark.slow   # every analysis of the report (~30 s)
def test_the_report_shows_the_overlays_in_markdown_and_html(store, tmp_path):
    out = tmp_path / "report"
    assert main(["report", str(store), "--out", str(out), "--resamples", "20"]) == 0
    markdown = (out / "report.md").read_text()
    section = markdown.split("## Vision tokens on the image", 1)[1].split("\n## ", 1)[0]
    for name in ("overlay_norms", "overlay_attention", "overlay_effects"):
        assert f"]({name}.png)" in section
    assert section.count(f"| {MODEL} | builtin/") == 2   # the first two samples by default
    page = (out / "report.html").read_text()
    assert "Vision tokens on the image" in page and page.count("data:image/png;base64") >= 3


def test_a_store_without_geometry_reports_and_says_why(tmp_path, capsys):
    old = write_synthetic_store(tmp_path / "old.zarr", models=DEFAULT_MODELS[:1], n_samples=2, geometry=False).path
    out = tmp_path / "report"
    assert analyses_main(["analyze", str(old), "image-overlays", "norm-ratio", "--figures", str(out),
                          "--resamples", "20"]) == 0
    printed = capsys.readouterr()
    assert "skipped — syn/a-small: the store holds no patch geometry" in printed.out
    assert "figure overlay_norms.png: skipped — syn/a-small: the store holds no patch geometry" in printed.err
    assert not list(out.glob("overlay_*")) and (out / "norms_updates.png").exists()
    ds = open_store(old, model=DEFAULT_MODELS[0].model_id)
    assert "tile" not in ds.coords


def test_older_rows_of_a_resumed_store_read_as_none(tmp_path):
    """A store written before geometry and resumed with it: the array starts later, and the rows
    before it read -1 (its fill value), not a place at the image's corner."""
    path = tmp_path / "resumed.zarr"
    model = DEFAULT_MODELS[0]
    write_synthetic_store(path, models=(model,), n_samples=2, geometry=False, extra_conditions=())
    write_synthetic_store(path, models=(model,), n_samples=1, first_sample=2, extra_conditions=())
    ds = open_store(path, model=model.model_id, index=False)
    old = ds["sample"].values != "synthetic/002"
    for name in GEOMETRY_LABELS:
        assert (ds[name].values[old] == -1).all(), name
    new_vision = ~old & (ds["modality"].values == "vision")
    assert new_vision.any() and (ds["tile"].values[new_vision] == 0).all()


SCAN_TOKENS = (4, 5, 6, 7, 8)   # vision in every synthetic layout, boundary or text in some


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> Path:
    return write_synthetic_store(tmp_path_factory.mktemp("scanned") / "s.zarr", models=DEFAULT_MODELS[:1], n_samples=3,
                                 alphas=(1.0,), extra_conditions=("blank",), scan_layers=(0, 2),
                                 scan_tokens=SCAN_TOKENS).path


def heat_at(ax, boxes: np.ndarray) -> np.ndarray:
    """The painted map's value at each box's centre (the second image of a panel: the map)."""
    heat = np.asarray(ax.images[1].get_array(), dtype=np.float64)
    return np.array([heat[int((y0 + y1) / 2), int((x0 + x1) / 2)] for x0, y0, x1, y1 in boxes])


def test_prefill_and_decode_attention_maps_are_the_stored_attention(scanned, tmp_path):
    from analyses import overlays
    from analyses.builtin.image_overlays import overlay_attention
    from analyses.tables import Options, open_models

    models = open_models(scanned)
    ds = models[DEFAULT_MODELS[0].model_id]
    figure = overlay_attention(models, Options(n_resamples=20, samples=("synthetic/001",)), tmp_path)
    assert figure.skipped is None and figure.path.exists()
    prefill_panel, step0_panel = figure.figure.axes[0], next(ax for ax in figure.figure.axes
                                                              if "decode step 0" in ax.get_title())
    assert "prefill" in prefill_panel.get_title()
    rows = overlays.token_rows(ds, "baseline", "synthetic/001")
    vision = rows[ds["modality"].values[rows] == "vision"]
    received = ds["prefill_text_attention"].values[vision].astype(np.float64)      # (token, layer, head)
    expected = received.mean(axis=(1, 2))
    np.testing.assert_allclose(overlays.prefill_attention(ds, vision), expected, rtol=1e-6)
    where = overlays.patches(ds, rows, None)
    np.testing.assert_array_equal(where.rows, vision)
    np.testing.assert_allclose(heat_at(prefill_panel, where.boxes), expected, rtol=1e-6)
    decode = ds["decode_attention"].values[vision][:, 0].astype(np.float64).mean(axis=(1, 2))
    np.testing.assert_allclose(heat_at(step0_panel, where.boxes), decode, rtol=1e-6)


def test_the_patching_map_is_each_samples_effect_of_patching_that_token(scanned, tmp_path):
    from analyses import overlays
    from analyses.builtin.image_overlays import overlay_patching
    from analyses.patching import metric_values
    from analyses.synthetic import scan_weight
    from analyses.tables import Options, open_models

    models = open_models(scanned)
    model = DEFAULT_MODELS[0]
    ds = models[model.model_id]
    tokens = (1, 2)
    figure = overlay_patching(models, Options(n_resamples=20, samples=("synthetic/000", "synthetic/002"),
                                              metric="logit_diff", tokens=tokens), tmp_path)
    assert figure.skipped is None and figure.path.exists()
    scans = overlays.patch_scans(ds)
    assert sorted(s.layer for s in scans) == [0, 2] and all(set(s.cells) == {(p,) for p in SCAN_TOKENS} for s in scans)
    panels = [ax for ax in figure.figure.axes if ax.get_label() != "<colorbar>" and ax.images]
    assert len(panels) == 2 * len(scans)   # two samples x one panel per layer
    run_rows = ds["run_condition"].values, ds["run_sample"].values
    for i, sample in ((0, "synthetic/000"), (2, "synthetic/002")):
        rows = overlays.token_rows(ds, "baseline", sample)
        where = overlays.patches(ds, rows, None)
        positions = ds["position"].values[where.rows]
        for scan, ax in zip(scans, [ax for ax in panels if sample in ax.get_title()]):
            def diff(condition: str) -> float:   # ln p(a) − ln p(b) at step 0, from the stored arrays
                run = np.flatnonzero((run_rows[0] == condition) & (run_rows[1] == sample))[0]
                lp = ds["logprobs"].values[run, 0].astype(np.float64)
                return lp[tokens[0]] - lp[tokens[1]]
            expected = np.full(len(positions), np.nan)
            for p, condition in scan.cells.items():
                if p[0] in positions:
                    expected[list(positions).index(p[0])] = (diff(condition) - diff("blank")) / (
                        diff("baseline") - diff("blank"))
            values = overlays.patch_effect(metric_values(ds, "logit_diff", "blank", tokens), scan, sample, positions)
            np.testing.assert_allclose(values, expected, rtol=1e-4)
            # by construction the effect of patching token p at layer l is scan_weight(l, p)
            built = [scan_weight(scan.layer, str(p), model.n_layers) if p in SCAN_TOKENS else np.nan for p in positions]
            np.testing.assert_allclose(values, built, rtol=1e-3, atol=1e-5)
            assert np.isnan(values).any() and np.isfinite(values).any()   # tokens no single-token run patched
            np.testing.assert_allclose(heat_at(ax, where.boxes), expected, rtol=1e-4)
