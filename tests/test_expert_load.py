"""The `expert-load` analysis (analyses.experts) against numpy on a synthetic store: the share of
each modality's routing slots per expert and MoE layer, and the vision-text distance."""

from __future__ import annotations

import numpy as np
import pytest

from analyses import experts
from analyses.builtin.expert_load import expert_load, expert_load_table
from analyses.synthetic import SyntheticModel, write_synthetic_store
from analyses.streaming import as_str
from analyses.tables import Options, open_models

MODEL = SyntheticModel("syn/moe", n_layers=3, experts=6, top_k=2)
OPTIONS = Options(n_resamples=50)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_synthetic_store(tmp_path_factory.mktemp("moe") / "moe.zarr", models=(MODEL,), n_samples=4,
                                 alphas=(3.0,), extra_conditions=("none",),
                                 variables=("hidden", "router_logits", "router_experts")).path


def numpy_load(ds, condition):
    """{(modality, sample): (layer, expert) load} by plain loops over the stored top-k."""
    chosen = np.asarray(ds["router_experts"].values)
    modality, sample = as_str(ds["modality"].values), as_str(ds["sample"].values)
    where = as_str(ds["condition"].values) == condition
    out = {}
    for m in ("vision", "text"):
        for s in sorted(set(sample[where])):
            rows = np.flatnonzero(where & (modality == m) & (sample == s))
            counts = np.zeros((chosen.shape[1], MODEL.experts))
            for t in rows:
                for l in range(chosen.shape[1]):
                    for e in chosen[t, l]:
                        counts[l, e] += 1
            out[(m, s)] = counts / (len(rows) * chosen.shape[2])
    return out


def test_expert_load_matches_numpy(store):
    ds = open_models(store)["syn/moe"]
    per_sample = experts.expert_load(ds, per_sample=True).sel(condition="baseline")
    reference = numpy_load(ds, "baseline")
    samples = sorted({s for _, s in reference})
    for (m, s), load in reference.items():
        np.testing.assert_allclose(per_sample["load"].sel(modality=m, sample=s).values, load, atol=1e-12)
        assert np.allclose(load.sum(-1), 1.0)
    distance = [0.5 * np.abs(reference[("vision", s)] - reference[("text", s)]).sum(-1) for s in samples]
    np.testing.assert_allclose(per_sample["distance"].sel(sample=samples).transpose("decoder_layer", "sample").values,
                               np.stack(distance, axis=1), atol=1e-12)
    summary = experts.expert_load(ds, n_resamples=50).sel(condition="baseline")
    mean_vision = np.mean([reference[("vision", s)] for s in samples], axis=0)
    np.testing.assert_allclose(summary["load"].sel(modality="vision", stat="value").values, mean_vision, atol=1e-12)
    # the synthetic vision tokens favour the first half of the experts
    assert mean_vision[:, : MODEL.experts // 2].sum() > mean_vision[:, MODEL.experts // 2:].sum()


def test_dense_layers_are_left_out(store):
    ds = open_models(store)["syn/moe"]
    chosen = ds["router_experts"].values.copy()
    chosen[:, 1] = -1                     # decoder layer 1 dense, as in an interleaved model
    shares = experts.token_shares(ds.assign(router_experts=(ds["router_experts"].dims, chosen)))
    assert np.isnan(shares.sel(decoder_layer=1)).all() and np.isfinite(shares.sel(decoder_layer=0)).all()


def test_table_and_figure(store, tmp_path):
    models = open_models(store)
    table = expert_load_table(models, OPTIONS)
    assert table.skipped is None and len(table.rows) == MODEL.n_layers
    assert table.rows[0][3].startswith("expert ")
    figure = expert_load(models, OPTIONS, tmp_path)
    assert figure.skipped is None and figure.path.exists()


def test_a_store_without_router_is_skipped_with_the_reason(tmp_path):
    store = write_synthetic_store(tmp_path / "dense.zarr", models=(SyntheticModel("syn/dense"),), n_samples=2,
                                  alphas=(), extra_conditions=(), variables=("hidden",))
    table = expert_load_table(open_models(store.path), OPTIONS)
    assert table.skipped and "router_experts" in table.skipped
