"""What a reader of a store reaches for: readable labels beside the ids, the xarray idioms of the
README, tidy rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import workbench
from workbench.cli import main

SPEC = """\
name: ergonomics
models: [tiny-qwen3vl]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  alpha:
    sweep: {{alpha: [0.5, 2.0]}}
    interventions: [{{kind: scale, site: projector, factor: $alpha, positions: vision}}]
capture: [{{site: layer, layers: [0, 1]}}, {{site: logits}}]
generate: {{max_new_tokens: 3}}
store: {{path: {store}}}
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory, workbench_cache):
    folder = tmp_path_factory.mktemp("ergonomics")
    path = folder / "store.zarr"
    (folder / "spec.yaml").write_text(SPEC.format(store=path))
    assert main(["run", str(folder / "spec.yaml"), "--no-progress", "--no-table"]) == 0
    return path


def test_readable_labels_are_stored(store, load_tiny):
    from workbench.data import builtin_samples

    ds = workbench.open_store(store, model="tiny-qwen3vl")
    tokenizer = load_tiny("tiny-qwen3vl").tokenizer
    ids = ds.token_id.values
    assert [str(t) for t in ds.token_text.values] == [tokenizer.decode([int(i)]) for i in ids]
    samples = {s.id: s for s in builtin_samples(2)}
    for sample, question, category, answer in zip(ds.run_sample.values, ds.run_question.values,
                                                  ds.run_category.values, ds.run_answer.values):
        s = samples[str(sample)]
        assert (str(question), str(category), str(answer)) == (s.question, s.category, s.answer)
    first = ds.sel(condition="baseline", sample=str(ds.run_sample.values[0]))
    assert str(ds.run_prompt.values[0]) == tokenizer.decode([int(i) for i in first.token_id.values])
    generated = ds.generated.values  # (run, step) greedy ids
    assert [str(t) for t in ds.run_generated_text.values] == [tokenizer.decode([int(i) for i in g]) for g in generated]


def test_xarray_idioms(store, tmp_path):
    ds = workbench.open_store(store, model="tiny-qwen3vl")
    conditions = np.array([str(c) for c in ds.condition.values])
    picked = ds.isel(token=ds.condition.isin(["baseline", "alpha[alpha=0.5]"]).values)
    assert set(str(c) for c in picked.condition.values) == {"baseline", "alpha[alpha=0.5]"}
    assert picked.sizes["token"] == int(np.isin(conditions, ["baseline", "alpha[alpha=0.5]"]).sum())
    ranged = ds.isel(token=((ds.alpha >= 0) & (ds.alpha <= 1)).values)
    assert set(str(c) for c in ranged.condition.values) == {"alpha[alpha=0.5]"}

    flat = workbench.open_store(store, model="tiny-qwen3vl", index=False)
    means = flat.hidden.sel(layer=0).groupby(["condition", "modality"]).mean()
    vision = flat.hidden.sel(layer=0).values[(conditions == "baseline") & (flat.modality.values == "vision")]
    np.testing.assert_allclose(means.sel(condition="baseline", modality="vision").values, vision.mean(0), rtol=1e-5)
    assert set(str(c) for c in flat.query(token="alpha < 1").condition.values) == {"alpha[alpha=0.5]"}
    flat.to_netcdf(tmp_path / "copy.nc")
    flat.chunk(token=64, run=64).to_zarr(tmp_path / "copy.zarr", mode="w")
    back = xr.open_zarr(tmp_path / "copy.zarr").load()
    np.testing.assert_array_equal(back.hidden.values, flat.hidden.values)


def test_tidy_rows_match_an_independent_computation(store):
    ds = workbench.open_store(store, model="tiny-qwen3vl")
    rows = workbench.to_dataframe(ds, "hidden")
    assert isinstance(rows, pd.DataFrame) and len(rows) == ds.sizes["token"] * ds.sizes["layer"]
    assert {"condition", "alpha", "sample", "position", "modality", "token_text", "layer", "norm",
            "run_question", "run_category"} <= set(rows.columns)
    norms = np.linalg.norm(ds.hidden.values.astype(np.float64), axis=-1)  # (token, layer)
    np.testing.assert_allclose(rows["norm"].values, norms.reshape(-1), rtol=1e-6)
    assert rows.groupby(["condition", "modality", "layer"]).norm.mean().notna().all()
