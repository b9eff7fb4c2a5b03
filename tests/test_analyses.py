"""Every metric of `analyses` against closed-form answers of the synthetic store and against an
independent numpy/scipy computation from the raw stored arrays."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import cosine as cosine_distance
from scipy.special import rel_entr
from scipy.stats import entropy, pearsonr

import workbench
from analyses import attention, bootstrap, correlation, kv, logits, norms, rotation, streaming, updates
from analyses.residual import METRICS, residual_geometry
from analyses.synthetic import DEFAULT_MODELS, TOP_RANK_AT_0_1, sample_factor, synthetic_store_once, write_synthetic_store

MODELS = {m.model_id: m for m in DEFAULT_MODELS}
FULL = [m.model_id for m in DEFAULT_MODELS if m.captures is None]      # models that stored every variable
ALPHAS = (0.1, 1.0, 3.0)
N_SAMPLES = 3


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """The shared synthetic store (written once per session, see test_analyses_cli.py too)."""
    return synthetic_store_once(tmp_path_factory.getbasetemp() / "analyses-synthetic.zarr", n_samples=N_SAMPLES).path


@pytest.fixture(scope="module")
def jitter_store(tmp_path_factory):
    """Every token with its own norm: means over tokens and samples are not shortcuts."""
    path = tmp_path_factory.mktemp("jitter") / "jitter.zarr"
    write_synthetic_store(path, models=DEFAULT_MODELS[:1], n_samples=5, alphas=(0.1,), extra_conditions=("none",),
                          variables=("hidden",), jitter=0.4, seed=7)
    return path


_OPENED: dict = {}


def open_ds(path, model):
    """A plain open (no analysis cache involved), once per store and model: tests only read."""
    if (path, model) not in _OPENED:
        _OPENED[(path, model)] = workbench.open_store(path, model=model)
    return _OPENED[(path, model)]


def labels(ds) -> pd.DataFrame:
    return pd.DataFrame({name: np.asarray(ds[name].values).astype(object).astype(str)
                         for name in ("condition", "sample", "modality")}).assign(
        position=np.asarray(ds["position"].values), token_id=np.asarray(ds["token_id"].values))


def value(estimate, **sel):
    return float(estimate.sel(stat="value", **sel))


# -- residual stream: closed forms -----------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_norm_ratio_is_the_constructed_ratio_and_scales_with_alpha(store, model):
    ds = open_ds(store, model)
    truth = MODELS[model]
    ratio = norms.vision_text_ratio(ds)
    assert value(ratio, condition="baseline") == pytest.approx(truth.ratio, rel=1e-5)
    for alpha in ALPHAS:
        assert value(ratio, condition=f"alpha={alpha}") == pytest.approx(alpha * truth.ratio, rel=1e-5)
    per_layer = norms.vision_text_ratio(ds, layer=None).sel(condition="baseline", stat="value")
    layers = np.arange(truth.n_layers + 1)
    np.testing.assert_allclose(per_layer.values, truth.norm("vision", layers) / truth.norm("text", layers), rtol=1e-5)
    # the post-run summary (one layer, pandas) agrees
    assert norms.norm_ratio(ds)["baseline"] == pytest.approx(truth.ratio, rel=1e-5)


@pytest.mark.parametrize("model", MODELS)
def test_norms_updates_and_rotation_have_their_closed_forms(store, model):
    ds = open_ds(store, model)
    m = MODELS[model]
    layers = np.arange(m.n_layers + 1)
    mean_c = np.mean([sample_factor(i) for i in range(N_SAMPLES)])
    norm = norms.norm_curves(ds).sel(condition="baseline", stat="value")
    absolute = updates.absolute_update(ds).sel(condition="baseline", stat="value")
    relative = updates.relative_update(ds).sel(condition="baseline", stat="value")
    cos0 = rotation.cosine_to_first(ds).sel(condition="baseline", stat="value")
    cos_prev = rotation.cosine_to_previous(ds).sel(condition="baseline", stat="value")
    for modality in ("vision", "boundary", "text"):
        n, c = m.norm(modality, layers), m.cos(modality, layers)
        dtheta = np.arccos(c[1:]) - np.arccos(c[:-1])
        step = np.sqrt(n[1:] ** 2 + n[:-1] ** 2 - 2 * n[1:] * n[:-1] * np.cos(dtheta))
        np.testing.assert_allclose(norm.sel(modality=modality).values, mean_c * n, rtol=1e-5)
        np.testing.assert_allclose(cos0.sel(modality=modality).values, c, atol=1e-5)
        np.testing.assert_allclose(absolute.sel(modality=modality).values, mean_c * step, rtol=1e-4)
        np.testing.assert_allclose(relative.sel(modality=modality).values, step / n[:-1], rtol=1e-4)
        np.testing.assert_allclose(cos_prev.sel(modality=modality).values, np.cos(dtheta), atol=1e-5)
    assert list(relative.layer.values) == list(layers[1:])   # u_1 = h_1 - h_0 is labelled layer 1
    # the study's first-update table: ‖u₁‖/‖h₀‖ and cos(h₁,h₀), vision vs text
    assert relative.sel(modality="vision", layer=1) < 1 < relative.sel(modality="text", layer=1)
    assert cos0.sel(modality="vision", layer=1) == pytest.approx(np.cos(0.25), abs=1e-5)
    assert cos0.sel(modality="text", layer=1) == pytest.approx(np.cos(1.4), abs=1e-5)


def _independent_geometry(ds) -> dict[tuple[str, str, str], np.ndarray]:
    """Per (condition, sample, modality): (metric, layer) token means, from raw arrays and scipy."""
    frame = labels(ds)
    hidden = ds["hidden"].values.astype(np.float64)
    out = {}
    for key, rows in frame.groupby(["condition", "sample", "modality"]).indices.items():
        x = hidden[rows]                                             # (tokens, layer, dim)
        n_layers = x.shape[1]
        per_token = np.full((len(rows), 5, n_layers), np.nan)
        for t in range(len(rows)):
            for layer in range(n_layers):
                h = x[t, layer]
                per_token[t, 0, layer] = np.linalg.norm(h)
                per_token[t, 3, layer] = 1 - cosine_distance(h, x[t, 0])
                if layer:
                    u = h - x[t, layer - 1]
                    per_token[t, 1, layer] = np.linalg.norm(u)
                    per_token[t, 2, layer] = np.linalg.norm(u) / np.linalg.norm(x[t, layer - 1])
                    per_token[t, 4, layer] = 1 - cosine_distance(h, x[t, layer - 1])
        out[key] = per_token.mean(0)
    return out


def test_residual_geometry_matches_an_independent_computation(jitter_store):
    ds = open_ds(jitter_store, DEFAULT_MODELS[0].model_id)
    geometry = residual_geometry(ds)
    expected = _independent_geometry(ds)
    for (condition, sample, modality), means in expected.items():
        got = geometry.sel(condition=condition, sample=sample, modality=modality)
        for i, metric in enumerate(METRICS):
            np.testing.assert_allclose(got[metric].values, means[i], rtol=1e-5, atol=1e-7, err_msg=metric)
    # groups with no tokens (no vision under `none`) are NaN, not 0
    assert np.isnan(geometry["norm"].sel(condition="none", modality="vision")).all()
    # the ratio averages per-sample ratios: each sample weighs the same
    per_sample = {s: expected[("baseline", s, "vision")][0, 0] / expected[("baseline", s, "text")][0, 0]
                  for s in geometry.sample.values}
    assert value(norms.vision_text_ratio(ds), condition="baseline") == pytest.approx(np.mean(list(per_sample.values())))
    # mean over samples of per-sample token means
    curve = norms.norm_curves(ds).sel(condition="baseline", modality="text", stat="value").values
    np.testing.assert_allclose(curve, np.mean([expected[("baseline", s, "text")][0] for s in per_sample], 0), rtol=1e-6)


def test_block_size_does_not_change_results(jitter_store, monkeypatch):
    """Blocks of one row (of a Dataset rechunked to 16 rows), and a numpy-backed Dataset, give the
    numbers of the default blocks."""
    ds = open_ds(jitter_store, DEFAULT_MODELS[0].model_id)
    big = residual_geometry(ds, cache=False)
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 1)
    small = residual_geometry(ds.chunk({"token": 16}), cache=False)
    loaded = residual_geometry(ds.copy().load(), cache=False)
    for other in (small, loaded):
        for metric in METRICS:
            np.testing.assert_allclose(other[metric].values, big[metric].values, rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("block_bytes", [1, 600, 1 << 30])
def test_group_sums_match_numpy_for_any_rows_and_blocks(monkeypatch, block_bytes):
    """Sums per group over rows picked in any order from an irregularly chunked array."""
    import dask.array as dask_array

    monkeypatch.setattr(streaming, "BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(120, 3, 4))
    x[7, 1, 2] = np.nan                                      # a missing value is skipped
    data = dask_array.from_array(x, chunks=((50, 13, 57), (2, 1), (4,)))
    rows = rng.permutation(120)[:90]
    codes = rng.integers(0, 5, size=90)
    lazy = streaming.group_sums(lambda c, a, b: (a * b).sum(-1), [streaming.take_rows(data, rows),
                                                               streaming.take_rows(data, np.sort(rows))], codes, 5, 3)
    sums, counts = lazy.compute()
    values = (x[rows] * x[np.sort(rows)]).sum(-1)
    for g in range(5):
        picked = values[codes == g]
        np.testing.assert_allclose(sums[g], np.nansum(picked, 0), rtol=1e-12)
        np.testing.assert_array_equal(counts[g], (~np.isnan(picked)).sum(0))
    mapped = streaming.row_map(lambda a: a[:, :, 0], [streaming.take_rows(data, rows)], 3).compute()
    np.testing.assert_array_equal(mapped, x[rows, :, 0])


# -- correlations of text curves --------------------------------------------------------------


@pytest.mark.parametrize("model", FULL)
def test_text_curve_correlation_matches_scipy(store, model):
    ds = open_ds(store, model)
    frame = labels(ds)
    hidden = ds["hidden"].values.astype(np.float64)
    r = correlation.text_curve_correlation(ds, "baseline", ["blank", "none"], per_sample=True)
    for other in ("blank", "none"):
        for sample in r.sample.values:
            curves = {}
            for condition in ("baseline", other):
                rows = frame.index[(frame.condition == condition) & (frame["sample"] == sample) & (frame.modality == "text")]
                x = hidden[rows]
                norm = np.linalg.norm(x, axis=-1)
                cos = (x * x[:, :1]).sum(-1) / (norm * norm[:, :1])
                curves[condition] = (norm.mean(0), cos.mean(0))
            for i, metric in enumerate(("norm", "cosine")):
                expected = pearsonr(curves["baseline"][i], curves[other][i]).statistic
                assert float(r[metric].sel(condition=other, sample=sample)) == pytest.approx(expected, abs=1e-6)
    summary = correlation.text_curve_correlation(ds, "baseline", ["blank", "none"])
    # blank text curves are the baseline's times a per-sample constant: r = 1 exactly
    assert value(summary["norm"], condition="blank") == pytest.approx(1.0, abs=1e-9)
    assert value(summary["norm"], condition="none") < 0.999
    # default `others`: every unswept condition but the reference
    assert set(correlation.text_curve_correlation(ds).condition.values) == {"blank", "none", "hybrid"}


# -- attention --------------------------------------------------------------------------------


def _by_sample(frame, condition):
    """Row numbers (into the whole token dim) of each sample of `condition`."""
    sub = frame[frame.condition == condition]
    return {s: sub.index.values[i] for s, i in sub.groupby("sample").indices.items()}


@pytest.mark.parametrize("model", FULL)
def test_prefill_and_decode_vision_mass_match_numpy(store, model):
    ds = open_ds(store, model)
    frame = labels(ds)
    prefill = ds["prefill_vision_mass"].values.astype(np.float64)   # (token, layer, head)
    decode = ds["decode_attention"].values.astype(np.float64)        # (token, step, layer, head)
    got_prefill = attention.prefill_vision_mass(ds, "text", per_sample=True)
    got_decode = attention.decode_attention_mass(ds)["mass"]
    for condition in ("baseline", "alpha=0.1", "blank", "none"):
        for sample, rows in _by_sample(frame, condition).items():
            text = rows[frame.modality.values[rows] == "text"]
            vision = rows[frame.modality.values[rows] == "vision"]
            np.testing.assert_allclose(got_prefill.sel(condition=condition, sample=sample).values,
                                       prefill[text].mean(-1).mean(0), rtol=1e-6)
            expected = decode[vision].sum(0).mean(-1) if len(vision) else np.full(decode.shape[1:3], np.nan)
            np.testing.assert_allclose(got_decode.sel(condition=condition, sample=sample).values, expected,
                                       rtol=1e-6, equal_nan=True)
    # by construction α = 3 moves half the non-vision mass onto vision keys (per head, so the
    # head mean moves the same way)
    base = got_decode.sel(condition="baseline")
    np.testing.assert_allclose(got_decode.sel(condition="alpha=3.0"), base + (1 - base) / 2, rtol=1e-5)
    mean_steps = attention.decode_vision_mass(ds, per_sample=True).sel(condition="baseline")
    np.testing.assert_allclose(mean_steps.values, base.mean("step").values)


@pytest.mark.parametrize("model", MODELS)
def test_attention_kl_matches_scipy_and_is_zero_when_vision_attention_is_only_rescaled(store, model):
    ds = open_ds(store, model)
    frame = labels(ds)
    decode = ds["decode_attention"].values.astype(np.float64)
    step = 0
    got = attention.attention_kl_per_sample(ds, "baseline", step)["kl"]
    ref_rows = _by_sample(frame, "baseline")
    for condition in ("alpha=0.1", "alpha=3.0", "blank", "hybrid"):
        if condition not in set(frame.condition):
            continue
        for sample, rows in _by_sample(frame, condition).items():
            v = rows[frame.modality.values[rows] == "vision"]
            rv = ref_rows[sample][frame.modality.values[ref_rows[sample]] == "vision"]
            for layer in range(decode.shape[2]):
                heads = [entropy(decode[rv, step, layer, h], decode[v, step, layer, h])  # normalizes both
                         for h in range(decode.shape[3])]
                assert float(got.sel(condition=condition, sample=sample).isel(decoder_layer=layer)) == \
                    pytest.approx(np.mean(heads), rel=1e-5, abs=1e-9)
    table = attention.vision_attention_kl(ds)
    assert value(table, condition="alpha=3.0") == pytest.approx(0, abs=1e-9)
    assert value(table, condition="alpha=1.0") == pytest.approx(0, abs=1e-12)
    assert value(table, condition="alpha=0.1") > 0.1
    if "none" in table.condition.values:
        assert np.isnan(value(table, condition="none"))  # no vision tokens to compare
    per_layer = attention.vision_attention_kl(ds, per_layer=True, per_sample=True)
    np.testing.assert_allclose(per_layer.mean("decoder_layer"), attention.vision_attention_kl(ds, per_sample=True))


# -- logits -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_logit_kl_and_rank_match_scipy_and_the_construction(store, model):
    ds = open_ds(store, model)
    logprobs = ds["logprobs"].values.astype(np.float64)
    run_condition = np.asarray(ds["run_condition"].values).astype(object).astype(str)
    run_sample = np.asarray(ds["run_sample"].values).astype(object).astype(str)
    row = {(c, s): i for i, (c, s) in enumerate(zip(run_condition, run_sample))}
    kl = logits.logit_kl(ds, per_sample=True)
    rank = logits.median_rank(ds, per_sample=True)
    for condition in set(run_condition):
        for sample in set(run_sample):
            p, q = np.exp(logprobs[row[("baseline", sample)], 0]), np.exp(logprobs[row[(condition, sample)], 0])
            expected = rel_entr(p / p.sum(), q / q.sum()).sum()
            assert float(kl.sel(condition=condition, sample=sample)) == pytest.approx(expected, rel=1e-5, abs=1e-9)
            top = np.argmax(p)
            assert float(rank.sel(condition=condition, sample=sample)) == (q > q[top]).sum()
    # α = 0.1 was built to push the baseline's top token to rank TOP_RANK_AT_0_1; α = 1 is the baseline
    assert (rank.sel(condition="alpha=0.1") == TOP_RANK_AT_0_1).all()
    assert value(logits.median_rank(ds), condition="alpha=0.1") == TOP_RANK_AT_0_1
    assert value(logits.logit_kl(ds), condition="alpha=1.0") == pytest.approx(0, abs=1e-12)
    assert value(logits.median_rank(ds), condition="baseline") == 0
    # another reference and step
    kl_3 = logits.logit_kl(ds, "alpha=3.0", step=1, per_sample=True)
    p, q = np.exp(logprobs[row[("alpha=3.0", "synthetic/002")], 1]), np.exp(logprobs[row[("alpha=0.1", "synthetic/002")], 1])
    assert float(kl_3.sel(condition="alpha=0.1", sample="synthetic/002")) == pytest.approx(rel_entr(p, q).sum(), rel=1e-4)


# -- KV cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", FULL)
def test_kv_cosines_have_the_constructed_angles_and_match_scipy(store, model):
    ds = open_ds(store, model)
    m = MODELS[model]
    layers = np.arange(m.n_layers)
    per_layer = kv.kv_cosine(ds, per_layer=True).sel(stat="value")
    for alpha in ALPHAS:
        np.testing.assert_allclose(per_layer["cos_k"].sel(condition=f"alpha={alpha}"), m.kcos(alpha, layers), atol=1e-5)
        np.testing.assert_allclose(per_layer["cos_v"].sel(condition=f"alpha={alpha}"), m.vcos(alpha, layers), atol=1e-5)
    table = kv.kv_cosine(ds)
    assert value(table["cos_k"], condition="alpha=0.1") == pytest.approx(m.kcos(0.1, layers).mean(), abs=1e-5)
    assert value(table["cos_v"], condition="alpha=0.1") < value(table["cos_k"], condition="alpha=0.1")
    # text rows are untouched; `none` has other positions: never paired with the baseline
    text = kv.kv_cosine(ds, modality="text").sel(stat="value")
    assert float(text["cos_k"].sel(condition="alpha=0.1")) == pytest.approx(1, abs=1e-6)
    assert np.isnan(float(table["cos_k"].sel(condition="none", stat="value")))
    # independent: scipy cosine per token, mean over tokens, then layers, then samples
    frame = labels(ds)
    keys = ds["keys"].values.astype(np.float64)
    ref = _by_sample(frame, "baseline")
    per_sample = []
    for sample, rows in _by_sample(frame, "blank").items():
        v, rv = rows[frame.modality.values[rows] == "vision"], ref[sample][frame.modality.values[ref[sample]] == "vision"]
        per_sample.append(np.mean([[1 - cosine_distance(keys[a, l], keys[b, l]) for a, b in zip(v, rv)]
                                   for l in layers]))
    assert value(table["cos_k"], condition="blank") == pytest.approx(np.mean(per_sample), abs=1e-6)


@pytest.mark.parametrize("model", FULL)
def test_kv_substitution_matches_scipy(store, model):
    ds = open_ds(store, model)
    logprobs = ds["logprobs"].values.astype(np.float64)
    run_condition = np.asarray(ds["run_condition"].values).astype(object).astype(str)
    run_sample = np.asarray(ds["run_sample"].values).astype(object).astype(str)
    row = {(c, s): i for i, (c, s) in enumerate(zip(run_condition, run_sample))}
    got = kv.kv_substitution(ds, per_sample=True)
    for sample in got.sample.values:
        z = {c: np.exp(logprobs[row[(c, sample)], 0]) for c in ("baseline", "blank", "hybrid")}
        assert float(got["kl_real_hybrid"].sel(sample=sample)) == pytest.approx(entropy(z["baseline"], z["hybrid"]), rel=1e-5)
        assert float(got["kl_blank_hybrid"].sel(sample=sample)) == pytest.approx(entropy(z["blank"], z["hybrid"]), rel=1e-5)
        # the scale the two hybrid KLs are read against: the whole image replaced
        assert float(got["kl_real_blank"].sel(sample=sample)) == pytest.approx(entropy(z["baseline"], z["blank"]), rel=1e-5)
    assert "kl_real_self" not in got  # the synthetic store holds no self-swap control
    summary = kv.kv_substitution(ds)
    assert value(summary["kl_real_hybrid"]) == pytest.approx(float(got["kl_real_hybrid"].mean()))
    with pytest.raises(LookupError, match="missing: other"):
        kv.kv_substitution(ds, hybrid="other")


# -- bootstrap --------------------------------------------------------------------------------


def test_bootstrap_matches_a_direct_resampling_loop():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(2, 3, 9))
    values[1, 2, 4] = np.nan                                   # a sample without a value
    out = bootstrap.bootstrap_array(values, n_resamples=500, seed=11)
    idx = np.random.default_rng(11).integers(0, 9, size=(500, 9))
    for i in range(2):
        for j in range(3):
            v = values[i, j]
            boot = [np.nanmean(v[k]) for k in idx]
            assert out[i, j, 0] == pytest.approx(np.nanmean(v))
            np.testing.assert_allclose(out[i, j, 1:], np.percentile(boot, [2.5, 97.5]), rtol=1e-12)
    med = bootstrap.bootstrap_array(values[0, 0], stat="median", n_resamples=500, seed=11)
    np.testing.assert_allclose(med[1:], np.percentile([np.median(values[0, 0][k]) for k in idx], [2.5, 97.5]))
    assert med[0] == np.median(values[0, 0])


def test_summarize_labels_and_counts():
    import xarray as xr

    da = xr.DataArray([[1.0, 2.0, 3.0, np.nan], [5.0, 5.0, 5.0, 5.0]], dims=("condition", "sample"),
                      coords={"condition": ["a", "b"], "alpha": ("condition", [0.1, np.nan])})
    s = bootstrap.summarize(da)
    assert s.dims == ("condition", "stat") and list(s.stat.values) == ["value", "ci_low", "ci_high"]
    assert s.n_samples.values.tolist() == [3, 4] and "alpha" in s.coords
    assert float(s.sel(condition="a", stat="value")) == 2.0
    assert s.sel(condition="b").values.tolist() == [5.0, 5.0, 5.0]
    lo, hi = float(s.sel(condition="a", stat="ci_low")), float(s.sel(condition="a", stat="ci_high"))
    assert 1.0 <= lo <= 2.0 <= hi <= 3.0
    # the same seed gives the same interval
    assert bootstrap.summarize(da).identical(s)
