"""The `patching` analysis on a synthetic store whose scan has known effects (`analyses.synthetic`:
each run moves the blank run's log-probabilities w(l, pos) of the way to the baseline's), checked
against numpy: the normalized effect of a logit difference is exactly w; the KL and the answer's
log-prob against their own numpy computation; the CLI's table and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyses.bootstrap import resample_indices
from analyses.commands import main as analyses_main
from analyses.patching import normalized_effect, patching_effects, scan_runs
from analyses.synthetic import SCAN_POSITIONS, SyntheticModel, scan_weight, write_synthetic_store
from analyses.tables import open_models

MODEL = SyntheticModel("syn/scan", n_layers=3, dim=8, heads=2, kv=4, vocab=24, ratio=10.0)
LAYERS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_synthetic_store(tmp_path_factory.mktemp("scan") / "scan.zarr", models=(MODEL,), n_samples=4,
                                 alphas=(1.0,), scan_layers=LAYERS).path


@pytest.fixture(scope="module")
def ds(store):
    return open_models(store)[MODEL.model_id]


def test_the_scan_runs_are_read_from_the_store(ds):
    runs = scan_runs(ds)
    assert len(runs) == len(LAYERS) * len(SCAN_POSITIONS)
    assert {(r.base, r.donor, r.site, r.direction, r.scan) for r in runs} == {
        ("blank", "baseline", "layer", "denoising", "trace")}


def test_logit_difference_effect_is_the_construction_weight(ds):
    data = patching_effects(ds, "logit_diff", (3, 7), n_resamples=50)
    for layer in LAYERS:
        for position in SCAN_POSITIONS:
            got = float(data.effect.sel(scan="trace", direction="denoising", layer=layer, position=position,
                                        stat="value"))
            assert got == pytest.approx(scan_weight(layer, position, MODEL.n_layers), abs=1e-4)
    assert list(data.position.values) == ["vision", "text", "last"]


def _text(labels):
    return np.asarray(labels.values).astype(object).astype(str)


def _stored(ds, condition):
    rows = np.flatnonzero(_text(ds["run_condition"]) == condition)
    samples = _text(ds["run_sample"])[rows]
    return np.asarray(ds["logprobs"].values)[rows[np.argsort(samples)], 0].astype(np.float64)


def test_kl_and_answer_effects_match_numpy(ds):
    base, donor = _stored(ds, "blank"), _stored(ds, "baseline")
    run = _stored(ds, "trace[l=2,pos=text]")

    def kl(p, q):
        p, q = p - np.log(np.exp(p).sum(-1, keepdims=True)), q - np.log(np.exp(q).sum(-1, keepdims=True))
        return (np.exp(p) * (p - q)).sum(-1)

    want = kl(base, run).mean() / kl(base, donor).mean()
    data = patching_effects(ds, "kl", n_resamples=200, seed=3)
    cell = data.effect.sel(scan="trace", direction="denoising", layer=2, position="text")
    assert float(cell.sel(stat="value")) == pytest.approx(want, rel=1e-4)
    # the CI: the same ratio over numpy's own resamples of the samples
    idx = resample_indices(4, 200, 3)
    boot = [kl(base[i], run[i]).mean() / kl(base[i], donor[i]).mean() for i in idx]
    low, high = np.percentile(boot, [2.5, 97.5])
    assert float(cell.sel(stat="ci_low")) == pytest.approx(low, rel=1e-4)
    assert float(cell.sel(stat="ci_high")) == pytest.approx(high, rel=1e-4)
    # the answer's first token: its log-prob under the run, the base and the donor
    rows = np.flatnonzero(_text(ds["run_condition"]) == "blank")
    order = np.argsort(_text(ds["run_sample"])[rows])
    ids = np.array([json.loads(t)[0] for t in _text(ds["run_answer_ids"])[rows][order]])
    pick = lambda lp: lp[np.arange(len(ids)), ids]
    want = (pick(run).mean() - pick(base).mean()) / (pick(donor).mean() - pick(base).mean())
    answer = patching_effects(ds, "answer_logprob", n_resamples=20)
    got = answer.effect.sel(scan="trace", direction="denoising", layer=2, position="text", stat="value")
    assert float(got) == pytest.approx(want, rel=1e-4)


def test_normalized_effect_is_zero_at_the_base_and_one_at_the_donor():
    rng = np.random.default_rng(0)
    base, donor = rng.normal(size=6), rng.normal(size=6) + 3
    out = normalized_effect(np.stack([base, donor, np.full(6, np.nan)]), base, donor, n_resamples=50)
    np.testing.assert_allclose(out[0], 0, atol=1e-12)
    np.testing.assert_allclose(out[1], 1, atol=1e-12)
    assert np.isnan(out[2]).all()


def test_the_cli_prints_the_table_and_refuses_a_logit_difference_without_tokens(store, capsys):
    assert analyses_main(["analyze", str(store), "patching", "--metric", "logit_diff", "--tokens", "3,7",
                          "--resamples", "20"]) == 0
    out = capsys.readouterr().out
    assert "Patching scans: effect on ln p(3) − ln p(7)" in out
    assert "| syn/scan | trace (layer) | denoising: blank ← baseline | 2 | text | 0.67" in out
    assert analyses_main(["analyze", str(store), "patching", "--metric", "logit_diff"]) == 2
    assert "--tokens: --metric logit_diff needs two token ids" in capsys.readouterr().err


def test_a_scan_over_heads_gives_a_layer_by_head_grid(tmp_path, capsys):
    """Each head's run moves the blank run w(l, pos) · head_share(h) of the way: its normalized
    logit-difference effect is exactly that; the table names the head; a figure of layer x head."""
    from analyses.builtin.patching import patching_heads
    from analyses.synthetic import head_share
    from analyses.tables import Options

    path = write_synthetic_store(tmp_path / "heads.zarr", models=(MODEL,), n_samples=3, alphas=(1.0,),
                                 scan_layers=(0, 2), scan_heads=(0, 1)).path
    models = open_models(path)
    ds = models[MODEL.model_id]
    assert {r.head for r in scan_runs(ds)} == {None, 0, 1}
    data = patching_effects(ds, "logit_diff", (3, 7), n_resamples=20, per_head=True)
    assert data.effect.dims == ("scan", "direction", "layer", "head", "position", "stat")
    assert list(data["head"].values) == [0, 1] and list(data.scan.values) == ["heads"]
    for layer in (0, 2):
        for head in (0, 1):
            for position in ("vision", "last"):
                got = float(data.effect.sel(scan="heads", direction="denoising", layer=layer, head=head,
                                            position=position, stat="value"))
                want = scan_weight(layer, position, MODEL.n_layers) * head_share(head, MODEL.heads)
                assert got == pytest.approx(want, abs=1e-4)
    # the scans over positions alone keep their own grid, without the head runs
    assert "head" not in patching_effects(ds, "logit_diff", (3, 7), n_resamples=20).dims
    assert analyses_main(["analyze", str(path), "patching", "--metric", "logit_diff", "--tokens", "3,7",
                          "--resamples", "20"]) == 0
    out = capsys.readouterr().out
    want = scan_weight(2, "vision", MODEL.n_layers) * head_share(1, MODEL.heads)
    assert f"| syn/scan | heads (attn_heads, head 1) | denoising: blank ← baseline | 2 | vision | {want:.2f}" in out
    figure = patching_heads(models, Options(n_resamples=20, metric="logit_diff", tokens=(3, 7)), tmp_path)
    assert figure.skipped is None and figure.path.exists()
    panel = figure.figure.axes[0]
    assert panel.get_ylabel() == "head" and "layer" in panel.get_xlabel()
    np.testing.assert_allclose(np.asarray(panel.images[0].get_array()),
                               data.effect.sel(scan="heads", direction="denoising", position=panel.get_title()
                                               .rpartition("positions ")[2], stat="value").transpose("head", "layer"),
                               atol=1e-12)
