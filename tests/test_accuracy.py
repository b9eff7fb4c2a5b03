"""Task accuracy: eval_mode from the data to the store, the scorer per mode, the `accuracy` table
against an independent recomputation, and specs/accuracy_alpha.yaml offline on the tiny models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import workbench
from analyses import accuracy
from analyses.builtin.accuracy import accuracy_table, accuracy_vs_alpha
from analyses.tables import Options, build_tables
from workbench.cli import main
from workbench.data import BUILTIN_EVAL_MODES, DatBenchError, SampleFileError, builtin_samples, jsonl_samples
from workbench.definitions import EVAL_MODES
from workbench.spec import DATBENCH_CONFIGS, load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"
MODELS = ("tiny-smolvlm", "tiny-qwen3vl")

# (response, answer, eval_mode, expected score): each mode right and wrong
CASES = [
    # exact: case, whitespace, edge punctuation, first non-empty line
    ("Red.", "red", "exact", 1.0),
    ("  the   Circle ", "the circle", "exact", 1.0),
    ("\n\nblue\nred", "Blue", "exact", 1.0),
    ('"square"', "square", "exact", 1.0),
    ("red circle", "red", "exact", 0.0),
    ("", "red", "exact", 0.0),
    # choice: a leading option letter in any of its forms
    ("B", "B", "choice", 1.0),
    ("(b) a red circle", "B", "choice", 1.0),
    ("B. red", "(B)", "choice", 1.0),
    ("Answer: c", "C", "choice", 1.0),
    ("The answer is (D).", "D", "choice", 1.0),
    ("[a]", "A", "choice", 1.0),
    ("A", "B", "choice", 0.0),
    ("a cat", "A", "choice", 0.0),          # a word, not a letter set off
    ("because", "B", "choice", 0.0),
    # numeric: first number, commas, number words, relative tolerance
    ("3", "3", "numeric", 1.0),
    ("There are 3 circles.", "3", "numeric", 1.0),
    ("three", "3", "numeric", 1.0),
    ("1,234", "1234", "numeric", 1.0),
    ("-2.5", "-2.5", "numeric", 1.0),
    ("100.5", "100", "numeric", 1.0),       # within 1 %
    ("102", "100", "numeric", 0.0),         # 2 % off
    ("2.5", "-2.5", "numeric", 0.0),
    ("4 or 3", "3", "numeric", 0.0),        # the first number counts
    ("none", "3", "numeric", 0.0),
    # direct (DatBench) and no mode resolve by the answer's form
    ("(C)", "C", "direct", 1.0),
    ("D", "C", "direct", 0.0),
    ("7 apples", "7", "direct", 1.0),
    ("seven", "8", "direct", 0.0),
    ("Paris.", "paris", "direct", 1.0),
    ("London", "paris", "", 0.0),
    ("B", "(B)", "", 1.0),
]


@pytest.mark.parametrize("response,answer,mode,expected", CASES)
def test_scorer_on_hand_written_cases(response, answer, mode, expected):
    assert accuracy.score(response, answer, mode) == expected


def test_judge_items_and_missing_answers_are_not_scored():
    assert math.isnan(accuracy.score("anything", "yes", "judge"))
    assert math.isnan(accuracy.score("anything", "  ", "exact"))
    assert [accuracy.resolved_mode(a, "direct") for a in ("B", "(c)", "12", "1,000", "cat", "b2")] == \
        ["choice", "choice", "numeric", "numeric", "exact", "exact"]


def test_any_accepted_answer_counts():
    assert accuracy.score_any("Paris.", ["the capital", "paris"], "exact") == 1.0
    assert accuracy.score_any("Lyon", ["the capital", "paris"], "exact") == 0.0
    assert accuracy.score_any("4", ["four", "4.0"], "numeric") == 1.0
    assert math.isnan(accuracy.score_any("x", [], "exact"))
    assert math.isnan(accuracy.score_any("x", ["a", "b"], "judge"))


def test_bad_modes_and_answers_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"eval_mode: got 'fuzzy'; expected one of exact, choice"):
        accuracy.score("a", "a", "fuzzy")
    with pytest.raises(ValueError, match=r"eval_mode numeric: the answer 'many' holds no number"):
        accuracy.score("3", "many", "numeric")


def test_builtin_samples_carry_a_mode_their_answer_scores_under():
    samples = builtin_samples(8)
    assert {s.category: s.eval_mode for s in samples} == BUILTIN_EVAL_MODES
    for s in samples:
        assert s.eval_mode in EVAL_MODES and s.answer
        assert accuracy.score(f"{s.answer.upper()}.", s.answer, s.eval_mode) == 1.0
        assert accuracy.score("purple hexagon", s.answer, s.eval_mode) == 0.0
    counting = next(s for s in samples if s.category == "counting")
    words = ["zero", "one", "two", "three", "four"]
    assert accuracy.score(f"I count {words[int(counting.answer)]}", counting.answer, counting.eval_mode) == 1.0


def test_jsonl_eval_mode_is_read_and_checked(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"id": "a", "image": None, "question": "Q?", "answer": "B", "eval_mode": "Choice"})
                    + "\n" + json.dumps({"id": "b", "image": None, "question": "Q?"}) + "\n")
    assert [s.eval_mode for s in jsonl_samples(good, 5)] == ["choice", None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "image": None, "question": "Q?", "eval_mode": "fuzzy"}) + "\n")
    with pytest.raises(SampleFileError, match=r"bad.jsonl:1: eval_mode: got 'fuzzy'; expected one of exact"):
        jsonl_samples(bad, 5)


# -- the shipped spec, offline ------------------------------------------------------------------


def test_spec_names_the_study_models_datbench_and_the_alpha_sweep():
    spec = load_spec(SPECS / "accuracy_alpha.yaml")
    sweep = load_spec(SPECS / "alpha_sweep.yaml")
    assert spec.models == sweep.models == ["HuggingFaceTB/SmolVLM2-2.2B-Instruct", "Qwen/Qwen3-VL-2B-Instruct"]
    assert (spec.data.source, spec.data.n, spec.data.exclude) == ("datbench", 10, ["math"])
    assert spec.generate.max_new_tokens == 16
    assert {c.site for c in spec.capture} >= {"logits"}
    assert spec.model_dump()["conditions"] == sweep.model_dump()["conditions"]


@pytest.fixture(scope="module")
def spec_store(tmp_path_factory, workbench_cache):
    store = tmp_path_factory.mktemp("accuracy") / "accuracy_alpha.zarr"
    argv = ["run", str(SPECS / "accuracy_alpha.yaml"), "--models", ",".join(MODELS), "--data", "builtin",
            "--limit", "2", "--store", str(store), "--no-progress", "--no-table"]
    assert main(argv) == 0
    return store


def _rescored(ds) -> dict[str, float]:
    """Accuracy per condition straight from the stored texts: the mean score of its runs."""
    scores: dict[str, list[float]] = {}
    for condition, text, answer, mode in zip(ds.run_condition.values, ds.run_response.values, ds.run_answer.values,
                                             ds.run_eval_mode.values):
        scores.setdefault(str(condition), []).append(accuracy.score(str(text), str(answer), str(mode)))
    return {c: float(np.nanmean(v)) for c, v in scores.items()}


def test_spec_runs_offline_and_the_table_is_the_rescored_texts(spec_store, load_tiny):
    (table,) = build_tables(spec_store, ["accuracy"])
    assert table.skipped is None
    for model in MODELS:
        ds = workbench.open_store(spec_store, model=model)
        assert ds.sizes["run"] == 2 * 9 and (ds.run_eval_mode.values != "").all()
        # run_response: the greedy ids, cut before the first special token, decoded
        tokenizer = load_tiny(model).tokenizer
        for ids, response in zip(ds.generated.values, ds.run_response.values):
            ids = [int(i) for i in ids]
            cut = next((k for k, i in enumerate(ids) if i in set(tokenizer.all_special_ids)), len(ids))
            assert response == tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
        assert ds.generated.shape[1] == 16
        expected = _rescored(ds)
        got = table.data["accuracy"].sel(model=model, stat="value")
        for condition, value in expected.items():
            assert float(got.sel(condition=condition)) == pytest.approx(value)
    rows = [r for r in table.rows if r[1] == "scale[alpha=0.1]"]
    assert [r[2] for r in rows] == ["0.1", "0.1"]


def _constructed(ds, seed: int = 1):
    """The store's runs with responses written to be right or wrong in the forms each mode accepts."""
    rng = np.random.default_rng(seed)
    right = {"numeric": "There are {} of them.", "exact": "{}.", "choice": "({}) because", "": "{}"}
    texts = []
    for answer, mode in zip(ds.run_answer.values, ds.run_eval_mode.values):
        texts.append(right[str(mode)].format(str(answer).upper()) if rng.random() < 0.5 else "no idea")
    return ds.assign_coords(run_response=("run", np.array(texts, dtype=object)))


def test_table_matches_a_numpy_bootstrap_on_constructed_responses(spec_store):
    opened = {m: _constructed(workbench.open_store(spec_store, model=m), seed=i) for i, m in enumerate(MODELS)}
    options = Options(n_resamples=200, seed=3)
    table = accuracy_table(opened, options)
    for model, ds in opened.items():
        conditions = [str(c) for c in ds.run_condition.values]
        samples = sorted(set(str(s) for s in ds.run_sample.values))
        right = np.array([t != "no idea" for t in ds.run_response.values], dtype=float)
        category = {str(s): str(c) for s, c in zip(ds.run_sample.values, ds.run_category.values)}
        for condition in sorted(set(conditions)):
            by_sample = {str(s): right[i] for i, s in enumerate(ds.run_sample.values) if conditions[i] == condition}
            values = np.array([by_sample[s] for s in samples])
            boot = values[np.random.default_rng(3).integers(0, len(values), size=(200, len(values)))].mean(1)
            got = table.data["accuracy"].sel(model=model, condition=condition)
            np.testing.assert_allclose(got.values, [values.mean(), *np.percentile(boot, [2.5, 97.5])])
            for cat in set(category.values()):
                in_cat = np.array([by_sample[s] for s in samples if category[s] == cat])
                cat_got = table.data["accuracy_by_category"].sel(model=model, condition=condition, category=cat)
                assert float(cat_got.sel(stat="value")) == pytest.approx(in_cat.mean())
    assert any(0 < float(v) < 1 for v in table.data["accuracy"].sel(stat="value").values.ravel())


def test_figure_draws_accuracy_against_alpha(spec_store, tmp_path):
    opened = {m: _constructed(workbench.open_store(spec_store, model=m)) for m in MODELS}
    figure = accuracy_vs_alpha(opened, Options(n_resamples=50), tmp_path)
    assert figure.skipped is None and figure.path.stat().st_size > 10_000


def test_a_store_without_responses_skips_the_table_saying_why(spec_store):
    ds = workbench.open_store(spec_store, model="tiny-qwen3vl").drop_vars("run_response")
    table = accuracy_table({"tiny-qwen3vl": ds}, Options())
    assert table.skipped and "run_response (a `logits` capture" in table.skipped


# -- DatBench's eval_mode, stored and resumed ----------------------------------------------------

# the fixtures `saved_copy` and `source_rows` (conftest.py): a DatBench-shaped copy


def test_datbench_eval_mode_is_stored_and_survives_a_resume(saved_copy, source_rows, tmp_path):
    spec = tmp_path / "datbench.yaml"
    keep = ["chart", "counting"]
    exclude = [c for c in DATBENCH_CONFIGS if c not in keep]
    spec.write_text(f"""name: datbench-accuracy
models: [tiny-qwen3vl]
data: {{source: datbench, path: {saved_copy}, n: 3, exclude: {exclude}}}
conditions: {{baseline: {{}}}}
capture: [{{site: logits}}]
generate: {{max_new_tokens: 2}}
store: {{path: {tmp_path / 'store.zarr'}}}
""")
    run = ["run", str(spec), "--no-progress", "--no-table"]
    assert main([*run, "--limit", "2"]) == 0                      # two per config
    first = workbench.open_store(tmp_path / "store.zarr", model="tiny-qwen3vl")
    assert first.sizes["run"] == 4
    assert main(run) == 0                                          # resumes with the rest
    ds = workbench.open_store(tmp_path / "store.zarr", model="tiny-qwen3vl")
    assert ds.sizes["run"] == 6 and {str(s).split("/")[1] for s in ds.run_sample.values} == set(keep)
    for sample, mode, answer, every in zip(ds.run_sample.values, ds.run_eval_mode.values, ds.run_answer.values,
                                           ds.run_all_answers.values):
        row = source_rows[str(sample)]
        assert (mode, answer, json.loads(str(every))) == (row["eval_mode"], row["answer"], row["all_answers"])
    assert set(ds.run_eval_mode.values) == {"direct", "judge"}
    modes = dict(zip(ds.run_sample.values, ds.run_eval_mode.values))
    assert dict(zip(first.run_sample.values, first.run_eval_mode.values)).items() <= modes.items()
    scores = accuracy.run_scores(ds)
    judged = [str(s) for s, m in zip(ds.run_sample.values, ds.run_eval_mode.values) if m == "judge"]
    assert np.isnan(scores["score"].sel(sample=judged)).all()
    assert int(accuracy.accuracy(ds)["unscored"]) == len(judged)


def test_datbench_bad_eval_mode_is_refused_naming_row_and_field(tmp_path):
    datasets = pytest.importorskip("datasets")
    from support.datbench import config_dataset
    from workbench.data import datbench_samples

    ds = config_dataset("chart").map(lambda row, i: {"eval_mode": "fuzzy" if i == 0 else row["eval_mode"]},
                                      with_indices=True)
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "chart"))
    with pytest.raises(DatBenchError, match=r"row 0 \('chart_0000'\) eval_mode: got 'fuzzy'; expected one of exact"):
        datbench_samples(15, path=tmp_path, exclude=[c for c in DATBENCH_CONFIGS if c != "chart"])


def test_synthetic_store_accuracy_is_its_construction(tmp_path):
    from analyses.synthetic import DEFAULT_MODELS, answer_is_right, write_synthetic_store

    store = write_synthetic_store(tmp_path / "syn.zarr", models=DEFAULT_MODELS[:1], n_samples=6)
    (table,) = build_tables(store.path, ["accuracy"], Options(n_resamples=100))
    got = table.data["accuracy"].sel(stat="value").isel(model=0)
    for condition in store.conditions:
        expected = np.mean([answer_is_right(i, condition) for i in range(6)])
        assert float(got.sel(condition=condition)) == pytest.approx(expected), condition
    by_category = table.data["accuracy_by_category"].sel(stat="value", condition="alpha=3.0").isel(model=0)
    assert (float(by_category.sel(category="counting")), float(by_category.sel(category="color"))) == (1.0, 0.0)


def test_runs_stored_before_the_labels_existed_are_left_unscored(tmp_path):
    from analyses.synthetic import DEFAULT_MODELS, answer_is_right, write_synthetic_store

    path = tmp_path / "mixed.zarr"
    write_synthetic_store(path, models=DEFAULT_MODELS[:1], n_samples=2, variables=("logprobs",))   # no labels
    write_synthetic_store(path, models=DEFAULT_MODELS[:1], n_samples=2, first_sample=2,
                          variables=("logprobs", "generated"))
    ds = workbench.open_store(path, model=DEFAULT_MODELS[0].model_id)
    assert sorted(str(v) for v in set(ds.run_all_answers.values)) == ["", "[]"]
    scores = accuracy.run_scores(ds)["score"]
    assert np.isnan(scores.sel(sample=["synthetic/000", "synthetic/001"])).all()
    result = accuracy.accuracy(ds)["accuracy"].sel(condition="alpha=3.0")
    assert int(result.n_samples) == 2
    assert float(result.sel(stat="value")) == np.mean([answer_is_right(i, "alpha=3.0") for i in (2, 3)])
