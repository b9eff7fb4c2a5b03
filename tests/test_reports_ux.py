"""Reports that describe what a store holds: neutral headings, sections and figures chosen by the
store's content (skips give reasons, no empty figures, no `nan`), the depth table checked against
`analyses.depth`, and argument values checked against the store with a did-you-mean. Real runs of
tiny models through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main


def run_spec_text(root: Path, name: str, body: str) -> Path:
    store = root / f"{name}.zarr"
    spec = root / f"{name}.yaml"
    spec.write_text(f"name: {name}\n{body}store: {{path: {store}}}\n")
    assert main(["run", str(spec), "-q"]) == 0
    return store


@pytest.fixture(scope="module")
def one_layer_store(tmp_path_factory, workbench_cache):
    """A VLM store like alpha_sweep's: one layer (0), a text-only condition, an α sweep."""
    return run_spec_text(tmp_path_factory.mktemp("one-layer"), "one_layer", """\
models: [tiny-smolvlm]
data: {source: builtin, n: 2}
conditions:
  baseline: {}
  none: {image: none}
  alpha:
    sweep: {alpha: [0.5, 2.0]}
    interventions: [{kind: scale, site: projector, factor: $alpha, positions: vision}]
capture: [{site: layer, layers: [0]}, {site: logits}]
""")


@pytest.fixture(scope="module")
def depth_store(tmp_path_factory, workbench_cache):
    return run_spec_text(tmp_path_factory.mktemp("depth"), "depth", """\
models: [tiny-llama]
data: {source: builtin, n: 3}
conditions: {baseline: {}}
capture: [{site: layer}]
""")


def test_report_on_one_layer_skips_curves_with_the_reason(one_layer_store, tmp_path, capsys):
    from matplotlib.image import imread

    out = tmp_path / "report"
    assert main(["report", str(one_layer_store), "--out", str(out), "--resamples", "50"]) == 0
    report = (out / "report.md").read_text()
    assert report.startswith("# Analyses of one_layer.zarr") and "Norm-gap" not in report
    assert "## Vision and text token norms at the LLM input" in report
    assert "*The study reports that vision tokens enter the LLM with higher norms" in report
    reason = "needs two or more layers for a curve over layers (the store holds layer 0)"
    assert f"*Figure norms_updates.png: skipped — tiny-smolvlm: {reason}*" in report
    assert "## Not in this store" in report and "- Norm growth and update size with depth: tiny-smolvlm: needs two" in report
    assert not (out / "norms_updates.png").exists() and not (out / "cosine_to_first.png").exists()
    for png in out.glob("*.png"):  # whatever is drawn is not empty
        assert imread(png)[..., :3].std() > 0.05, png.name
    assert "nan" not in report.lower().replace("nanmean", "")


def test_analyze_does_not_print_nan_for_a_condition_without_vision(one_layer_store, capsys):
    assert main(["analyze", str(one_layer_store), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    assert "| tiny-smolvlm | n/a | n/a |" not in out  # a correlation that cannot be computed is skipped, with why
    assert "tiny-smolvlm: needs three or more layers for a correlation over layers (the store holds layer 0)" in out


@pytest.mark.parametrize("argv, message", [
    (["--reference", "basline"], "--reference: no condition 'basline' in {store} (did you mean 'baseline'?); "
                                 "expected one of alpha[alpha=0.5], alpha[alpha=2.0], baseline, none"),
    (["--text-only", "nnoe"], "--text-only: no condition 'nnoe' in {store} (did you mean 'none'?)"),
    (["--sweep", "alhpa"], "--sweep: no swept variable 'alhpa' in {store} (did you mean 'alpha'?); expected one of alpha"),
    (["--models", "tiny-smolvl"], "--models[0]: no model 'tiny-smolvl' in {store} (did you mean 'tiny-smolvlm'?)"),
])
@pytest.mark.parametrize("command", ["analyze", "report"])
def test_argument_values_get_a_did_you_mean(one_layer_store, tmp_path, capsys, command, argv, message):
    extra = ["--out", str(tmp_path / "r")] if command == "report" else []
    assert main([command, str(one_layer_store), *argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(store=one_layer_store)), err
    assert not (tmp_path / "r").exists()


def test_unknown_table_name_gets_a_did_you_mean(one_layer_store, capsys):
    assert main(["analyze", str(one_layer_store), "dpeth"]) == 2   # checked before the store is read
    assert "unknown table 'dpeth' (did you mean 'depth'?)" in capsys.readouterr().err


def test_depth_table_matches_analyses_depth(depth_store, tmp_path, capsys):
    import workbench
    from analyses import depth, tables

    assert main(["analyze", str(depth_store), "depth", "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "### Residual-stream norm and update size by depth (all tokens, condition baseline)" in out
    assert "| tiny-llama | 0 | " in out and "| tiny-llama | 2 | " in out
    data = tables.build_tables(depth_store, ["depth"], tables.Options(n_resamples=50))[0].data.sel(model="tiny-llama")
    ds = workbench.open_store(depth_store, model="tiny-llama")
    samples = np.asarray(ds["sample"].values).astype(object).astype(str)
    norms, ratios = [], []
    for sample in sorted(set(samples)):  # the definitions of analyses.depth, per sample, then the mean
        hidden = ds.hidden.isel(token=np.flatnonzero(samples == sample))
        norms.append(depth.mean_norm(hidden).values)
        ratios.append(depth.mean_update_ratio(hidden).values)
    np.testing.assert_allclose(data["norm"].sel(stat="value").values, np.mean(norms, axis=0), rtol=1e-6)
    # depth's decoder layer l is the table's layer l + 1
    np.testing.assert_allclose(data["relative_update"].sel(stat="value").values[1:], np.mean(ratios, axis=0), rtol=1e-6)
    assert np.isnan(data["relative_update"].sel(stat="value").values[0])

    out_dir = tmp_path / "report"
    assert main(["report", str(depth_store), "--out", str(out_dir), "--resamples", "50"]) == 0
    report = (out_dir / "report.md").read_text()
    assert "## Norm growth and update size with depth" in report and "](depth.png)" in report
    assert "Vision/text norm ratio at the LLM input (layer 0, condition baseline): skipped — tiny-llama: needs " \
           "vision tokens under 'baseline'" in report


def test_one_number_format_per_column():
    from analyses.tables import Cell, Table

    table = Table("t", "T", ["model", "KL", "ratio"], rows=[
        ["a", Cell(0.25, 0.2, 0.3), Cell(1.5, 1.4, 1.6)],
        ["b", Cell(3e-5, 2e-5, 4e-5), Cell(0.0, 0.0, 0.0)],   # 3e-5 would print as 0.00: the column goes scientific
        ["c", Cell(float("nan"), float("nan"), float("nan")), Cell(2.0, 1.0, 3.0)],
    ])
    rows = table.formatted_rows()
    assert [r[1] for r in rows] == ["2.5e-01 [2.0e-01, 3.0e-01]", "3.0e-05 [2.0e-05, 4.0e-05]", "n/a"]
    assert [r[2] for r in rows] == ["1.50 [1.40, 1.60]", "0.00 [0.00, 0.00]", "2.00 [1.00, 3.00]"]
    assert "| b | 3.0e-05 [2.0e-05, 4.0e-05] | 0.00 [0.00, 0.00] |" in table.markdown()
