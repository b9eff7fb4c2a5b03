"""Definitions as spec choices (workbench.definitions): each choice changes the printed number
exactly as a numpy recomputation from the stored arrays says; a run stores the spec's choices in
the model's attrs, `analyze` reads them from there (flags override) and prints them under every
table."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy.stats import entropy

import workbench
from analyses.synthetic import DEFAULT_MODELS, write_synthetic_store
from workbench.cli import main
from workbench.definitions import DEFAULTS, describe, resolve

MODEL = DEFAULT_MODELS[0].model_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One synthetic model, every token with its own norm (text and boundary means differ)."""
    path = tmp_path_factory.mktemp("definitions") / "store.zarr"
    write_synthetic_store(path, models=DEFAULT_MODELS[:1], n_samples=4, alphas=(0.1, 1.0), jitter=0.4, seed=3)
    return path


def analyze(capsys, *argv) -> str:
    assert main(["analyze", *map(str, argv)]) == 0
    return capsys.readouterr().out


def row_values(out: str, *first: str) -> list[float]:
    """The estimates (values before their CI) of the table row starting with `first` cells."""
    return [float(v) for v in row_estimates(out, *first)]


def row_estimates(out: str, *first: str) -> list[str]:
    """The estimates of a row as printed (value before its CI)."""
    prefix = "| " + " | ".join(first) + " |"
    (line,) = [l for l in out.splitlines() if l.startswith(prefix)]
    return re.findall(r"(-?\d+\.\d+(?:e[-+]\d+)?) \[", line[len(prefix):])


def half_unit(text: str) -> float:
    """Half a unit in the last printed digit of `text` ("0.012" -> 0.0005, "7.9e-05" -> 5e-07)."""
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.split(".")[1])
    return 0.5 * 10.0 ** (-decimals + int(exponent or 0)) * (1 + 1e-9)


def flat(path):
    return workbench.open_store(path, model=MODEL, index=False).load()


def labels(ds, prefix=""):
    return {k: np.asarray(ds[prefix + k].values).astype(object).astype(str) for k in ("condition", "sample")}


def test_text_set_changes_the_norm_ratio_as_numpy_says(store, capsys):
    ds = flat(store)
    norms = np.linalg.norm(ds.hidden.sel(layer=0).values.astype(np.float64), axis=-1)
    lab = labels(ds)
    modality = np.asarray(ds.modality.values).astype(object).astype(str)

    def ratio(text_modalities):
        per_sample = []
        for sample in np.unique(lab["sample"]):
            rows = (lab["condition"] == "baseline") & (lab["sample"] == sample)
            per_sample.append(norms[rows & (modality == "vision")].mean()
                              / norms[rows & np.isin(modality, text_modalities)].mean())
        return np.mean(per_sample)

    default = analyze(capsys, store, "norm-ratio")
    both = analyze(capsys, store, "norm-ratio", "--text-set", "text+boundary")
    assert row_values(default, MODEL)[0] == pytest.approx(round(ratio(["text"]), 2), abs=1e-9)
    assert row_values(both, MODEL)[0] == pytest.approx(round(ratio(["text", "boundary"]), 2), abs=1e-9)
    assert round(ratio(["text"]), 2) != round(ratio(["text", "boundary"]), 2)  # the choice matters here
    assert "text_set = text (text tokens only" in default
    assert "text_set = text+boundary (every non-vision token" in both


def test_average_layers_changes_the_kv_cosine_as_numpy_says(store, capsys):
    ds = flat(store)
    lab, modality = labels(ds), np.asarray(ds.modality.values).astype(object).astype(str)
    position = np.asarray(ds.position.values)
    keys = ds["keys"].values.astype(np.float64)                            # (token, decoder_layer, kv)

    def cos_k(first_layer):
        per_sample = []
        for sample in np.unique(lab["sample"]):
            def rows(condition):
                where = (lab["condition"] == condition) & (lab["sample"] == sample) & (modality == "vision")
                return np.flatnonzero(where)[np.argsort(position[where])]
            a, b = keys[rows("alpha=0.1")], keys[rows("baseline")]
            cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))  # (token, layer)
            per_sample.append(cos.mean(0)[first_layer:].mean())
        return np.mean(per_sample)

    default = analyze(capsys, store, "kv-cosine")
    later = analyze(capsys, store, "kv-cosine", "--average-layers", "from_1")
    assert row_values(default, MODEL, "0.1")[0] == pytest.approx(round(cos_k(0), 3), abs=1e-9)
    assert row_values(later, MODEL, "0.1")[0] == pytest.approx(round(cos_k(1), 3), abs=1e-9)
    assert round(cos_k(0), 3) != round(cos_k(1), 3)
    assert "average_layers = from_1 (means over layers leave out decoder layer 0)" in later


def test_rank_base_changes_the_median_rank_as_numpy_says(store, capsys):
    ds = flat(store)
    lab = labels(ds, "run_")
    logprobs = ds.logprobs.values[:, 0].astype(np.float64)                 # step 0

    def median_rank(base):
        ranks = []
        for sample in np.unique(lab["sample"]):
            ref = logprobs[(lab["condition"] == "baseline") & (lab["sample"] == sample)][0]
            cond = logprobs[(lab["condition"] == "alpha=0.1") & (lab["sample"] == sample)][0]
            ranks.append((cond > cond[np.argmax(ref)]).sum() + base)
        return np.median(ranks)

    zero = analyze(capsys, store, "alpha")
    one = analyze(capsys, store, "alpha", "--rank-base", "1")
    assert row_values(zero, MODEL, "0.1")[3] == median_rank(0)
    assert row_values(one, MODEL, "0.1")[3] == median_rank(1) == median_rank(0) + 1
    assert "rank_base = 1 (the reference's top token still on top has rank 1)" in one


def test_definitions_resolve_and_refuse_unknown_choices():
    assert resolve() == DEFAULTS
    assert resolve('{"rank_base": 1}', {"text_set": None})["rank_base"] == 1
    assert resolve({"rank_base": 1}, {"rank_base": 0})["rank_base"] == 0        # a flag wins
    with pytest.raises(ValueError, match="definition text_set: got 'words'; expected one of text, text\\+boundary"):
        resolve({"text_set": "words"})
    with pytest.raises(ValueError, match="unknown definition 'base'"):
        resolve({"base": 1})
    assert describe(DEFAULTS).count(" = ") == 3


def test_analysis_section_errors_name_the_field():
    from workbench.spec import SpecError, parse_spec

    text = "name: t\nmodels: [tiny-llama]\nconditions: {baseline: {}}\ncapture: [{site: layer}]\n" \
           "store: {path: x.zarr}\nanalysis: {text_set: text_and_boundary, rank_base: 2}\n"
    with pytest.raises(SpecError) as caught:
        parse_spec(text)
    message = str(caught.value)
    assert "analysis.text_set: got 'text_and_boundary' (str)" in message and "expected one of 'text', 'text+boundary'" in message
    assert "analysis.rank_base: got 2 (int); expected one of 0, 1" in message


def test_a_run_stores_the_specs_definitions_and_analyze_prints_them(tmp_path, capsys, workbench_cache):
    """The runner writes `analysis:` into the model's attrs; analyze uses it (the number is the
    numpy one for that choice) unless a flag overrides it."""
    spec = tmp_path / "defs.yaml"
    spec.write_text(f"""\
name: defs
models: [tiny-qwen3vl]
data: {{source: builtin, n: 2}}
conditions: {{baseline: {{}}}}
capture: [{{site: layer, layers: [0]}}]
store: {{path: {tmp_path / 'defs.zarr'}}}
analysis: {{text_set: text+boundary, average_layers: from_1}}
""")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    capsys.readouterr()
    ds = workbench.open_store(tmp_path / "defs.zarr", model="tiny-qwen3vl", index=False).load()
    assert json.loads(ds.attrs["definitions"]) == {"text_set": "text+boundary", "average_layers": "from_1", "rank_base": 0}
    ds.to_netcdf(tmp_path / "defs.nc")  # the attr is a string: netCDF takes it
    norms = np.linalg.norm(ds.hidden.sel(layer=0).values.astype(np.float64), axis=-1)
    sample, modality = np.asarray(ds.sample.values).astype(object).astype(str), np.asarray(ds.modality.values).astype(object).astype(str)
    assert (modality == "boundary").any()

    def ratio(text_modalities):
        return np.mean([norms[(sample == s) & (modality == "vision")].mean()
                        / norms[(sample == s) & np.isin(modality, text_modalities)].mean() for s in np.unique(sample)])

    stored = analyze(capsys, tmp_path / "defs.zarr", "norm-ratio")
    assert "text_set = text+boundary" in stored and "average_layers = from_1" in stored and "rank_base = 0" in stored
    assert row_values(stored, "tiny-qwen3vl")[0] == pytest.approx(round(ratio(["text", "boundary"]), 2), abs=1e-9)
    flag = analyze(capsys, tmp_path / "defs.zarr", "norm-ratio", "--text-set", "text")
    assert "text_set = text (" in flag
    assert row_values(flag, "tiny-qwen3vl")[0] == pytest.approx(round(ratio(["text"]), 2), abs=1e-9)


def test_kv_substitution_reports_every_swap_condition_asked(tmp_path, capsys, workbench_cache):
    """`--swap` adds rows for other KV-swap conditions (here a keys-only and a values-only swap),
    each KL the numpy one from the stored log-probabilities; the self-swap control is ~0."""
    spec = tmp_path / "swaps.yaml"
    spec.write_text(f"""\
name: swaps
models: [tiny-smolvlm]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  self_swap: {{kv_swap: {{donor: baseline}}}}
  hybrid: {{kv_swap: {{donor: blank}}}}
  swap:
    sweep: {{p: [keys, values]}}
    kv_swap: {{donor: blank, parts: $p}}
capture: [{{site: logits}}]
store: {{path: {tmp_path / 'swaps.zarr'}}}
""")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    capsys.readouterr()
    out = analyze(capsys, tmp_path / "swaps.zarr", "kv-substitution", "--swap", "swap[p=keys]", "--swap", "swap[p=values]")
    ds = workbench.open_store(tmp_path / "swaps.zarr", model="tiny-smolvlm", index=False).load()
    lab = labels(ds, "run_")
    logprobs = ds.logprobs.values[:, 0].astype(np.float64)

    def kl(p_condition, q_condition):
        values = []
        for sample in np.unique(lab["sample"]):
            p = logprobs[(lab["condition"] == p_condition) & (lab["sample"] == sample)][0]
            q = logprobs[(lab["condition"] == q_condition) & (lab["sample"] == sample)][0]
            values.append(float(entropy(np.exp(p), np.exp(q))))    # scipy renormalizes both
        return np.mean(values)

    for condition in ("hybrid", "swap[p=keys]", "swap[p=values]"):
        printed = row_estimates(out, "tiny-smolvlm", condition)
        expected = [kl("baseline", condition), kl("blank", condition), kl("baseline", "blank")]
        for text, value in zip(printed[:3], expected):
            assert abs(float(text) - value) <= half_unit(text), (condition, text, value)
        assert abs(float(printed[3])) < 1e-6                         # the self-swap control
    assert kl("baseline", "swap[p=keys]") != pytest.approx(kl("baseline", "swap[p=values]"), rel=1e-3)
    assert main(["analyze", str(tmp_path / "swaps.zarr"), "--swap", "swap[p=key]"]) == 2
    assert "--swap[0]: no condition 'swap[p=key]'" in capsys.readouterr().err
