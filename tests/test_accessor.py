"""`ds.wb` (workbench/accessor.py) on a real store: each selection is checked against masks built
with numpy on the same store opened without an index, and the norms against numpy's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import workbench

MODEL = "tiny-qwen3vl"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stored(tmp_path_factory, workbench_cache):
    store = tmp_path_factory.mktemp("accessor") / "s.zarr"
    spec = {"name": "accessor", "models": [MODEL], "data": {"source": "builtin", "n": 3},
            "conditions": {"baseline": {}, "alpha": {"sweep": {"alpha": [0.5, 1.0, 2.0]},
                                                     "interventions": [{"kind": "scale", "site": "projector",
                                                                        "factor": "$alpha", "positions": "vision"}]}},
            "capture": [{"site": "layer", "layers": "all"}, {"site": "logits"}], "store": {"path": str(store)}}
    ds = workbench.run(spec, progress=False)
    ds.attrs["store_path"] = str(store)
    return ds, workbench.open_store(store, MODEL, index=False)


def token_rows(flat, mask):
    return flat.hidden.values[np.flatnonzero(mask)]


def run_rows(flat, mask):
    return flat.logprobs.values[np.flatnonzero(mask)]


def test_a_range_narrows_hidden_and_logprobs_alike(stored):
    ds, flat = stored
    picked = ds.wb.sel(alpha=slice(0, 1))
    alpha, run_alpha = flat.alpha.values, flat.run_alpha.values
    np.testing.assert_array_equal(picked.hidden.values, token_rows(flat, (alpha >= 0) & (alpha <= 1)))
    np.testing.assert_array_equal(picked.logprobs.values, run_rows(flat, (run_alpha >= 0) & (run_alpha <= 1)))
    assert set(picked.condition.values) == set(picked.run_condition.values) == {"alpha[alpha=0.5]", "alpha[alpha=1.0]"}
    assert ds.sel(condition="baseline").sizes["run"] == ds.sizes["run"]  # what plain .sel does: runs untouched


def test_one_value_a_list_and_other_dims_at_once(stored):
    ds, flat = stored
    picked = ds.wb.sel(condition=["baseline", "alpha[alpha=2.0]"], modality="vision", layer=[0, 2])
    tokens = np.isin(flat.condition.values, ["baseline", "alpha[alpha=2.0]"]) & (flat.modality.values == "vision")
    np.testing.assert_array_equal(picked.hidden.values, token_rows(flat, tokens)[:, [0, 2]])
    np.testing.assert_array_equal(picked.logprobs.values,
                                  run_rows(flat, np.isin(flat.run_condition.values, ["baseline", "alpha[alpha=2.0]"])))
    one = ds.wb.sel(condition="baseline", sample="builtin/counting/000")
    runs = (flat.run_condition.values == "baseline") & (flat.run_sample.values == "builtin/counting/000")
    assert one.sizes["run"] == runs.sum() == 1
    np.testing.assert_array_equal(one.logprobs.values, run_rows(flat, runs))
    tokens = (flat.condition.values == "baseline") & (flat.sample.values == "builtin/counting/000")
    np.testing.assert_array_equal(one.hidden.values, token_rows(flat, tokens))
    assert one.wb.sel(layer=1).hidden.dims == ("token", "dim")  # a plain dim, as .sel gives it


def test_a_label_only_runs_carry_narrows_the_tokens_to_those_runs(stored):
    ds, flat = stored
    category = str(flat.run_category.values[0])
    picked = ds.wb.sel(category=category, condition="alpha[alpha=0.5]")
    runs = (flat.run_category.values == category) & (flat.run_condition.values == "alpha[alpha=0.5]")
    kept = set(zip(flat.run_condition.values[runs].tolist(), flat.run_sample.values[runs].tolist()))
    tokens = np.array([(c, s) in kept for c, s in zip(flat.condition.values.tolist(), flat.sample.values.tolist())])
    assert 0 < runs.sum() < ds.sizes["run"] and tokens.any()
    np.testing.assert_array_equal(picked.hidden.values, token_rows(flat, tokens))
    np.testing.assert_array_equal(picked.logprobs.values, run_rows(flat, runs))


def test_norms_per_layer_and_modality_match_numpy(stored):
    ds, flat = stored
    norms = ds.wb.norms()
    assert norms.dims == ("condition", "modality", "layer")
    every = np.linalg.norm(flat.hidden.values.astype(np.float64), axis=-1)  # (token, layer)
    for condition in ("baseline", "alpha[alpha=2.0]"):
        for modality in ("vision", "text"):
            rows = (flat.condition.values == condition) & (flat.modality.values == modality)
            np.testing.assert_allclose(norms.sel(condition=condition, modality=modality).values,
                                       every[rows].mean(axis=0), rtol=1e-6)


def test_tidy_frames(stored):
    ds, flat = stored
    frame = ds.wb.sel(modality="vision").wb.frame()
    assert len(frame) == (flat.modality.values == "vision").sum() * ds.sizes["layer"]
    assert {"condition", "alpha", "sample", "layer", "norm", "run_question"} <= set(frame.columns)
    runs = ds.wb.runs()
    assert len(runs) == ds.sizes["run"]
    assert list(runs.condition) == flat.run_condition.values.tolist()
    np.testing.assert_array_equal(runs.n_tokens.values, flat.n_tokens.values)


def test_what_no_dim_carries_and_values_no_row_holds_are_named(stored):
    ds, _ = stored
    with pytest.raises(KeyError, match="conditon: no dim of this Dataset carries it; expected one of .*condition"):
        ds.wb.sel(conditon="baseline")
    with pytest.raises(KeyError, match=r"condition: got 'basline'; no row holds it \(held: .*'baseline'"):
        ds.wb.sel(condition="basline")
    assert ds.wb.sel(alpha=slice(5, 9)).sizes["token"] == 0  # a range may hold nothing, as in .sel



BLOCK_TORCH = """
import sys

class NoTorch:  # a read-side install: torch, nnsight and transformers are absent
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "nnsight", "transformers"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")

sys.meta_path.insert(0, NoTorch())
"""


def test_the_accessor_works_where_torch_cannot_be_imported(stored):
    """`ds.wb` is registered by `import workbench`, on the read side too (no torch installed)."""
    store = stored[0].attrs["store_path"]
    code = BLOCK_TORCH + f"""
import workbench
ds = workbench.open_store({store!r}, {MODEL!r})
picked = ds.wb.sel(condition="baseline", modality="vision", layer=0)
print("RUNS", sorted(set(picked.run_condition.values.tolist())), "NORMS", ds.wb.norms().dims, len(ds.wb.runs()))
print("HEAVY", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nnsight", "transformers")))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RUNS ['baseline'] NORMS ('condition', 'modality', 'layer') 12" in done.stdout
    assert "HEAVY []" in done.stdout
