"""Attention per head (analyses/heads.py, table `heads`): each head's text→vision mass and the
attention-sink mass, checked against attention probabilities that transformers' own eager
attention returns for the same samples (an independent computation of the whole chain)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench
from analyses import heads
from analyses.tables import Options, build_tables
from workbench.data import builtin_samples
from workbench.runner import LazyInputs, run_spec
from workbench.spec import parse_spec


@pytest.fixture(scope="module")
def store(tmp_path_factory, workbench_cache):
    path = tmp_path_factory.mktemp("heads") / "heads.zarr"
    run_spec(parse_spec(f"""\
name: heads
models: [tiny-qwen3vl]
data: {{source: builtin, n: 3}}
conditions:
  baseline: {{}}
  half: {{interventions: [{{kind: scale, site: projector, positions: vision, factor: 0.5}}]}}
capture: [{{site: attention}}, {{site: logits}}]
generate: {{max_new_tokens: 2}}
store: {{path: {path}}}
"""), progress=False, log=lambda _: None)
    return path


def eager_reference(load_tiny, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (sample, layer, head): text→vision mass and the last prompt query's attention on
    position 0, from `output_attentions` of an eager forward."""
    model = load_tiny("tiny-qwen3vl", attn="eager")
    vision_mass, sink = [], []
    for sample in builtin_samples(n_samples):
        inputs = LazyInputs(model, sample)["real"]
        model.prepare()
        with torch.inference_mode():
            out = model.hf(**inputs.encoding, output_attentions=True)
        probs = torch.stack([a[0] for a in out.attentions]).numpy()           # (layer, head, query, key)
        vision, text = inputs.modality == "vision", inputs.modality == "text"
        vision_mass.append(probs[:, :, text][:, :, :, vision].sum(-1).mean(-1))
        sink.append(probs[:, :, -1, 0])
    return np.stack(vision_mass), np.stack(sink)


def test_head_vision_mass_and_sink_equal_eager_attention(store, load_tiny):
    ds = workbench.open_store(store, model="tiny-qwen3vl")
    mass = heads.head_vision_mass(ds, cache=False)["mass"].sel(condition="baseline", modality="text")
    sink = heads.attention_sink(ds, cache=False)["sink"].sel(condition="baseline", step=0)
    ref_mass, ref_sink = eager_reference(load_tiny, 3)
    samples = sorted(s.id for s in builtin_samples(3))
    order = [samples.index(s.id) for s in builtin_samples(3)]
    np.testing.assert_allclose(mass.transpose("sample", "decoder_layer", "head").values[order], ref_mass, atol=2e-6)
    np.testing.assert_allclose(sink.transpose("sample", "decoder_layer", "head").values[order], ref_sink, atol=2e-6)
    assert (ref_mass.std(axis=2) > 0).any()  # heads differ: a per-head analysis has something to show


def test_heads_table_reports_the_head_mean_and_the_top_head(store):
    ds = workbench.open_store(store, model="tiny-qwen3vl")
    table = build_tables(str(store), ["heads"], Options(n_resamples=200))[0]
    assert not table.skipped and len(table.rows) == ds.sizes["decoder_layer"]
    mass = heads.head_vision_mass(ds, cache=False)["mass"].sel(condition="baseline", modality="text")
    sink = heads.attention_sink(ds, cache=False)["sink"].sel(condition="baseline", step=0)
    for row, layer in zip(table.rows, ds["decoder_layer"].values):
        per_head = mass.sel(decoder_layer=layer).mean("sample")
        assert row[2].value == pytest.approx(float(per_head.mean("head")), abs=1e-9)
        assert row[3].startswith(f"head {int(per_head.argmax('head'))}:")
        assert row[4].value == pytest.approx(float(sink.sel(decoder_layer=layer).mean(("sample", "head"))), abs=1e-9)
        assert row[5].startswith(f"head {int(sink.sel(decoder_layer=layer).mean('sample').argmax('head'))}:")
