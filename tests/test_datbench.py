"""DatBench through the `datasets` library, on a small local copy with DatBench's schema.

The hub is unreachable here (and conftest sets HF_DATASETS_OFFLINE / HF_HUB_OFFLINE), so the
fixture builds nine tiny configs with `datasets` itself and writes them in the layouts that
`workbench.data.datbench_samples` reads: one `save_to_disk` directory per config, and a
hub-repo-like folder (parquet + README configs) for `load_dataset(path, config)`.
"""

from __future__ import annotations

import socket
from collections import Counter

import pytest
from PIL import Image

datasets = pytest.importorskip("datasets")

from workbench.data import DATBENCH_REPO, DatBenchError, datbench_samples, load_samples  # noqa: E402
from workbench.spec import DATBENCH_CONFIGS, DataSpec, parse_spec  # noqa: E402

from support.datbench import MODES, ROWS, config_dataset  # noqa: E402  (fixtures saved_copy, source_rows: conftest.py)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def fingerprint(samples) -> list[tuple]:
    return [(s.id, s.question, s.category, s.answer, s.image.size, s.image.tobytes()) for s in samples]


def test_study_selection_shape_and_content(saved_copy, source_rows, no_network):
    samples = datbench_samples(10, seed=0, exclude=["math"], path=saved_copy)
    assert len(samples) == 80
    configs = [c for c in DATBENCH_CONFIGS if c != "math"]
    # Configs in DATBENCH_CONFIGS order, 10 each.
    assert [s.category for s in samples] == [c for c in configs for _ in range(10)]
    assert len({s.id for s in samples}) == 80
    for s in samples:
        row = source_rows[s.id]  # KeyError: an id that is not datbench/<config>/<row id>
        assert s.id == f"datbench/{s.category}/{row['id']}"
        fmt = row["prompt_format"]
        assert s.question == fmt["prefix"] + row["question"] + fmt["suffix"]
        assert s.answer == row["answer"]
        assert isinstance(s.image, Image.Image) and s.image.mode == "RGB"
        assert s.image.size == row["image"].size
        assert s.image.getpixel((0, 0)) == row["image"].convert("RGB").getpixel((0, 0))
    assert {row_mode for row_mode in (source_rows[s.id]["image"].mode for s in samples)} == set(MODES)


def test_deterministic_seeded_and_prefix_stable(saved_copy, no_network):
    a = datbench_samples(5, seed=3, exclude=("math",), path=saved_copy)
    assert fingerprint(a) == fingerprint(datbench_samples(5, seed=3, exclude=("math",), path=saved_copy))
    other = datbench_samples(5, seed=4, exclude=("math",), path=saved_copy)
    assert [s.id for s in a] != [s.id for s in other]
    # Not simply the first rows, and not the same positions in every config.
    positions = {c: [s.id.rsplit("_", 1)[1] for s in a if s.category == c] for c in DATBENCH_CONFIGS if c != "math"}
    assert positions["chart"] != ["0000", "0001", "0002", "0003", "0004"]
    assert len({tuple(p) for p in positions.values()}) > 1
    # A smaller n is a per-config prefix of a larger one.
    small = datbench_samples(2, seed=3, exclude=("math",), path=saved_copy)
    assert [s.id for s in small] == [s.id for s in a if s.id in {t.id for t in small}]
    for config in positions:
        assert [s.id for s in small if s.category == config] == [s.id for s in a if s.category == config][:2]


def test_exclude_and_oversized_n(saved_copy, no_network):
    only_chart = datbench_samples(100, path=saved_copy, exclude=[c for c in DATBENCH_CONFIGS if c != "chart"])
    assert len(only_chart) == ROWS  # every row, once, in a seeded order
    assert sorted(s.id for s in only_chart) == [f"datbench/chart/chart_{i:04d}" for i in range(ROWS)]
    assert [s.id for s in only_chart] != sorted(s.id for s in only_chart)
    assert datbench_samples(0, path=saved_copy) == []
    with pytest.raises(ValueError, match="maths"):
        datbench_samples(1, path=saved_copy, exclude=["maths"])


def test_only_chosen_images_are_decoded(saved_copy, monkeypatch, no_network):
    decoded = []
    original = datasets.Image.decode_example

    def counting(self, value, *args, **kwargs):
        decoded.append(value)
        return original(self, value, *args, **kwargs)

    monkeypatch.setattr(datasets.Image, "decode_example", counting)
    samples = datbench_samples(3, path=saved_copy, exclude=[c for c in DATBENCH_CONFIGS if c not in ("chart", "table")])
    assert len(samples) == 6
    assert len(decoded) == 6


def test_bare_dataset_and_missing_config(tmp_path, no_network):
    config_dataset("chart").save_to_disk(str(tmp_path / "chart"))  # a Dataset, not a DatasetDict
    others = [c for c in DATBENCH_CONFIGS if c != "chart"]
    assert len(datbench_samples(4, path=tmp_path, exclude=others)) == 4
    with pytest.raises(DatBenchError) as err:
        datbench_samples(4, path=tmp_path)
    assert "cannot load config 'counting'" in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_missing_path_is_a_clear_error(tmp_path, no_network):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatBenchError) as err:
        datbench_samples(10, path=missing)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert message.startswith(f"data.source datbench: cannot load config 'chart' from '{missing}' (no such folder)")
    assert "data.path" in message and "save_to_disk" in message


def test_hub_offline_is_a_clear_error_without_network(tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-cache")
    with pytest.raises(DatBenchError) as err:
        datbench_samples(10, exclude=["math"])
    message = str(err.value)
    assert message.startswith(f"data.source datbench: cannot load config 'chart' from '{DATBENCH_REPO}' (")
    assert message.split("); ", 1)[1].startswith("set data.path to a local copy")


def test_hub_repo_layout_via_load_dataset(tmp_path, monkeypatch, no_network):
    """A download of the hub repo (parquet per config + README configs) goes through load_dataset."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    repo = tmp_path / "DatBench"
    configs = ("chart", "spatial")
    card = ["---", "configs:"]
    for config in configs:
        (repo / config).mkdir(parents=True)
        config_dataset(config).to_parquet(str(repo / config / "test-00000-of-00001.parquet"))
        card += [f"- config_name: {config}", "  data_files:", "  - split: test", f"    path: {config}/test-*"]
    (repo / "README.md").write_text("\n".join(card + ["---", ""]), encoding="utf-8")
    excluded = [c for c in DATBENCH_CONFIGS if c not in configs]
    from_repo = datbench_samples(3, seed=1, exclude=excluded, path=repo)
    assert [s.category for s in from_repo] == ["chart"] * 3 + ["spatial"] * 3
    assert all(s.image.mode == "RGB" for s in from_repo)
    # Same rows, same choice as the save_to_disk layout of the same data.
    saved = tmp_path / "saved"
    for config in configs:
        config_dataset(config).save_to_disk(str(saved / config))
    assert fingerprint(from_repo) == fingerprint(datbench_samples(3, seed=1, exclude=excluded, path=saved))


def test_spec_data_section(saved_copy, no_network):
    spec = parse_spec(
        "name: datbench-probe\n"
        "models: [tiny-smolvlm]\n"
        "data:\n"
        "  source: datbench\n"
        "  n: 2\n"
        "  exclude: [math]\n"
        f"  path: '{saved_copy}'\n"
        "conditions: {baseline: {}}\n"
        "capture: [{site: logits, positions: text}]\n"
        "store: {path: stores/datbench-probe.zarr}\n"
    )
    samples = load_samples(spec.data)
    assert len(samples) == 16
    assert Counter(s.category for s in samples) == {c: 2 for c in DATBENCH_CONFIGS if c != "math"}
    assert fingerprint(samples) == fingerprint(datbench_samples(2, 0, ["math"], saved_copy))
    # n is per config; seed changes the choice.
    reseeded = load_samples(DataSpec(source="datbench", n=2, seed=9, exclude=["math"], path=str(saved_copy)))
    assert [s.id for s in reseeded] != [s.id for s in samples]


def test_order_first_takes_the_first_rows_like_the_study(saved_copy, no_network):
    samples = datbench_samples(3, seed=7, exclude=("math",), path=saved_copy, order="first")
    for config in DATBENCH_CONFIGS:
        if config == "math":
            continue
        assert [s.id.rsplit("_", 1)[1] for s in samples if s.category == config] == ["0000", "0001", "0002"]
    spec = parse_spec(f"name: d\nmodels: [tiny-smolvlm]\ndata: {{source: datbench, n: 1, order: first, path: {saved_copy}}}\n"
                      "conditions: {baseline: {}}\ncapture: [{site: layer}]\nstore: {path: s.zarr}\n")
    assert [s.id.rsplit("_", 1)[1] for s in load_samples(spec.data)] == ["0000"] * 9
