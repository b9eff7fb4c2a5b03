"""The text-neighbour readout: the `embed_lens` capture equals the nearest embedding rows computed
with plain PyTorch (pre-hooks, the embedding weight, cosine, top-k); the `text-neighbours` analysis
on a synthetic store equals numpy run on the whole arrays at once (every cosine, argsort), read in
many small blocks; the CLI prints its table; and a tiny model's run draws the patches figure."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from analyses import cache, neighbours, streaming
from analyses.commands import main as analyses_main
from analyses.tables import open_models
from workbench.backends.local import run_condition
from workbench.capture import EMBED_TOP_K, CapturePlan, EmbeddingLensCapture
from workbench.plan import ConditionPlan, ModelPlan
from workbench.store import StoreWriter, Variable

MODEL = "syn/neighbours"
N_SAMPLES, N_LAYERS, DIM, VOCAB = 5, 3, 6, 40
MODALITY = np.array(["text"] * 3 + ["boundary"] + ["vision"] * 4 + ["boundary"] + ["text"] * 2)


def write_store(path):
    """Per sample and condition: `hidden` standard normal (a vision token of sample 0 is zero at
    layer 1: no direction), token ids and texts, a logit lens and an embedding readout of random
    ids with descending scores, and the ids' texts (`run_id_texts`)."""
    n = len(MODALITY)
    with StoreWriter(path) as writer:
        writer.ensure_model(MODEL, {"family": "synthetic", "n_layers": N_LAYERS, "hidden_size": DIM})
        for i in range(N_SAMPLES):
            for condition in ("baseline", "blank"):
                rng = np.random.default_rng([i, len(condition)])
                hidden = rng.standard_normal((n, N_LAYERS + 1, DIM))
                if i == 0 and condition == "baseline":
                    hidden[5, 1] = 0.0
                ids = rng.integers(0, VOCAB, n)
                lens_ids = rng.integers(0, VOCAB, (n, N_LAYERS + 1, 10))
                embed_ids = rng.integers(0, VOCAB, (n, N_LAYERS + 1, EMBED_TOP_K))
                named = sorted(set(lens_ids.ravel().tolist()) | set(embed_ids.ravel().tolist()))
                writer.write_sample(MODEL, condition, f"s/{i}", {
                    "position": Variable(("token",), np.arange(n, dtype=np.int64)),
                    "modality": Variable(("token",), MODALITY),
                    "token_id": Variable(("token",), ids.astype(np.int64)),
                    "token_text": Variable(("token",), np.array([f"w{t}" for t in ids], dtype=object)),
                    "hidden": Variable(("token", "layer", "dim"), hidden.astype(np.float32),
                                       {"layer": np.arange(N_LAYERS + 1)}),
                    "lens_ids": Variable(("token", "layer", "lens_rank"), lens_ids.astype(np.int64)),
                    "lens_logprobs": Variable(("token", "layer", "lens_rank"),
                                              -np.sort(rng.random((n, N_LAYERS + 1, 10)) * 5, -1).astype(np.float32)),
                    "embed_nn_ids": Variable(("token", "layer", "embed_rank"), embed_ids.astype(np.int64)),
                    "embed_nn_cos": Variable(("token", "layer", "embed_rank"),
                                             -np.sort(-rng.random((n, N_LAYERS + 1, EMBED_TOP_K)), -1).astype(np.float32)),
                    "run_id_texts": Variable(("run",), np.array([json.dumps({str(t): f"v{t}" for t in named})],
                                                                dtype=object)),
                }, condition_attrs={"image": "real"})
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("neighbours") / "syn.zarr")


def text(values) -> np.ndarray:
    return np.asarray(values).astype(object).astype(str)


def test_readout_equals_numpy_on_the_whole_arrays(store, monkeypatch):
    import workbench

    ds = workbench.open_store(store, model=MODEL)
    hidden = np.asarray(ds["hidden"].values, dtype=np.float64)
    condition, sample, modality = text(ds["condition"].values), text(ds["sample"].values), text(ds["modality"].values)
    chosen = ("s/0", "s/3")
    queries = np.flatnonzero((condition == "baseline") & (modality == "vision") & np.isin(sample, chosen))
    keys = np.flatnonzero((condition == "baseline") & (modality == "text"))
    # a few rows per block: the top-k is merged across many blocks
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 3 * (N_LAYERS + 1) * DIM * 4)
    got = neighbours.text_neighbours(ds, "baseline", chosen, k=4, cache=False)
    np.testing.assert_array_equal(got["query_row"].values, queries)
    norms = lambda x: np.linalg.norm(x, axis=-1)
    for l in range(N_LAYERS + 1):
        q, k = hidden[queries, l], hidden[keys, l]
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = (q @ k.T) / np.outer(norms(q), norms(k))
        for v in range(len(queries)):
            at = got.isel(query=v).sel(layer=l)
            if not np.isfinite(cos[v]).any():         # the zero vector: no neighbour at all
                assert (at["context_row"].values == -1).all() and np.isnan(at["context_cos"].values).all()
                continue
            order = np.argsort(-cos[v], kind="stable")[:4]
            np.testing.assert_array_equal(at["context_row"].values, keys[order])
            np.testing.assert_allclose(at["context_cos"].values, cos[v, order], rtol=1e-10)
            np.testing.assert_array_equal(text(at["context_text"].values), text(ds["token_text"].values)[keys[order]])
            np.testing.assert_array_equal(text(at["context_sample"].values), sample[keys[order]])
            np.testing.assert_array_equal(at["context_position"].values, np.asarray(ds["position"].values)[keys[order]])
    # the captured readouts at the same tokens, each id named from the runs' texts
    embed_ids = np.asarray(ds["embed_nn_ids"].values)[queries, :, :4]
    np.testing.assert_array_equal(got["embed_id"].values, embed_ids)
    np.testing.assert_allclose(got["embed_cos"].values, np.asarray(ds["embed_nn_cos"].values)[queries, :, :4])
    assert (text(got["embed_text"].values) == np.char.add("v", embed_ids.astype(str))).all()
    np.testing.assert_allclose(got["lens_prob"].values, np.exp(np.asarray(ds["lens_logprobs"].values,
                                                                          np.float64)[queries, :, :4]), rtol=1e-6)
    assert (text(got["lens_text"].values) == np.char.add("v", got["lens_id"].values.astype(str))).all()
    # the per-layer summary: the mean of the finite top-1 cosines; the most frequent top-1 word
    summary = neighbours.layer_summary(got)
    top1 = got["context_cos"].isel(rank=0).values
    np.testing.assert_allclose(summary["context_mean"].values, np.nanmean(top1, axis=0), rtol=1e-12)
    for l in range(N_LAYERS + 1):
        words, counts = np.unique(text(got["embed_text"].isel(rank=0, layer=l).values), return_counts=True)
        assert summary["embed_top"].values[l] == words[np.argmax(counts)]
        assert summary["embed_top_share"].values[l] == pytest.approx(counts.max() / len(queries))


def test_cli_prints_the_table(store, capsys):
    assert analyses_main(["analyze", str(store), "text-neighbours", "--samples", "s/1"]) == 0
    out = capsys.readouterr().out
    assert "Vision tokens read as words" in out and "| syn/neighbours | 3 | 4 |" in out, out
    # the readout the table computed is cached in the store and read back as computed
    cache._MEMO.clear()
    ds = open_models(store)[MODEL]
    hit = neighbours.text_neighbours(ds, "baseline", ("s/1",))
    assert hit.attrs["cache"] == "hit"
    fresh = neighbours.text_neighbours(ds, "baseline", ("s/1",), cache=False)
    for name in fresh.data_vars:
        np.testing.assert_array_equal(np.asarray(hit[name].values).astype(str) if fresh[name].dtype.kind in "OU"
                                      else hit[name].values, np.asarray(fresh[name].values).astype(str)
                                      if fresh[name].dtype.kind in "OU" else fresh[name].values)


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-qwen3vl"])
def test_embed_lens_matches_plain_torch(load_tiny, name):
    model = load_tiny(name)
    img = Image.new("RGB", (96, 64), "navy")
    img.paste((250, 200, 0), (10, 10, 50, 40))
    inputs = model.encode(img, "What colour is the square?")
    layers = tuple(range(model.n_layers + 1))
    plan = ModelPlan(model.info, [], CapturePlan(outputs=(EmbeddingLensCapture(layers),)))
    stored = run_condition(model, {"real": inputs}, ConditionPlan("baseline", {}, "real", ()), plan).tokens
    seen = []
    decoder = list(model.hf.get_submodule(model.arch.decoder_layers))
    hooks = [m.register_forward_pre_hook(lambda m, a, kw: seen.append((a[0] if a else kw["hidden_states"])[0].clone()),
                                         with_kwargs=True)
             for m in decoder + [model.hf.get_submodule(model.arch.final_norm)]]
    try:
        model.prepare()
        with torch.inference_mode():
            model.hf(**inputs.encoding)
    finally:
        for hook in hooks:
            hook.remove()
    table = model.hf.get_submodule(model.arch.embed).weight.detach().double()
    unit = lambda x: x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)        # a zero row (padding): cosine 0
    cos = torch.stack([unit(h.double()) @ unit(table).T for h in seen], dim=1)  # (token, layer, vocab)
    top = torch.topk(cos, EMBED_TOP_K, dim=-1)
    assert stored["embed_nn_ids"].shape == (inputs.n_tokens, len(layers), EMBED_TOP_K)
    np.testing.assert_allclose(stored["embed_nn_cos"], top.values.numpy(), atol=1e-5)
    assert (stored["embed_nn_ids"] == top.indices.numpy()).mean() > 0.99   # equal but where near-ties swap
    # layer 0 at a text token is its own embedding row: cosine 1, itself the nearest
    text_rows = np.flatnonzero(inputs.modality == "text")
    np.testing.assert_array_equal(stored["embed_nn_ids"][text_rows, 0, 0], inputs.input_ids.reshape(-1)[text_rows])


def test_a_tiny_models_run_draws_patches_beside_their_words(tmp_path, workbench_cache):
    from workbench.runner import run_spec
    from workbench.spec import parse_spec

    store = tmp_path / "nn.zarr"
    run_spec(parse_spec(f"""\
name: nn
models: [tiny-smolvlm]
data: {{source: builtin, n: 2}}
conditions: {{baseline: {{}}}}
capture: [{{site: layer}}, {{site: embed_lens}}, {{site: logit_lens}}]
backend: {{dtype: float32, device: cpu}}
store: {{path: {store}}}
"""), progress=False, log=lambda _: None)
    ds = open_models(store)["tiny-smolvlm"]
    named = json.loads(str(ds["run_id_texts"].values[0]))
    ids = np.asarray(ds["embed_nn_ids"].values)[np.asarray(ds["run_sample"].values)[0] == ds["sample"].values]
    assert {str(i) for i in np.unique(ids)} <= set(named)
    assert analyses_main(["analyze", str(store), "text-neighbours", "--figures", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "text_neighbours_patches.png").stat().st_size > 0
    assert (tmp_path / "report" / "text_neighbours_cosine.png").stat().st_size > 0
