"""Sparse autoencoders through SAELens (`workbench sae train`, the `sae` analysis, `sae_splice`):
- the analysis's encoding of the stored rows, read block by block, equals SAELens's own `encode`
  of the same rows read whole; its variance explained equals SAELens's `ExplainedVarianceCalculator`;
- an SAE trained by the CLI on a tiny store (SAELens's format, read back by `SAE.load_from_disk`)
  explains more variance of held-out samples than a random dictionary of the same size;
- the CLI prints the table; without SAELens the core imports and runs, and the sae commands exit 2
  naming the extra (SAELens blocked on `sys.meta_path` in a subprocess);
- `sae_splice` in a tiny model's run stores, at the spliced layer, SAELens's decode(encode(x)) of
  the baseline's rows (text rows untouched), and the table's spliced KL is `compare`'s."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from sae_lens import SAE, TopKSAE, TopKSAEConfig
from sae_lens.evals import ExplainedVarianceCalculator
from sae_lens.saes.sae import SAEMetadata

import workbench
from analyses import sae as sae_analysis
from analyses import streaming
from analyses.streaming import as_str
from analyses.synthetic import write_probe_store
from analyses.tables import open_models
from workbench.cli import main

DIM, LAYER, D_SAE, K = 8, 1, 32, 4


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A store to train on and one of other samples (another seed) to hold out."""
    root = tmp_path_factory.mktemp("sae")
    train = write_probe_store(root / "train.zarr", n_samples=24, n_layers=1, dim=DIM, seed=0).path
    held = write_probe_store(root / "held.zarr", n_samples=16, n_layers=1, dim=DIM, seed=1).path
    return root, train, held


@pytest.fixture(scope="module")
def trained(stores):
    root, train, _ = stores
    out = root / "sae"
    assert main(["sae", "train", str(train), "--site", "hidden", "--layer", str(LAYER), "--out", str(out),
                 "--d-sae", str(D_SAE), "-k", str(K), "--epochs", "15", "--batch-size", "64", "--lr", "1e-2",
                 "-q"]) == 0
    return out


def _stored(store, layer: int = LAYER) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hidden at `layer`, condition, modality) of every token, read whole."""
    ds = workbench.open_store(store, model="syn/probe")
    hidden = np.asarray(ds["hidden"].sel(layer=layer).values, dtype=np.float32)
    return hidden, as_str(ds["condition"].values), as_str(ds["modality"].values)


def test_encoding_equals_saelens_encode(stores, trained, monkeypatch):
    _, train, _ = stores
    ds = open_models(train)["syn/probe"]
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 40 * 1024)   # many blocks
    source = sae_analysis.sae_source(str(trained))
    rows = np.arange(ds.sizes["token"])
    blocks = list(sae_analysis.encode_rows(ds, source, rows))
    assert len(blocks) > 1
    features = np.concatenate([f for _, _, f, _ in blocks])
    hidden, _, _ = _stored(train)
    sae = SAE.load_from_disk(str(trained))
    with torch.no_grad():
        expected = sae.encode(torch.from_numpy(hidden)).numpy()
    np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)
    assert ((features != 0).sum(1) == K).all()


def test_variance_explained_equals_saelens(stores, trained):
    _, train, _ = stores
    ds = open_models(train)["syn/probe"]
    metrics = sae_analysis.sae_metrics(ds, str(trained), n_resamples=50, cache=False)
    hidden, condition, modality = _stored(train)
    sae = SAE.load_from_disk(str(trained))
    for group in ("vision", "text"):   # every sample has the same tokens: the per-sample mean is the pooled one
        x = torch.from_numpy(hidden[(condition == "baseline") & (modality == group)])
        calculator = ExplainedVarianceCalculator()
        with torch.no_grad():
            calculator.add_batch(sae.decode(sae.encode(x)), x)
        got = float(metrics["explained"].sel(condition="baseline", group=group, stat="value"))
        assert got == pytest.approx(calculator.compute(), abs=1e-5)


def _random_dictionary(path, d_in: int, d_sae: int, k: int) -> str:
    """A TopK SAE of the same size as SAELens initializes it, untrained, saved in SAELens's format."""
    torch.manual_seed(1)
    cfg = TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=k, metadata=SAEMetadata(
        hook_name=f"hidden.{LAYER}", workbench_variable="hidden", workbench_layer=LAYER))
    TopKSAE(cfg).save_model(path)
    return str(path)


def test_trained_sae_beats_a_random_dictionary_on_held_out_samples(stores, trained):
    root, _, held = stores
    random = _random_dictionary(root / "random", DIM, D_SAE, K)
    ds = open_models(held)["syn/probe"]
    got = {name: sae_analysis.sae_metrics(ds, path, n_resamples=200, cache=False)["explained"]
           .sel(condition="baseline", group="all") for name, path in (("trained", str(trained)), ("random", random))}
    assert float(got["trained"].sel(stat="ci_low")) > float(got["random"].sel(stat="ci_high")), got
    assert float(got["trained"].sel(stat="value")) > 0.5


def test_the_figure_draws_the_gap_over_the_saes_layers(stores, tmp_path, capsys):
    from matplotlib.image import imread

    _, train, _ = stores
    for layer in (0, 1):
        torch.manual_seed(layer)
        TopKSAE(TopKSAEConfig(d_in=DIM, d_sae=D_SAE, k=K, metadata=SAEMetadata(
            hook_name=f"blocks.{layer}.hook_resid_pre"))).save_model(tmp_path / "saes" / f"layer{layer}")
    assert main(["analyze", str(train), "sae", "--sae", str(tmp_path / "saes"), "--figures", str(tmp_path / "fig"),
                 "--resamples", "50", "--no-progress"]) == 0
    assert "| syn/probe | layer0 | hidden 0 |" in capsys.readouterr().out
    image = imread(tmp_path / "fig" / "sae_reconstruction_gap.png")
    assert image.shape[0] > 300 and image[..., :3].std() > 0.05


def test_cli_prints_the_table_and_refuses_a_missing_sae(stores, trained, capsys):
    _, train, _ = stores
    assert main(["analyze", str(train), "sae", "--sae", str(trained), "--resamples", "50", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Sparse autoencoders on the stored activations" in out and "| syn/probe | sae | hidden 1 | baseline |" in out
    assert main(["analyze", str(train), "sae", "--no-progress"]) == 2
    assert "--sae: the sae table encodes with an SAE" in capsys.readouterr().err
    assert main(["analyze", str(train), "sae", "--sae", str(train), "--no-progress"]) == 2
    assert "holds no SAE in SAELens's format" in capsys.readouterr().err


BLOCKED = textwrap.dedent("""
    import sys
    from importlib.abc import MetaPathFinder

    class Absent(MetaPathFinder):   # as if the extra 'sae' were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "sae_lens" or name.startswith("sae_lens."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Absent())
    from workbench.cli import main
    import analyses.registry
    assert "sae" in analyses.registry.names()         # registered: its imports are light
    print("info", main(["info", sys.argv[1]]))
    print("probe", main(["analyze", sys.argv[1], "probe", "--label", "colour", "--no-progress"]))
    print("train", main(["sae", "train", sys.argv[1], "--layer", "1", "--out", sys.argv[2]]))
    print("analyze", main(["analyze", sys.argv[1], "sae", "--sae", sys.argv[3], "--no-progress"]))
    print("validate", main(["validate", sys.argv[4]]))
""")


def test_without_the_extra_the_core_runs_and_sae_commands_exit_2(stores, trained, tmp_path):
    _, train, _ = stores
    spec = tmp_path / "splice.yaml"
    spec.write_text(SPLICE_SPEC.format(sae=trained, store=tmp_path / "never.zarr"))
    done = subprocess.run([sys.executable, "-c", BLOCKED, str(train), str(tmp_path / "out"), str(trained), str(spec)],
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert "info 0" in lines and "probe 0" in lines, done.stdout + done.stderr
    assert "train 2" in lines and "analyze 2" in lines and "validate 2" in lines, done.stdout + done.stderr
    assert done.stderr.count("needs SAELens, the optional extra 'sae': pip install \"vlm-workbench[sae]\"") == 3
    assert not (tmp_path / "out").exists()


SPLICE_SPEC = """\
name: sae-splice
models: [tiny-smolvlm]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  spliced:
    interventions: [{{kind: sae_splice, site: layer, layers: [1], positions: vision, sae: {sae}}}]
capture: [{{site: layer, layers: [1]}}, {{site: logits}}]
generate: {{max_new_tokens: 1}}
store: {{path: {store}}}
"""


def test_sae_splice_stores_the_reconstruction_and_the_table_reads_its_kl(tmp_path, capsys):
    from analyses.compare import output_metrics

    sae_dir = tmp_path / "sae"
    torch.manual_seed(0)
    TopKSAE(TopKSAEConfig(d_in=64, d_sae=128, k=8, metadata=SAEMetadata(
        hook_name="blocks.1.hook_resid_pre"))).save_model(sae_dir)       # hidden at layer 1 (TransformerLens's name)
    spec, store = tmp_path / "splice.yaml", tmp_path / "splice.zarr"
    spec.write_text(SPLICE_SPEC.format(sae=sae_dir, store=store))
    assert main(["run", str(spec), "--no-progress", "--no-table", "-q"]) == 0
    ds = workbench.open_store(store, model="tiny-smolvlm")
    hidden = np.asarray(ds["hidden"].sel(layer=1).values)
    condition, modality = as_str(ds["condition"].values), as_str(ds["modality"].values)
    base, spliced = hidden[condition == "baseline"], hidden[condition == "spliced"]
    vision = modality[condition == "baseline"] == "vision"
    sae = SAE.load_from_disk(str(sae_dir))
    with torch.no_grad():
        expected = sae.decode(sae.encode(torch.from_numpy(base[vision]))).numpy()
    np.testing.assert_allclose(spliced[vision], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(spliced[~vision], base[~vision])
    model = open_models(store)["tiny-smolvlm"]
    source = sae_analysis.sae_source(str(sae_dir))
    assert sae_analysis.splice_conditions(model, source) == {"spliced": "vision"}
    kl = sae_analysis.splice_kl(model, source, n_resamples=50)["vision"]
    compared = output_metrics(model, n_resamples=50)["kl"].sel(condition="spliced", step=0)
    np.testing.assert_allclose(kl.values, compared.values)
    assert float(compared.sel(stat="value")) > 0


def test_sae_splice_on_ndif_is_refused_before_any_job(tmp_path, capsys):
    """SAELens is not on NDIF's import whitelist: a remote backend is refused by `validate` and by
    `run --remote`, naming the kind, before any job or store."""
    sae_dir = tmp_path / "sae"
    TopKSAE(TopKSAEConfig(d_in=64, d_sae=128, k=8, metadata=SAEMetadata(
        hook_name="blocks.1.hook_resid_pre"))).save_model(sae_dir)
    spec, store = tmp_path / "splice.yaml", tmp_path / "never.zarr"
    spec.write_text(SPLICE_SPEC.format(sae=sae_dir, store=store) + "backend: {kind: remote}\n")
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "interventions[0].kind" in err and "'sae_splice' runs locally only" in err, err
    spec.write_text(SPLICE_SPEC.format(sae=sae_dir, store=store))
    assert main(["run", str(spec), "--remote", "local", "--no-progress", "-q"]) == 2
    assert "intervention kind 'sae_splice' runs locally only" in capsys.readouterr().err
    assert not store.exists()
