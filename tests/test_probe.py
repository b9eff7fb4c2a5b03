"""The `probe` analysis on a store with a planted linear signal (`analyses.synthetic.write_probe_store`):
the colour is decoded from baseline vision tokens at >= 0.95 where it was planted, pure noise (the
`blank` condition) sits at chance within its interval, and the result equals scikit-learn run by
hand on arrays built from the raw stored tokens with pandas; the features read in many small
blocks equal those read at once; the CLI prints the table and refuses an unknown field (exit 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import workbench
from analyses import probe, streaming
from analyses.commands import main as analyses_main
from analyses.streaming import as_str
from analyses.synthetic import write_probe_store
from analyses.tables import open_models

N_SAMPLES, LAYERS, DIM = 60, 2, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_probe_store(tmp_path_factory.mktemp("probe") / "planted.zarr", n_samples=N_SAMPLES,
                             n_layers=LAYERS, dim=DIM).path


@pytest.fixture(scope="module")
def results(store):
    ds = open_models(store)["syn/probe"]
    return probe.probe_results(ds, "colour")   # cached in the store: the CLI test reads it back


def test_planted_signal_is_decoded_and_noise_sits_at_chance(results):
    summary = xr_summary(results)
    vision = summary["accuracy"].sel(condition="baseline", group="vision", stat="value")
    assert (vision.sel(layer=[1, 2]) >= 0.95).all(), vision.values            # planted from layer 1
    assert (summary["selectivity"].sel(condition="baseline", group="vision", layer=[1, 2], stat="value") > 0.3).all()
    noise = summary.sel(condition="blank")                                      # noise everywhere
    chance = noise["chance"].sel(stat="value")
    assert np.allclose(chance, 0.5)                                             # balanced classes
    acc = noise["accuracy"]
    assert ((acc.sel(stat="ci_low") <= chance) & (chance <= acc.sel(stat="ci_high"))).all(), acc.values


def xr_summary(results):
    return type(results)({name: probe.fold_summary(results[name]) for name in probe.SCORES})


def _by_hand_features(store) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per baseline sample: the mean over its vision tokens of `hidden` (samples, layers, dim), read
    whole and grouped with pandas, and the colour of each sample."""
    ds = workbench.open_store(store, model="syn/probe")
    hidden = np.asarray(ds["hidden"].values, dtype=np.float64)
    frame = pd.DataFrame({"condition": as_str(ds["condition"].values), "sample": as_str(ds["sample"].values),
                          "modality": as_str(ds["modality"].values)})
    rows = frame[(frame.condition == "baseline") & (frame.modality == "vision")]
    samples = sorted(rows["sample"].unique())
    x = np.stack([hidden[rows.index[rows["sample"] == s]].mean(0) for s in samples])
    runs = pd.DataFrame({"sample": as_str(ds["run_sample"].values), "colour": as_str(ds["run_colour"].values)})
    colour = runs.drop_duplicates("sample").set_index("sample").loc[samples, "colour"].to_numpy().astype(str)
    return x, colour, samples


def test_result_equals_scikit_learn_run_by_hand(store, results, monkeypatch):
    x, y, _ = _by_hand_features(store)
    control = np.random.default_rng(0).permutation(y)
    splits = list(StratifiedGroupKFold(n_splits=5, shuffle=True, random_state=0).split(x[:, 0], y, np.arange(len(y))))
    g = probe.GROUPS.index("vision")
    for layer in range(LAYERS + 1):
        expected, expected_control = [], []
        for train, test in splits:
            for labels, out in ((y, expected), (control, expected_control)):
                model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=0))
                out.append(np.mean(model.fit(x[train, layer], labels[train]).predict(x[test, layer]) == labels[test]))
        at = results.sel(condition="baseline", group="vision", layer=layer)
        assert np.allclose(at["accuracy"].values, expected)
        assert np.allclose(at["control"].values, expected_control)
        assert np.allclose(at["selectivity"].values, np.array(expected) - expected_control)
        full = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=0)).fit(x[:, layer], y)
        # the stored weights score raw activations as the pipeline scores standardized ones
        w = at["weight"].sel({"class": "red"}).values.astype(np.float64)
        b = float(at["bias"].sel({"class": "red"}))
        assert full.classes_.tolist() == ["blue", "red"]
        assert np.allclose(x[:, layer] @ w + b, full.decision_function(x[:, layer]), atol=1e-4)
        direction = probe.probe_direction(results, layer, "red")
        assert np.allclose(direction, w / np.linalg.norm(w)) and np.isclose(np.linalg.norm(direction), 1.0)
    # the features, read in blocks of a few rows, equal the whole arrays grouped by hand
    monkeypatch.setattr(streaming, "BLOCK_BYTES", 3 * (LAYERS + 1) * DIM * 4)
    features = probe.group_features(open_models(store)["syn/probe"], "baseline")
    assert np.allclose(features[:, g], x)


def test_where_keeps_only_the_samples_asked_for(store):
    ds = open_models(store)["syn/probe"]
    kept = probe.sample_labels(ds, "colour", "category=color")
    assert len(kept) == N_SAMPLES // 2 and set(kept.values()) == {"red"}   # even samples: all red
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        probe.parse_where("category")


def test_cli_prints_the_table_and_refuses_an_unknown_field(store, capsys):
    assert analyses_main(["analyze", str(store), "probe", "--label", "colour", "--where", "category=color",
                          "--models", "syn/probe"]) == 0  # one class only: the table says so
    out = capsys.readouterr().out
    assert "skipped" in out and "two or more values of 'colour'" in out
    assert analyses_main(["analyze", str(store), "probe", "--label", "colour"]) == 0
    out = capsys.readouterr().out
    assert "### Linear probes of 'colour'" in out and "| syn/probe | baseline | vision | 60 |" in out
    assert analyses_main(["analyze", str(store), "probe", "--label", "colours"]) == 2
    err = capsys.readouterr().err
    assert "--label: no per-sample field 'colours'" in err and "did you mean 'colour'" in err
