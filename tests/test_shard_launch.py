"""Shards launched by a scheduler (`run --shard auto` under a SLURM array or torchrun, simulated by
their environment variables) and `workbench merge --out`: the merged store equals a single run's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.stores import assert_same_store
from workbench.cli import main
from workbench.shards import SLURM_VARIABLES, TORCHRUN_VARIABLES, ShardError, parse_shard, visible_devices
from workbench.store import open_store, store_history

SPEC = """\
name: launched
models: [tiny-llama]
data: {{source: builtin, n: 4}}
conditions:
  baseline: {{}}
capture: [{{site: layer, layers: [0, 1]}}, {{site: logits}}]
store: {{path: {store}}}
"""

LAUNCHERS = (*SLURM_VARIABLES, "SLURM_ARRAY_TASK_MAX", *TORCHRUN_VARIABLES, "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_environment(monkeypatch):
    """No launcher variables from the machine running the tests; CUDA_VISIBLE_DEVICES restored after."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # recorded, so that it is restored
    for name in (*LAUNCHERS, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def launched(tmp_path_factory, workbench_cache):
    """Shard 0 of 2 as task 1 of a SLURM array `--array=1-2`, shard 1 as torchrun's rank 1 of 2;
    and the single run."""
    folder = tmp_path_factory.mktemp("launched")
    spec = folder / "spec.yaml"
    spec.write_text(SPEC.format(store=folder / "run.zarr"))
    run = ["run", str(spec), "--shard", "auto", "--no-progress", "--no-table"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", "")  # recorded, so that the context restores it after the torchrun run
        for name in (*LAUNCHERS, "CUDA_VISIBLE_DEVICES"):
            env.delenv(name, raising=False)
        for name, value in {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "1",
                            "SLURM_ARRAY_TASK_MAX": "2"}.items():
            env.setenv(name, value)
        assert main(run) == 0
        for name in SLURM_VARIABLES + ("SLURM_ARRAY_TASK_MAX",):
            env.delenv(name)
        for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
            env.setenv(name, value)
        assert main(run) == 0
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"  # torchrun's local rank 1 keeps GPU 1 to itself
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    return folder, spec


def shard_paths(folder: Path) -> list[str]:
    return [str(folder / f"run.shard{k}of2.zarr") for k in range(2)]


def test_launched_shards_hold_their_share_and_merge_out_equals_the_single_run(launched, tmp_path):
    folder, _ = launched
    held = [[str(s) for s in open_store(p, model="tiny-llama").run_sample.values] for p in shard_paths(folder)]
    single = [str(s) for s in open_store(folder / "run.zarr", model="tiny-llama").run_sample.values]
    assert held == [single[0::2], single[1::2]]
    merged = tmp_path / "merged.zarr"
    assert main(["merge", *reversed(shard_paths(folder)), "--out", str(merged)]) == 0
    assert_same_store(merged, folder / "run.zarr", ("tiny-llama",))
    records = json.loads(open_store(merged, model="tiny-llama").attrs["provenance"])
    assert [r.get("shard") for r in records[:2]] == [[0, 2], [1, 2]] and "merge" in records[2]


def test_merge_without_out_refuses_a_shard_store_as_output(launched, tmp_path, capsys):
    folder, _ = launched
    first = shard_paths(folder)[0]
    before = store_history(first)
    assert main(["merge", *shard_paths(folder)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and first in err and "Traceback" not in err
    assert store_history(first) == before  # the shard store is untouched


def test_merge_without_out_still_reads_a_new_first_argument_as_the_output(launched, tmp_path, capsys):
    folder, _ = launched
    merged = tmp_path / "old-form.zarr"
    assert main(["merge", str(merged), *shard_paths(folder)]) == 0
    assert "--out" in capsys.readouterr().err  # a warning names the explicit form
    assert_same_store(merged, folder / "run.zarr", ("tiny-llama",))


def test_merge_help_documents_out(capsys):
    with pytest.raises(SystemExit):
        main(["merge", "--help"])
    assert "--out OUT" in capsys.readouterr().out


@pytest.mark.parametrize("environ, expected", [
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, (0, 4)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "5",
      "SLURM_ARRAY_TASK_MAX": "8"}, (2, 4)),
    ({"RANK": "3", "WORLD_SIZE": "8"}, (3, 8)),
])
def test_auto_reads_a_slurm_array_or_torchrun(environ, expected):
    assert parse_shard("auto", environ).pair() == expected


@pytest.mark.parametrize("environ, named", [
    ({}, ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "RANK", "WORLD_SIZE"]),
    ({"SLURM_ARRAY_TASK_ID": "2"}, ["SLURM_ARRAY_TASK_COUNT unset"]),  # one variable of three
    ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0"}, ["SLURM_ARRAY_TASK_ID=x"]),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "2"},  # ID below MIN
     ["SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_MIN=2", "contiguous"]),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0",  # --array=0-4:2
      "SLURM_ARRAY_TASK_MAX": "4"}, ["contiguous", "SLURM_ARRAY_TASK_MAX=4"]),
    ({"RANK": "2", "WORLD_SIZE": "2"}, ["RANK=2", "WORLD_SIZE=2"]),
    ({"RANK": "0"}, ["WORLD_SIZE unset"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2",
      "SLURM_ARRAY_TASK_MIN": "0"}, ["both", "RANK=0", "SLURM_ARRAY_TASK_ID=0", "--shard k/N"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "3"},
     ["2 processes", "1 GPU(s)"]),  # two processes cannot share one GPU each
])
def test_auto_refuses_a_missing_or_contradictory_environment(environ, named):
    with pytest.raises(ShardError) as refused:
        parse_shard("auto", environ)
    assert all(name in str(refused.value) for name in named), str(refused.value)


def test_torchrun_processes_get_disjoint_gpus():
    node = {"LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert [visible_devices({**node, "LOCAL_RANK": str(i)}) for i in range(2)] == ["4,5", "6,7"]
    assert visible_devices({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}) == "3"  # unset: process i takes GPU i
    # one process on its node keeps every GPU (a model spread by device_map); no torchrun: left as is
    assert visible_devices({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert visible_devices({}) is None


def test_run_refuses_auto_without_a_launcher_exit_2(launched, clean_environment, capsys):
    _, spec = launched
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(spec), "--shard", "auto"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "SLURM_ARRAY_TASK_ID" in err and "WORLD_SIZE" in err and "Traceback" not in err
    clean_environment.setenv("RANK", "5")
    clean_environment.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(spec), "--shard", "auto"])
    assert exit_.value.code == 2 and "RANK=5, WORLD_SIZE=4" in capsys.readouterr().err
