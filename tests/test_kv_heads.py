"""Head-resolved K/V cosines (analyses.kv.kv_cosine_heads_per_sample, table `kv-heads`): each KV
head's cos(K′,K) and cos(V′,V) against the reference, recomputed with numpy from the stored
arrays and the model config's head count."""

from __future__ import annotations

import numpy as np
import pytest

import workbench
from analyses import kv
from analyses.streaming import as_str
from analyses.tables import Options, build_tables, sweep_conditions
from workbench.models.model import model_info
from workbench.runner import run_spec
from workbench.spec import parse_spec


@pytest.fixture(scope="module")
def store(tmp_path_factory, workbench_cache):
    path = tmp_path_factory.mktemp("kvheads") / "kv.zarr"
    run_spec(parse_spec(f"""\
name: kv-heads
models: [tiny-qwen3vl]
data: {{source: builtin, n: 3}}
conditions:
  baseline: {{}}
  alpha: {{sweep: {{alpha: [0.1, 3.0]}}, interventions: [{{kind: scale, site: projector, positions: vision, factor: $alpha}}]}}
capture: [{{site: keys}}, {{site: values}}]
store: {{path: {path}}}
"""), progress=False, log=lambda _: None)
    return path


def numpy_reference(ds, condition: str, name: str, heads: int) -> np.ndarray:
    """(sample, layer, head): mean over vision tokens of the per-head cosine with the baseline."""
    out = []
    conditions, samples, modality = (as_str(ds[k].values) for k in ("condition", "sample", "modality"))
    for sample in sorted(set(samples)):
        def rows(c):
            return ds[name].values[(conditions == c) & (samples == sample) & (modality == "vision")]
        a, b = rows(condition), rows("baseline")
        a = a.reshape(*a.shape[:2], heads, -1).astype(np.float64)
        b = b.reshape(*b.shape[:2], heads, -1).astype(np.float64)
        cos = (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
        out.append(cos.mean(0))
    return np.stack(out)


def test_head_cosines_equal_numpy_on_the_stored_arrays(store):
    ds = workbench.open_store(store, model="tiny-qwen3vl")
    heads = model_info("tiny-qwen3vl").kv_heads
    assert int(ds.attrs["kv_heads"]) == heads and heads > 1
    got = kv.kv_cosine_heads_per_sample(ds, cache=False).sel(modality="vision")
    for condition in ("alpha[alpha=0.1]", "alpha[alpha=3.0]"):
        for short, name in (("k", "keys"), ("v", "values")):
            expected = numpy_reference(ds, condition, name, heads)
            np.testing.assert_allclose(got[f"cos_{short}"].sel(condition=condition)
                                       .transpose("sample", "decoder_layer", "kv_head").values, expected, atol=1e-6)
    same = got["cos_k"].sel(condition="baseline")
    np.testing.assert_allclose(same.values, 1.0, atol=1e-6)  # the reference against itself


def test_kv_heads_table_is_the_head_mean_and_the_lowest_head(store):
    ds = workbench.open_store(store, model="tiny-qwen3vl")
    heads = model_info("tiny-qwen3vl").kv_heads
    table = build_tables(str(store), ["kv-heads"], Options(n_resamples=200))[0]
    conditions = [c for c, _, _ in sweep_conditions(ds, "alpha")]
    assert not table.skipped and len(table.rows) == len(conditions) == 2
    for row, condition in zip(table.rows, conditions):
        expected = numpy_reference(ds, condition, "keys", heads).mean(1)     # (sample, head): layers averaged
        assert row[2].value == pytest.approx(expected.mean(), abs=1e-6)
        assert row[3].startswith(f"head {int(expected.mean(0).argmin())}:")
