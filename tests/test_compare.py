"""The `compare` analysis: every condition against a reference, each metric checked against an
independent numpy/scipy computation from the raw stored arrays of a synthetic store with custom
conditions; a store with `logprobs` alone; the report naming every condition; and one run of a
tiny model with custom conditions and a sweep, end to end through the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from scipy.special import log_softmax, rel_entr

import workbench
from analyses import bootstrap, compare, tables
from analyses.report import write_report
from analyses.synthetic import DEFAULT_MODELS, answer_is_right, answer_token, write_synthetic_store
from workbench.cli import main

CUSTOM = ("blank", "none", "zero_vis_L2", "patch_blank_L1")
N_SAMPLES = 4
BOOT = {"n_resamples": 200, "seed": 3}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Every variable, α sweep and custom condition names; tokens with their own norms (jitter)."""
    path = tmp_path_factory.mktemp("compare") / "custom.zarr"
    write_synthetic_store(path, n_samples=N_SAMPLES, alphas=(0.1, 1.0), extra_conditions=CUSTOM, jitter=0.3, seed=5,
                          variables=("hidden", "logprobs", "generated"))
    return path


@pytest.fixture(scope="module")
def logprobs_only(tmp_path_factory):
    path = tmp_path_factory.mktemp("compare") / "logprobs.zarr"
    write_synthetic_store(path, models=DEFAULT_MODELS[:1], n_samples=3, alphas=(0.1, 3.0),
                          extra_conditions=("patch_blank_L1",), variables=("logprobs",))
    return path


def run_rows(ds) -> dict[tuple[str, str], int]:
    cond = np.asarray(ds["run_condition"].values).astype(object).astype(str)
    sample = np.asarray(ds["run_sample"].values).astype(object).astype(str)
    return {(c, s): i for i, (c, s) in enumerate(zip(cond, sample))}


def check_ci(per_sample: np.ndarray, summary, stat: str = "mean") -> None:
    """The summary's value and CI are those of the independently computed per-sample values."""
    expected = bootstrap.bootstrap_array(per_sample, stat, **BOOT)
    np.testing.assert_allclose(summary.values, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("model", [m.model_id for m in DEFAULT_MODELS])
def test_output_metrics_match_scipy_at_every_step(store, model):
    ds = workbench.open_store(store, model=model)
    logprobs = ds["logprobs"].values.astype(np.float64)
    rows = run_rows(ds)
    samples = sorted({s for _, s in rows})
    got = compare.output_metrics(ds, "baseline", per_sample=True, cache=False)
    summary = compare.output_metrics(ds, "baseline", cache=False, **BOOT)
    assert summary.attrs["kl_direction"] == "KL(baseline ‖ condition)"
    conditions = sorted({c for c, _ in rows})
    assert sorted(got.condition.values.tolist()) == conditions
    for condition in conditions:
        expect = {k: np.full((len(samples), logprobs.shape[1]), np.nan) for k in ("kl", "rank", "agree")}
        for i, sample in enumerate(samples):
            for step in range(logprobs.shape[1]):
                p = log_softmax(logprobs[rows["baseline", sample], step])
                q = log_softmax(logprobs[rows[condition, sample], step])
                expect["kl"][i, step] = rel_entr(np.exp(p), np.exp(q)).sum()
                expect["rank"][i, step] = (q > q[np.argmax(p)]).sum()
                expect["agree"][i, step] = float(np.argmax(q) == np.argmax(p))
        for name, values in expect.items():
            np.testing.assert_allclose(got[name].sel(condition=condition).transpose("sample", "step"), values,
                                       rtol=1e-6, atol=1e-9, err_msg=f"{condition} {name}")
            check_ci(values.T, summary[name].sel(condition=condition), "median" if name == "rank" else "mean")
    assert float(summary["kl"].sel(condition="alpha=1.0", step=0, stat="value")) == pytest.approx(0, abs=1e-12)
    # another reference: the direction follows it
    other = compare.output_metrics(ds, "alpha=0.1", per_sample=True, cache=False)
    p, q = (log_softmax(logprobs[rows[c, samples[1]], 1]) for c in ("alpha=0.1", "baseline"))
    assert float(other["kl"].sel(condition="baseline", sample=samples[1], step=1)) == \
        pytest.approx(rel_entr(np.exp(p), np.exp(q)).sum(), rel=1e-6)


@pytest.mark.parametrize("model", [m.model_id for m in DEFAULT_MODELS])
def test_answer_logprob_delta_and_accuracy_match_numpy(store, model):
    ds = workbench.open_store(store, model=model)
    vocab = next(m.vocab for m in DEFAULT_MODELS if m.model_id == model)
    logprobs = ds["logprobs"].values.astype(np.float64)
    rows = run_rows(ds)
    samples = sorted({s for _, s in rows})
    got = compare.answer_logprob_delta(ds, "baseline", per_sample=True)
    summary = compare.answer_logprob_delta(ds, "baseline", **BOOT)
    accuracy = compare.accuracy_metrics(ds, "baseline", per_sample=True)
    for condition in sorted({c for c, _ in rows}):
        expected = []
        for i, sample in enumerate(samples):
            token = answer_token(int(sample.split("/")[1]), vocab)
            at = [log_softmax(logprobs[rows[c, sample], 0])[token] for c in (condition, "baseline")]
            expected.append(at[0] - at[1])
        np.testing.assert_allclose(got.sel(condition=condition, sample=samples), expected, rtol=1e-6, atol=1e-9)
        check_ci(np.array(expected), summary.sel(condition=condition))
        right = np.array([answer_is_right(int(s.split("/")[1]), condition) for s in samples], float)
        base = np.array([answer_is_right(int(s.split("/")[1]), "baseline") for s in samples], float)
        np.testing.assert_array_equal(accuracy["accuracy"].sel(condition=condition, sample=samples), right)
        np.testing.assert_array_equal(accuracy["accuracy_delta"].sel(condition=condition, sample=samples), right - base)


def independent_hidden(ds, condition: str, reference: str) -> pd.DataFrame:
    """Per (sample, modality, layer): the mean over paired tokens of ‖h_c‖/‖h_r‖ and cos(h_c, h_r),
    pairing by (sample, position) where the whole sample's token sequence matches."""
    frame = pd.DataFrame({n: np.asarray(ds[n].values).astype(object).astype(str) for n in ("condition", "sample", "modality")})
    frame["position"], frame["token_id"] = np.asarray(ds["position"].values), np.asarray(ds["token_id"].values)
    frame["row"] = np.arange(len(frame))
    hidden = ds["hidden"].values.astype(np.float64)
    out = []
    for sample in sorted(set(frame["sample"])):
        c = frame[(frame.condition == condition) & (frame["sample"] == sample)].sort_values("position")
        r = frame[(frame.condition == reference) & (frame["sample"] == sample)].sort_values("position")
        if len(c) != len(r) or (c.token_id.values != r.token_id.values).any() or (c.modality.values != r.modality.values).any():
            continue
        for modality in sorted(set(c.modality)):
            hc = hidden[c.row.values[c.modality.values == modality]]
            hr = hidden[r.row.values[r.modality.values == modality]]
            for layer in range(hidden.shape[1]):
                a, b = hc[:, layer], hr[:, layer]
                ratio = np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
                with np.errstate(invalid="ignore"):   # a zeroed row has no direction: NaN, as in compare
                    cos = [np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)) for x, y in zip(a, b)]
                out.append((sample, modality, layer, ratio.mean(), np.mean(cos)))
    return pd.DataFrame(out, columns=["sample", "modality", "layer", "norm_ratio", "cos"])


@pytest.mark.parametrize("model", [m.model_id for m in DEFAULT_MODELS])
def test_hidden_norm_ratio_and_cosine_are_paired_by_token(store, model):
    ds = workbench.open_store(store, model=model)
    got = compare.hidden_metrics(ds, "baseline", per_sample=True, cache=False)
    summary = compare.hidden_metrics(ds, "baseline", cache=False, **BOOT)
    for condition in got.condition.values.tolist():
        expected = independent_hidden(ds, condition, "baseline")
        if condition == "none":   # the image removed: no sample holds the same token sequence
            assert expected.empty and np.isnan(got["norm_ratio"].sel(condition=condition)).all()
            continue
        assert len(expected)
        for row in expected.itertuples():
            at = dict(condition=condition, sample=row.sample, modality=row.modality, layer=row.layer)
            assert float(got["norm_ratio"].sel(at)) == pytest.approx(row.norm_ratio, rel=1e-6)
            assert float(got["cos"].sel(at)) == pytest.approx(row.cos, rel=1e-6, abs=1e-9)
        vision = expected[(expected.modality == "vision") & (expected.layer == 2)].set_index("sample")
        per_sample = vision.reindex(got.sample.values)
        check_ci(per_sample["norm_ratio"].values, summary["norm_ratio"].sel(condition=condition, modality="vision",
                                                                             layer=2))
    # the reference against itself: ratio 1, cosine 1
    np.testing.assert_allclose(got[["norm_ratio", "cos"]].sel(condition="baseline").to_array().values[
        np.isfinite(got[["norm_ratio", "cos"]].sel(condition="baseline").to_array().values)], 1.0, rtol=1e-6)


def section(report: str, heading: str) -> str:
    return report.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_table_and_report_name_every_condition(store, tmp_path, capsys):
    conditions = ["alpha=0.1", "alpha=1.0", *CUSTOM]
    opts = tables.Options(n_resamples=50)
    (table,) = tables.build_tables(store, ["compare"], opts)
    assert table.columns[2] == "KL(baseline ‖ condition), step 0" and not table.skipped
    for model in (m.model_id for m in DEFAULT_MODELS):
        ds = workbench.open_store(store, model=model)
        held = set(np.asarray(ds["run_condition"].values).astype(object).astype(str)) - {"baseline"}
        named = [row[1] for row in table.rows if row[0] == model]
        assert named[0] == "baseline (reference)" and sorted(named[1:]) == sorted(held) and len(named) == len(held) + 1
        reference = next(row for row in table.rows if row[:2] == [model, "baseline (reference)"])
        assert str(reference[2]) == "0.000 [0.000, 0.000]" and str(reference[8]) == "1.00 [1.00, 1.00]"  # KL, accuracy
    assert {row[1] for row in table.rows} == {"baseline (reference)", *conditions}
    path = write_report(store, tmp_path / "report", opts)
    report = path.read_text()
    body = section(report, "Every condition against the reference")
    for condition in conditions:
        assert re.search(rf"^\| [^|]+ \| {re.escape(condition)} \|", body, re.M), condition
    assert "](compare_curves.png)" in body and (tmp_path / "report" / "compare_curves.png").stat().st_size > 10_000
    # --reference names another condition: the direction and the rows follow it
    assert main(["analyze", str(store), "compare", "--reference", "blank", "--resamples", "20"]) == 0
    out = capsys.readouterr().out
    assert "### Every condition against blank" in out and "KL(blank ‖ condition)" in out
    assert re.search(r"^\| syn/a-small \| baseline \|", out, re.M) and not re.search(r"^\| syn/a-small \| blank \|", out, re.M)


def test_a_store_with_logprobs_alone_gets_the_output_metrics(logprobs_only, capsys):
    assert main(["analyze", str(logprobs_only), "compare", "alpha", "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    compared = out.split("### Every condition against baseline", 1)[1].split("###", 1)[0]
    row = next(line for line in compared.splitlines() if "| patch_blank_L1 |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert re.match(r"\d+\.\d+ \[", cells[2]) and cells[5] != "n/a"      # KL and agreement
    assert cells[7:14] == ["n/a"] * 7                                     # answer, accuracy, hidden
    assert "residual-stream norm ratio and cosine not computed: needs hidden (a `layer` capture)" in compared
    assert "accuracy not computed: needs run_response" in compared
    assert "Δ log-prob of the answer not computed: needs run_answer_ids (the answer's token ids" in compared
    # `alpha` runs its logit KL and rank (it needed decode_attention and hidden before)
    alpha = out.split("### Scaling the projector output by alpha", 1)[1]
    assert "skipped" not in alpha.split("\n\n", 2)[0]
    rows = [line for line in alpha.splitlines() if line.startswith("| syn/a-small |")]
    assert len(rows) == 2 and all(re.search(r"\| n/a \| n/a \| \d+\.\d+ \[", r) for r in rows)
    assert "attention kl needs decode_attention" in alpha


# -- end to end on a tiny model ------------------------------------------------------------------

SPEC = """\
name: compare-e2e
models: [tiny-qwen3vl]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  zero_vis_L2: {{interventions: [{{kind: zero, site: layer, layers: [2], positions: vision}}]}}
  patch_blank_L1: {{interventions: [{{kind: patch, site: layer, layers: [1], positions: vision, from: blank}}]}}
  c:
    sweep: {{c: [0.5, 2.0]}}
    interventions: [{{kind: scale, site: projector, factor: $c, positions: vision}}]
capture: [{{site: layer}}, {{site: logits}}]
generate: {{max_new_tokens: 2}}
store: {{path: {store}}}
"""


@pytest.mark.slow
def test_tiny_model_with_custom_conditions_end_to_end(tmp_path, capsys, load_tiny):
    store = tmp_path / "custom.zarr"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(store=store))
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    model = "tiny-qwen3vl"
    ds = workbench.open_store(store, model=model)
    held = sorted(set(np.asarray(ds["run_condition"].values).astype(object).astype(str)))
    assert len(held) == 6 and {"zero_vis_L2", "patch_blank_L1"} <= set(held)
    # the answer's tokens, as the model's tokenizer gives them
    tokenizer = load_tiny(model).tokenizer
    for answer, ids in zip(ds["run_answer"].values, ds["run_answer_ids"].values):
        assert json.loads(str(ids)) == tokenizer.encode(str(answer), add_special_tokens=False)
    # each metric against numpy on the raw arrays
    rows = run_rows(ds)
    logprobs = ds["logprobs"].values.astype(np.float64)
    out = compare.output_metrics(ds, "baseline", per_sample=True, cache=False)
    delta = compare.answer_logprob_delta(ds, "baseline", per_sample=True)
    hidden = compare.hidden_metrics(ds, "baseline", per_sample=True, cache=False)
    for condition in held:
        for sample in out.sample.values.tolist():
            for step in range(logprobs.shape[1]):
                p, q = (log_softmax(logprobs[rows[c, sample], step]) for c in ("baseline", condition))
                assert float(out["kl"].sel(condition=condition, sample=sample, step=step)) == \
                    pytest.approx(rel_entr(np.exp(p), np.exp(q)).sum(), rel=1e-5, abs=1e-9)
                assert float(out["agree"].sel(condition=condition, sample=sample, step=step)) == (np.argmax(p) == np.argmax(q))
            token = json.loads(str(ds["run_answer_ids"].values[rows["baseline", sample]]))[0]
            p, q = (log_softmax(logprobs[rows[c, sample], 0]) for c in ("baseline", condition))
            assert float(delta.sel(condition=condition, sample=sample)) == pytest.approx(q[token] - p[token], abs=1e-6)
        expected = independent_hidden(ds, condition, "baseline")
        for row in expected.itertuples():
            at = dict(condition=condition, sample=row.sample, modality=row.modality, layer=row.layer)
            assert float(hidden["norm_ratio"].sel(at)) == pytest.approx(row.norm_ratio, rel=1e-5, nan_ok=True)
    # the vision rows zeroed at layer 2: ratio 0 there, no direction (NaN cosine); untouched before it
    zeroed = hidden.sel(condition="zero_vis_L2", modality="vision")
    assert (zeroed["norm_ratio"].sel(layer=2) == 0).all() and zeroed["cos"].sel(layer=2).isnull().all()
    np.testing.assert_allclose(hidden["norm_ratio"].sel(condition="zero_vis_L2", layer=[0, 1]).dropna("sample", how="all"),
                               1.0, rtol=1e-6)
    # the CLI: compare and report name every condition; alpha over the sweep `c` runs
    assert main(["analyze", str(store), "compare", "--resamples", "50"]) == 0
    printed = capsys.readouterr().out
    for condition in held:
        if condition != "baseline":
            assert re.search(rf"^\| {model} \| {re.escape(condition)} \| \d", printed, re.M), condition
    assert main(["analyze", str(store), "alpha", "--sweep", "c", "--resamples", "50"]) == 0
    printed = capsys.readouterr().out
    assert "skipped" not in printed and len(re.findall(rf"^\| {model} \| (0.5|2) ", printed, re.M)) == 2
    assert main(["report", str(store), "--out", str(tmp_path / "report"), "--resamples", "50"]) == 0
    body = section((tmp_path / "report" / "report.md").read_text(), "Every condition against the reference")
    for condition in held:
        if condition != "baseline":
            assert f"| {condition} |" in body
