"""Sharded runs (`run --shard k/N`) and `workbench merge`: the merged store equals a single run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.stores import ROOT, assert_same_store
from workbench.cli import main
from workbench.store import open_store

SPEC = """\
name: shards
models: [tiny-llama]
data: {{source: builtin, n: 5}}
conditions:
  baseline: {{}}
  alpha:
    sweep: {{alpha: [0.5, 2.0]}}
    interventions: [{{kind: scale, site: layer, layers: [1], factor: $alpha, positions: all}}]
capture: [{{site: layer, layers: all}}, {{site: logits}}]
store: {{path: {store}}}
"""


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, workbench_cache):
    folder = tmp_path_factory.mktemp("shards")
    spec = folder / "spec.yaml"
    spec.write_text(SPEC.format(store=folder / "run.zarr"))
    for k in range(3):
        assert main(["run", str(spec), "--shard", f"{k}/3", "--no-progress", "--no-table"]) == 0
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0  # the single run, for reference
    return folder, spec


def shards(folder: Path) -> list[str]:
    return [str(folder / f"run.shard{k}of3.zarr") for k in range(3)]


def test_shards_hold_disjoint_samples_and_merge_equals_the_single_run(sharded, tmp_path):
    folder, _ = sharded
    held = [set(str(s) for s in open_store(p, model="tiny-llama").run_sample.values) for p in shards(folder)]
    assert all(not (a & b) for i, a in enumerate(held) for b in held[i + 1:]) and sum(map(len, held)) == 5
    merged = tmp_path / "merged.zarr"
    assert main(["merge", str(merged), *reversed(shards(folder))]) == 0  # any order of arguments
    assert_same_store(merged, folder / "run.zarr", ("tiny-llama",))
    records = json.loads(open_store(merged, model="tiny-llama").attrs["provenance"])
    assert [r.get("shard") for r in records[:3]] == [[0, 3], [1, 3], [2, 3]] and "merge" in records[3]


def test_an_interrupted_merge_resumes_to_the_same_store(sharded, tmp_path):
    folder, _ = sharded
    merged = tmp_path / "merged.zarr"
    killed = subprocess.run([sys.executable, "-m", "workbench.cli", "merge", str(merged), *shards(folder)], cwd=ROOT,
                            env={**__import__("os").environ, "WORKBENCH_KILL_AT": "store.commit:4"}, capture_output=True)
    assert killed.returncode == -9
    assert main(["merge", str(merged), *shards(folder)]) == 0
    assert_same_store(merged, folder / "run.zarr", ("tiny-llama",))
    records = json.loads(open_store(merged, model="tiny-llama").attrs["provenance"])
    assert [r.get("shard") for r in records[:3]] == [[0, 3], [1, 3], [2, 3]] and len(records) == 5  # 2 merges


def test_merge_refuses_a_missing_shard_and_non_shards(sharded, tmp_path, capsys):
    folder, _ = sharded
    assert main(["merge", str(tmp_path / "m.zarr"), *shards(folder)[:2]]) == 2
    assert "expected every shard 0..N-1" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "m.zarr"), str(folder / "run.zarr")]) == 2
    assert "is not the store of one shard" in capsys.readouterr().err
    assert not (tmp_path / "m.zarr").exists()


def test_bad_shard_argument_exits_2(sharded, capsys):
    _, spec = sharded
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(spec), "--shard", "3/3"])
    assert exit_.value.code == 2 and "expected k/N with 0 <= k < N" in capsys.readouterr().err


def test_merge_keeps_each_samples_vision_patch_rows(tmp_path, workbench_cache):
    """Vision-tower rows have their own row dim: a merge takes each sample's patch rows (counted
    per run in run_patches) with its token rows (the norm atlas spec, on tiny Gemma-3)."""
    atlas = ["run", str(ROOT / "specs" / "norm_atlas.yaml"), "--models", "tiny-gemma3", "--limit", "3",
             "--store", str(tmp_path / "run.zarr"), "--no-progress", "--no-table"]
    for k in range(2):
        assert main([*atlas, "--shard", f"{k}/2"]) == 0
    assert main(atlas) == 0
    merged = tmp_path / "merged.zarr"
    assert main(["merge", str(merged), *(str(tmp_path / f"run.shard{k}of2.zarr") for k in range(2))]) == 0
    assert_same_store(merged, tmp_path / "run.zarr", ("tiny-gemma3",))
    assert open_store(merged, model="tiny-gemma3").sizes["vision_patch"] > 0
