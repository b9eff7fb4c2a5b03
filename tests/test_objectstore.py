"""Stores on object storage (s3://bucket/prefix), tested against a real S3-compatible server
(moto's server mode) on loopback: several writers commit to one store at once, a commit that
loses the race is re-staged on the new branch tip, resume reads what is committed, and bad URLs
or endpoints are refused in one line before anything is written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import store_drill
from support.stores import BUCKET, ROOT, bucket_keys, s3_client
from workbench.cli import main
from workbench.errors import StoreError, StorePathError
from workbench.store import StoreWriter, open_store, store_history, store_info, verify_store

# the loopback S3 server and a fresh store URL on it: the fixtures `s3_server` and `s3` (conftest.py)


# -- what a result looks like when read back ------------------------------------------------------


def per_result(path: str | Path, model: str) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """(condition, sample) -> every per-token and per-run variable and label of that result, read
    by its labels, so two stores compare whatever order their samples were committed in. Also
    checks that each result's token rows are contiguous in its condition's arrays."""
    ds = open_store(path, model=model, index=False).load()
    out: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    conditions, samples = _words(ds.run_condition.values), _words(ds.run_sample.values)
    token_conditions, token_samples = _words(ds.condition.values), _words(ds.sample.values)
    for condition, sample in zip(conditions, samples):
        key = (condition, sample)
        assert key not in out, f"{key} stored twice"
        tokens = np.flatnonzero((token_conditions == condition) & (token_samples == sample))
        assert len(tokens) and np.all(np.diff(tokens) == 1), f"{key}: token rows not contiguous"
        runs = np.flatnonzero((conditions == condition) & (samples == sample))
        result = {}
        for name, var in ds.variables.items():
            if var.dims and var.dims[0] == "token":
                result[name] = _plain(var.values[tokens])
            elif var.dims and var.dims[0] == "run" and name not in ("run_condition", "run_sample"):
                result[name] = _plain(var.values[runs])
        out[key] = result
    return out


def _plain(values: np.ndarray) -> np.ndarray:
    return _words(values) if values.dtype.kind in "TUO" else values


def _words(values: np.ndarray) -> np.ndarray:
    return np.array([str(v) for v in values], dtype=object)


def assert_same_results(a: str | Path, b: str | Path, model: str, atol: float = 0.0) -> int:
    got, want = per_result(a, model), per_result(b, model)
    assert sorted(got) == sorted(want)
    for key, variables in want.items():
        assert sorted(got[key]) == sorted(variables), key
        for name, values in variables.items():
            if values.dtype.kind == "f":
                np.testing.assert_allclose(got[key][name], values, atol=atol, rtol=0, err_msg=f"{key} {name}")
            else:
                np.testing.assert_array_equal(got[key][name], values, err_msg=f"{key} {name}")
    return len(want)


# -- two writers, one store ------------------------------------------------------------------


def _declare(store: StoreWriter, spec_name: str) -> None:
    store.ensure_model(store_drill.MODEL, {"family": "drill", "n_layers": 2, "hidden_size": 128,
                                           "dtype": "float32", "device": "cpu"})
    store.add_provenance({"spec_name": spec_name})


def _drill_result(c: int, s: int) -> tuple:
    name, sweep = list(store_drill.CONDITIONS.items())[c]
    sample, n = store_drill.SAMPLES[s]
    return (store_drill.MODEL, name, sample, store_drill.sample_variables(c, s, n),
            {"sweep": sweep, "identity": store_drill.identity(sweep)}, f"input-{s}")


def test_a_writer_with_a_stale_layout_appends_after_the_other_writers_rows(s3, tmp_path):
    """Writer B commits to a condition (and caches its layout), writer A appends to it, B
    appends again: B must start from the branch tip A left, not its cached row counts (which
    would overwrite A's rows). Every result is stored once, contiguous, equal to the drill's
    local store; both provenance records are kept; each writer tags its own run."""
    url = s3()
    with StoreWriter(url) as a, StoreWriter(url) as b:
        assert a.shared and b.shared
        _declare(a, "writer-a")
        _declare(b, "writer-b")
        b.write_samples([_drill_result(0, 0)])                       # creates the store
        a.write_samples([_drill_result(0, 1), _drill_result(1, 0)])
        b.write_samples([_prefixed(_drill_result(0, 0), "b/"), _drill_result(1, 1)])   # B's cache is stale
        tags = {a.finish_run(), b.finish_run()}
    assert tags == {"run-1", "run-2"}
    got = per_result(url, store_drill.MODEL)
    local = tmp_path / "drill.zarr"
    assert store_drill.run(str(local)) == 0
    want = per_result(local, store_drill.MODEL)
    want[("baseline", "b/drill/000")] = want[("baseline", "drill/000")]
    assert sorted(got) == sorted(want)
    for key, variables in want.items():
        for name in ("hidden", "position", "modality", "token_id", "logprobs", "n_tokens", "nonfinite"):
            np.testing.assert_array_equal(got[key][name], variables[name], err_msg=f"{key} {name}")
    assert verify_store(url) == []
    assert store_info(url)["runs"] == 2


def test_an_interrupted_creation_is_named_with_what_to_do(s3, s3_server, tmp_path, monkeypatch):
    """A writer killed while creating a store on object storage leaves its first snapshot and no
    branch (icechunk writes them in that order; there is no rename to make it atomic). No one can
    create a repository over it: the next writer waits for a branch, then says what lies there
    and what to do, and writes nothing; once it is deleted, the store is written."""
    import icechunk

    first = tmp_path / "first"
    icechunk.Repository.create(icechunk.local_filesystem_storage(str(first)))
    snapshot = next((first / "snapshots").iterdir())
    url = s3()
    prefix = url.removeprefix(f"s3://{BUCKET}/")
    client = s3_client(s3_server)
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/snapshots/{snapshot.name}", Body=snapshot.read_bytes())
    monkeypatch.setattr("workbench.store.writer.CREATE_WAIT_S", 1.0)
    with StoreWriter(url) as writer, pytest.raises(StorePathError) as err:
        _declare(writer, "after-a-kill")
        writer.write_samples([_drill_result(0, 0)])
    assert "no branch after 1 s" in str(err.value) and "killed while creating" in str(err.value)
    assert f"aws s3 rm --recursive {url}" in err.value.hint
    assert bucket_keys(s3_server, prefix) == [f"{prefix}/snapshots/{snapshot.name}"]  # nothing written
    client.delete_object(Bucket=BUCKET, Key=f"{prefix}/snapshots/{snapshot.name}")
    with StoreWriter(url) as writer:
        _declare(writer, "after-the-delete")
        writer.write_samples([_drill_result(0, 0)])
        writer.finish_run()
    assert verify_store(url) == []


def test_a_commit_that_loses_the_race_is_retried(s3, tmp_path):
    """Two writers stage the same condition from the same tip; A commits first, B's commit
    conflicts (the same arrays' metadata and last chunks) and is re-staged after A's rows."""
    url = s3()
    with StoreWriter(url) as a, StoreWriter(url) as b:
        _declare(a, "writer-a")
        _declare(b, "writer-b")
        a.write_samples([_drill_result(0, 0), _drill_result(1, 0)])
        b_results = [_drill_result(0, 1), _drill_result(1, 1)]
        b._stage()  # B's session opens on A's commit...
        a.write_samples([_prefixed(_drill_result(0, 1), "a/")])  # ...which A moves on before B commits
        b.write_samples(b_results)  # staged on the old tip first: refused, then re-staged on the new one
        assert b.conflicts == 1 and a.conflicts == 0
    history = store_history(url)
    assert any(h["message"].endswith("(try 2)") for h in history)
    got = per_result(url, store_drill.MODEL)
    assert sorted(got) == sorted([("baseline", "drill/000"), ("alpha=0.5", "drill/000"), ("baseline", "a/drill/001"),
                                  ("baseline", "drill/001"), ("alpha=0.5", "drill/001")])
    local = tmp_path / "drill.zarr"
    assert store_drill.run(str(local)) == 0
    want = per_result(local, store_drill.MODEL)
    for key in want:
        np.testing.assert_array_equal(got[key]["hidden"], want[key]["hidden"])
        np.testing.assert_array_equal(got[key]["token_id"], want[key]["token_id"])
    np.testing.assert_array_equal(got[("baseline", "a/drill/001")]["hidden"], want[("baseline", "drill/001")]["hidden"])
    records = [r["spec_name"] for r in json.loads(open_store(url, model=store_drill.MODEL).attrs["provenance"])]
    assert sorted(records) == ["writer-a", "writer-b"]
    assert verify_store(url) == []


def _prefixed(result: tuple, prefix: str) -> tuple:
    return result[:2] + (prefix + result[2],) + result[3:]


# -- sharded runs through the command line ------------------------------------------------------

SPEC = """\
name: shards-s3
models: [{model}]
data: {{source: builtin, n: {n}}}
conditions:
  baseline: {{}}
  alpha:
    sweep: {{alpha: [2.0]}}
    interventions: [{{kind: scale, site: projector, factor: $alpha, positions: vision}}]
capture: [{{site: layer, layers: all}}]
store: {{path: {store}}}
backend: {{device: cpu, dtype: float32, commit_interval_s: 0, write_queue_mb: 0}}
"""


def run_shards_at_once(spec: Path, n: int, *extra: str) -> list[subprocess.CompletedProcess]:
    """`workbench run SPEC --shard k/n` for every k, all started at once; each one's outcome."""
    procs = [subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(spec), "--shard", f"{k}/{n}",
                               "--no-progress", "--no-table", *extra], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(n)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate()) for p in procs]


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_two_shards_commit_to_one_object_store_and_equal_a_single_local_run(s3, tmp_path, monkeypatch, capsys):
    """`run --shard 0/2` and `--shard 1/2` at once, committing per forward to one s3:// store:
    every (condition, sample) result is stored exactly once, each variable and label equal to a
    single local run's, `verify` clean, `analyze` reads it; a rerun of the whole spec skips
    everything."""
    url = s3("shards")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model="tiny-smolvlm", n=4, store=url))
    for done in run_shards_at_once(spec, 2):
        assert done.returncode == 0, done.stderr
        assert "into " + url in done.stdout
    local = tmp_path / "single.zarr"
    assert main(["run", str(spec), "--store", str(local), "--no-progress", "--no-table"]) == 0
    assert assert_same_results(url, local, "tiny-smolvlm") == 8
    assert verify_store(url) == []
    records = [r.get("shard") for r in json.loads(open_store(url, model="tiny-smolvlm").attrs["provenance"])]
    assert sorted(records) == [[0, 2], [1, 2]]
    assert {t for h in store_history(url) for t in h["tags"]} == {"run-1", "run-2"}
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["analyze", url]) == 0
    assert "vision" in capsys.readouterr().out
    assert not (tmp_path / "s3:").exists()  # no analysis cache under a local path named like the URL
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    assert "wrote 0 and skipped 8 of 8" in capsys.readouterr().out


# -- bad URLs and endpoints ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("url", ["s3://", "s3:///stores/x.zarr", "s3://bucket-only"])
def test_a_url_without_bucket_or_prefix_is_bad_input(s3, tmp_path, monkeypatch, capsys, url):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model="tiny-smolvlm", n=1, store=url))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 2
    err = capsys.readouterr().err
    assert f"store URL {url!r} needs a bucket and a prefix" in err and "s3://BUCKET/PREFIX" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no local "s3:" folder either
    with pytest.raises(StorePathError, match="needs a bucket"):
        open_store(url)


def test_an_endpoint_nothing_answers_at_is_refused_at_once(s3, s3_server, tmp_path, monkeypatch, capsys):
    url = s3()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model="tiny-smolvlm", n=1, store=url))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: cannot reach the object store of {url} at http://127.0.0.1:"), err
    assert "AWS_ENDPOINT_URL" in err[1]
    for command in (["info", url], ["verify", url]):
        assert main(command) == 1
        assert "cannot reach the object store" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    assert bucket_keys(s3_server, url.split("/", 3)[3]) == []


def test_a_missing_bucket_is_named(s3, tmp_path, capsys):
    url = "s3://no-such-bucket-here/x.zarr"
    with pytest.raises(StoreError, match="no-such-bucket-here") as err:
        store_info(url)
    assert "bucket" in err.value.hint


@pytest.mark.slow  # ~30 s: three shards of tiny-qwen3vl, one killed and resumed, and a single local run
def test_a_killed_shard_resumes_into_the_shared_store(s3, tmp_path):
    """Three shards at once on one s3:// store; shard 1 is killed (SIGKILL) right after its
    second commit, while the others keep committing. Rerunning shard 1 skips what it committed
    and stores the rest; the store then equals a single local run, every result once."""
    url = s3("killed")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model="tiny-qwen3vl", n=6, store=url))
    procs = []
    for k in range(3):
        env = {**os.environ, **({"WORKBENCH_KILL_AT": "store.commit:2"} if k == 1 else {})}
        procs.append(subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(spec), "--shard", f"{k}/3",
                                       "--no-progress", "--no-table"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    codes = [p.wait(timeout=600) for p in procs]
    assert codes[0] == codes[2] == 0 and codes[1] == -9, [p.communicate() for p in procs]
    assert len(per_result(url, "tiny-qwen3vl")) == 10  # shards 0 and 2: 2 samples x 2 conditions each; shard 1: 2 commits of 1
    resumed = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(spec), "--shard", "1/3",
                              "--no-progress", "--no-table"], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "wrote 2 and skipped 2 of 4" in resumed.stdout
    local = tmp_path / "single.zarr"
    assert main(["run", str(spec), "--store", str(local), "--no-progress", "--no-table"]) == 0
    assert assert_same_results(url, local, "tiny-qwen3vl") == 12
    assert verify_store(url) == []
