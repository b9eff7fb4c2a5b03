"""The update decomposition (`analyses.branches`, table `update-decomposition`, figure
`branch_shares`) from a store written by real runs of tiny models, checked against numpy on the
stored arrays; its CIs are the bootstrap's over the same per-sample values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import workbench
from analyses.bootstrap import bootstrap_array
from analyses.branches import token_shares, update_decomposition
from analyses.builtin.update_decomposition import branch_shares
from analyses.tables import Options, build_tables, open_models
from workbench.cli import main
from workbench.runner import run_spec
from workbench.spec import parse_spec

MODELS = ("tiny-smolvlm", "tiny-qwen3vl")


@pytest.fixture(scope="module")
def branch_store(tmp_path_factory, workbench_cache) -> Path:
    store = tmp_path_factory.mktemp("branches") / "branches.zarr"
    run_spec(parse_spec(f"""\
name: branches
models: [{", ".join(MODELS)}]
data: {{source: builtin, n: 3}}
conditions: {{baseline: {{}}, blank: {{image: blank}}}}
capture: [{{site: layer}}, {{site: attn_out}}, {{site: mlp_out}}]
backend: {{dtype: float32, device: cpu}}
store: {{path: {store}}}
"""), progress=False, log=lambda _: None)
    return store


def _numpy_shares(ds, condition, modality, branch):
    """Per-sample means of ‖branch_l‖/‖h_l‖ over that sample's tokens of `modality`: (layer, sample)."""
    labels = {k: np.asarray(ds[k].values).astype(object).astype(str) for k in ("condition", "modality", "sample")}
    hidden, out = np.asarray(ds["hidden"].values, np.float64), np.asarray(ds[branch].values, np.float64)
    samples = sorted(set(labels["sample"]))
    result = np.zeros((out.shape[1], len(samples)))
    for j, sample in enumerate(samples):
        rows = (labels["condition"] == condition) & (labels["modality"] == modality) & (labels["sample"] == sample)
        ratio = np.linalg.norm(out[rows], axis=-1) / np.linalg.norm(hidden[rows][:, :-1], axis=-1)
        result[:, j] = ratio.mean(0)
    return result


@pytest.mark.parametrize("name", MODELS)
def test_shares_equal_numpy_on_the_stored_arrays(branch_store, name):
    ds = workbench.open_store(branch_store, model=name)
    hidden = np.asarray(ds["hidden"].values, np.float64)
    total = hidden[:, :-1] + ds["attn_out"].values + ds["mlp_out"].values
    if name == "tiny-qwen3vl":  # h_(l+1) is after the DeepStack add: the identity holds at text rows
        text = np.asarray(ds["modality"].values).astype(object).astype(str) != "vision"
        np.testing.assert_allclose(total[text], hidden[text, 1:], atol=1e-5)
    else:
        np.testing.assert_allclose(total, hidden[:, 1:], atol=1e-5)
    per_sample = update_decomposition(ds, per_sample=True)
    summary = update_decomposition(ds, n_resamples=200, seed=3)
    for condition in ("baseline", "blank"):
        for modality in ("vision", "text"):
            for name_, branch in (("attn_share", "attn_out"), ("mlp_share", "mlp_out")):
                expected = _numpy_shares(ds, condition, modality, branch)
                got = per_sample[name_].sel(condition=condition, modality=modality).values
                np.testing.assert_allclose(got, expected, rtol=1e-10)
                np.testing.assert_allclose(summary[name_].sel(condition=condition, modality=modality).values,
                                           bootstrap_array(expected, n_resamples=200, seed=3), rtol=1e-10)
    # absolute: the branch norms themselves
    absolute = token_shares(ds, absolute=True)["attn_share"].values
    np.testing.assert_allclose(absolute, np.linalg.norm(np.asarray(ds["attn_out"].values, np.float64), axis=-1))


def test_text_set_with_boundary_counts_boundary_tokens_as_text(branch_store):
    ds = workbench.open_store(branch_store, model="tiny-smolvlm")
    modality = np.asarray(ds["modality"].values).astype(object).astype(str)
    assert (modality == "boundary").any()
    shares = token_shares(ds)["mlp_share"].values
    rows = (np.asarray(ds["condition"].values).astype(object).astype(str) == "baseline") & (modality != "vision")
    samples = np.asarray(ds["sample"].values).astype(object).astype(str)
    expected = np.stack([shares[rows & (samples == s)].mean(0) for s in sorted(set(samples))], axis=-1)
    got = update_decomposition(ds, text_set="text+boundary", per_sample=True)["mlp_share"].sel(
        condition="baseline", modality="text").values
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    with pytest.raises(ValueError, match="text_set"):
        update_decomposition(ds, text_set="everything")


def test_table_figure_and_cli(branch_store, tmp_path, capsys):
    table = build_tables(branch_store, ["update-decomposition"], Options(n_resamples=50))[0]
    assert not table.skipped
    for model in MODELS:  # one row per decoder layer
        depth = workbench.open_store(branch_store, model=model).sizes["decoder_layer"]
        assert [r[1] for r in table.rows if r[0] == model] == [str(l) for l in range(depth)]
    ds = workbench.open_store(branch_store, model="tiny-smolvlm")
    value = float(table.data["attn_share"].sel(model="tiny-smolvlm", modality="vision", decoder_layer=1, stat="value"))
    assert value == pytest.approx(_numpy_shares(ds, "baseline", "vision", "attn_out")[1].mean(), rel=1e-10)
    figure = branch_shares(open_models(branch_store), Options(n_resamples=50), tmp_path)
    assert figure.skipped is None and Path(figure.path).stat().st_size > 0
    assert main(["analyze", str(branch_store), "update-decomposition"]) == 0
    assert "‖a_l‖/‖h_l‖" in capsys.readouterr().out


def test_skipped_with_what_is_missing(tmp_path, workbench_cache):
    store = tmp_path / "plain.zarr"
    run_spec(parse_spec(f"""\
name: plain
models: [tiny-llama]
data: {{source: builtin, n: 1}}
conditions: {{baseline: {{}}}}
capture: [{{site: layer}}]
store: {{path: {store}}}
"""), progress=False, log=lambda _: None)
    table = build_tables(store, ["update-decomposition"])[0]
    assert table.skipped and "attn_out" in table.skipped and "mlp_out" in table.skipped


def test_shares_on_the_synthetic_store_are_its_closed_form(tmp_path):
    """The synthetic store splits every update as a_l = 0.4 u_l, m_l = 0.6 u_l: each share is that
    part of the relative update ‖u_l‖/‖h_l‖ (analyses.updates, another code path)."""
    from analyses.synthetic import ATTN_PART, DEFAULT_MODELS, write_synthetic_store
    from analyses.updates import relative_update

    model = DEFAULT_MODELS[0]
    store = write_synthetic_store(tmp_path / "syn.zarr", models=(model,), n_samples=3, alphas=(0.5,),
                                  extra_conditions=(), jitter=0.1)
    ds = workbench.open_store(store.path, model=model.model_id)
    shares = update_decomposition(ds, per_sample=True)
    relative = relative_update(ds, per_sample=True, cache=False)  # layer l >= 1: ‖u‖/‖h_(l-1)‖
    for name, part in (("attn_share", ATTN_PART), ("mlp_share", 1 - ATTN_PART)):
        for modality in ("vision", "text"):
            got = shares[name].sel(modality=modality, condition=relative.condition.values).transpose("condition", "decoder_layer", "sample").values
            expected = relative.sel(modality=modality).transpose("condition", "layer", "sample").values
            np.testing.assert_allclose(got, part * expected, rtol=1e-5)
