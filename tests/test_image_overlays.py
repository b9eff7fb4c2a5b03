"""Patch geometry through a real run and the report's image overlays: a tiny model's run stores
each token's place as token labels (the encoder's, unpacked from one array), `report --samples`
draws the overlays over the sample's own image in report.md and report.html, a sample the store
does not hold is refused (exit 2), and a store without geometry (written before it was stored)
still reports, the section skipped with the reason."""

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
