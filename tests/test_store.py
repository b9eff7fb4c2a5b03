"""The store is the truth: atomic commits under kill -9 at every write, consistent readers during
a live run, checksums and `verify`, refusals of silent mixing, bad paths and names, and disk
failures that keep what was committed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import store_drill
import workbench
from support.stores import ROOT, TESTS, assert_same_store
from workbench.cli import main
from workbench.store import StoreWriter, open_store, store_info, verify_store


def samples_by_condition(ds: xr.Dataset) -> dict[str, list[str]]:
    conditions = [str(c) for c in ds.run_condition.values]
    samples = [str(s) for s in ds.run_sample.values]
    return {c: [s for s, cc in zip(samples, conditions) if cc == c] for c in dict.fromkeys(conditions)}


def assert_committed_prefix(seen: xr.Dataset, full: xr.Dataset) -> int:
    """`seen` holds, per condition, a prefix of `full`'s samples, each with all its rows and the
    same values. Returns how many (condition, sample) results it holds."""
    got, want = samples_by_condition(seen), samples_by_condition(full)
    total = 0
    for condition, samples in got.items():
        assert samples == want[condition][: len(samples)], condition
        total += len(samples)
        for sample in samples:
            a = seen.sel(condition=condition, sample=sample).reset_index("token")
            b = full.sel(condition=condition, sample=sample).reset_index("token")
            np.testing.assert_array_equal(a.position.values, b.position.values)
            np.testing.assert_array_equal(a.hidden.values, b.hidden.values)
    return total


@pytest.fixture(scope="module")
def drill_store(tmp_path_factory) -> Path:
    """The drill's store, written without interruption."""
    path = tmp_path_factory.mktemp("drill") / "reference.zarr"
    assert store_drill.run(str(path)) == 0
    return path


# -- atomic commits --------------------------------------------------------------------------


@pytest.mark.slow  # ~2 min: 130+ kill points (CI runs it: make test-slow)
def test_kill_after_every_write_leaves_the_last_commit_and_resumes_identical(tmp_path, drill_store):
    """kill -9 after write 1, 2, ..., N of a small run (every write the store makes: group and
    array metadata, chunks, resizes), each from a fresh store. A reader of each killed store sees
    exactly a committed prefix; each rerun gives a store identical to the uninterrupted one."""
    folder = tmp_path / "kills"
    done = subprocess.run([sys.executable, str(TESTS / "store_drill.py"), "--kill-every", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    *killed, last = rows
    assert last["killed"] == 0 and len(killed) > 50, rows[-3:]  # the run has many write points
    assert all(r["killed"] == -9 and r["resumed"] == 0 for r in killed), [r for r in killed if r["resumed"]]
    full = open_store(drill_store, model=store_drill.MODEL).load()
    seen_counts = set()
    for r in killed:
        store = folder / f"kill-{r['n']}.zarr"
        assert_same_store(store, drill_store, (store_drill.MODEL,))
        before = folder / f"kill-{r['n']}.killed.zarr"
        if not workbench.store.list_models(before):
            seen_counts.add(0)  # killed before the first commit: nothing to see
            continue
        seen_counts.add(assert_committed_prefix(open_store(before, model=store_drill.MODEL).load(), full))
    assert seen_counts == {0, 1, 2, 3}  # kills landed before each of the 4 commits


@pytest.mark.parametrize("premade", [False, True], ids=["new path", "empty directory"])
def test_kill_while_creating_the_store_resumes_identical(tmp_path, drill_store, premade):
    """icechunk writes a new repository's first snapshot before its branch: killed in between
    (seen in CI, a kill mid-trace landing there), the store path must not be left a non-empty
    directory that is not a store, which the rerun refuses. The store is created beside its path
    and renamed into place (onto the empty directory a user may have made)."""
    store = tmp_path / "new.zarr"
    if premade:
        store.mkdir()
    killed = subprocess.run([sys.executable, str(TESTS / "store_drill.py"), str(store)], cwd=ROOT,
                            env={**os.environ, "WORKBENCH_KILL_AT": "store.create:1"}, timeout=300)
    assert killed.returncode == -9
    assert not store.exists() or not any(store.iterdir())
    assert (tmp_path / "new.zarr.creating").is_dir()  # the killed creation, left beside it
    workbench.store.check_store_path(store)  # the path is still fit for a store
    assert store_drill.run(str(store)) == 0
    assert not (tmp_path / "new.zarr.creating").exists()
    assert_same_store(store, drill_store, (store_drill.MODEL,))


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_reader_loop_during_a_live_run_sees_only_committed_prefixes(tmp_path, workbench_cache, drill_store):
    """A reader in a loop while `workbench run` writes: every open succeeds, and every read is a
    committed prefix of the final store with complete rows."""
    # the reader's first open pays for imports (~1 s): paid before the run starts, or the run's
    # commits (tens of ms each) may all land during that one read
    open_store(drill_store, model=store_drill.MODEL).load()
    store = tmp_path / "live.zarr"
    spec = tmp_path / "live.yaml"
    spec.write_text(f"""\
name: live
models: [tiny-llama]
data: {{source: builtin, n: 6}}
conditions:
  baseline: {{}}
  scaled: {{interventions: [{{kind: scale, site: layer, layers: [1], factor: 2.0, positions: all}}]}}
  zeroed: {{interventions: [{{kind: zero, site: layer, layers: [1], positions: text}}]}}
capture: [{{site: layer, layers: all}}]
store: {{path: {store}}}
backend: {{commit_interval_s: 0}}  # a commit per result: many states for the reader to meet
""")
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(spec), "--no-progress", "--no-table"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reads, failures, seen = 0, [], []
    while proc.poll() is None:
        if not (store / "refs").exists():
            time.sleep(0.02)
            continue
        try:
            names = workbench.store.list_models(store)
            if names:
                seen.append(open_store(store, model="tiny-llama").load())
            reads += 1
        except Exception as err:  # noqa: BLE001 - any failure of a reader is what this test counts
            failures.append(repr(err))
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert failures == []
    full = open_store(store, model="tiny-llama").load()
    counts = [assert_committed_prefix(ds, full) for ds in seen]
    assert reads >= 5 and len(set(counts)) >= 3, (reads, counts)  # it read while the run progressed
    assert counts == sorted(counts)


# -- checksums and verify --------------------------------------------------------------------


def _chunk_files(store: Path) -> list[Path]:
    return sorted((store / "chunks").iterdir(), key=lambda f: (-f.stat().st_size, f.name))


def _flip(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _garble(file: Path) -> None:
    """Invert the middle half of a file. One flipped byte is not enough for a snapshot: it can
    land in a zstd literal (a name or attribute text), which decompresses into a snapshot that
    still parses (seen in about 1 of 25 runs)."""
    data = bytearray(file.read_bytes())
    for i in range(len(data) // 4, 3 * len(data) // 4):
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))


def _live_snapshot(store: Path) -> Path:
    ref = json.loads((store / "refs" / "branch.main" / "ref.json").read_text())
    return store / "snapshots" / ref["snapshot"]


def _live_manifest(store: Path) -> Path:
    """A manifest the branch's snapshot uses (older ones may be unreferenced)."""
    from workbench.store import _open_repo

    repo = _open_repo(store)
    info = json.loads(repo.inspect_snapshot(repo.lookup_branch("main")))
    return store / "manifests" / info["manifests"][0]["id"]


DAMAGE = {
    "chunk deleted": lambda s: _chunk_files(s)[0].unlink(),
    "chunk truncated": lambda s: _chunk_files(s)[0].write_bytes(_chunk_files(s)[0].read_bytes()[:100]),
    "chunk bit-flipped": lambda s: _flip(_chunk_files(s)[0]),
    "manifest deleted": lambda s: _live_manifest(s).unlink(),
    "snapshot garbled": lambda s: _garble(_live_snapshot(s)),
    "snapshot deleted": lambda s: _live_snapshot(s).unlink(),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_verify_reports_damage_and_a_rerun_restores(tmp_path, drill_store, kind, capsys):
    store = tmp_path / "damaged.zarr"
    shutil.copytree(drill_store, store)
    assert main(["verify", str(store), "--no-progress"]) == 0
    assert "every chunk read back" in capsys.readouterr().out
    DAMAGE[kind](store)
    assert main(["verify", str(store), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "damaged" in out
    if kind.startswith("chunk"):
        # named by model, condition, variable and row range, with the samples it holds
        assert "drill--model | " in out and "| hidden | rows " in out and "drill/00" in out, out
    assert store_drill.run(str(store)) == 0  # the rerun
    assert verify_store(store) == []
    assert_same_store(store, drill_store, (store_drill.MODEL,))


def test_runner_rerun_recaptures_a_damaged_condition(tmp_path, workbench_cache):
    """Through `workbench run`: a bit-flipped chunk is found, its condition dropped and captured
    again, and the store equals the undamaged one."""
    store = tmp_path / "run.zarr"
    spec = write_llama_spec(tmp_path, store)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    pristine = tmp_path / "pristine.zarr"
    shutil.copytree(store, pristine)
    _flip(_chunk_files(store)[0])
    assert main(["verify", str(store), "--no-progress"]) == 1
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    assert verify_store(store) == []
    assert_same_store(store, pristine, ("tiny-llama",))


def _flip_keeping_stat(file: Path) -> bytes:
    """A bit flip that keeps the file's size and mtime (what bit rot looks like); returns the
    original bytes."""
    stat, data = file.stat(), file.read_bytes()
    _flip(file)
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return data


def _restore(file: Path, data: bytes) -> None:
    stat = file.stat()
    file.write_bytes(data)
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_run_start_reads_only_the_chunks_committed_since_its_last_check(tmp_path, workbench_cache, capsys):
    """A run's start records what it checked (`<store>.verified`); the next start reads only the
    chunks committed since, unless a recorded file changed. Shown by damage that keeps size and
    mtime: in a chunk written since the check it is found (and the run repairs it); in an older
    chunk it is not read (`workbench verify` reads everything and finds it), until the file's
    mtime says it was touched: then the start reads every chunk again."""
    from workbench import verified
    from workbench.store import StoreWriter

    store = tmp_path / "run.zarr"
    spec = write_llama_spec(tmp_path, store)
    assert main(["run", str(spec), "--no-progress", "--no-table", "--limit", "1"]) == 0
    assert verified.load(store) is None  # a new store: nothing was checked at its start
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0  # checks all, records, adds sample 2
    ledger = verified.load(store)
    assert ledger is not None and set(ledger.files) <= set(verified.file_stats(store))
    pristine = tmp_path / "pristine.zarr"
    shutil.copytree(store, pristine)
    new = [f for f in _chunk_files(store) if f"chunks/{f.name}" not in ledger.files]
    old = [f for f in _chunk_files(store) if f"chunks/{f.name}" in ledger.files]
    assert new and old

    # damage in a chunk committed since the check: read, found, and repaired by the run
    newest = new[0]  # the largest: a hidden-state chunk of the second run
    original = _flip_keeping_stat(newest)
    with StoreWriter(store) as writer:
        found = writer.damage_since_check()
    assert writer.checked.startswith("the ") and "since the last check" in writer.checked
    assert [d.variable for d in found] == ["hidden"], found
    _restore(newest, original)

    # the same damage in an older chunk that the snapshot still uses: not read at the start
    referenced = None
    for file in old:
        before = file.stat()
        original = _flip_keeping_stat(file)
        if verify_store(store):
            referenced = file
            break
        _restore(file, original)
    assert referenced is not None, "no chunk of the first run is still in use"
    with StoreWriter(store) as writer:
        assert writer.damage_since_check() == [] and "since the last check" in writer.checked
    # a changed mtime (the file was touched): every chunk is read and the damage found
    os.utime(referenced)
    with StoreWriter(store) as writer:
        found = writer.damage_since_check()
    assert writer.checked == "every chunk" and found
    _restore(referenced, original)
    os.utime(referenced, ns=(before.st_atime_ns, before.st_mtime_ns))  # as recorded again

    # through `workbench run`: the fresh damage is found by the incremental check and repaired
    _flip_keeping_stat(newest)
    capsys.readouterr()
    assert main(["run", str(spec), "--no-progress", "--no-table", "-v"]) == 0
    err = capsys.readouterr().err
    assert "store check: read the " in err and "since the last check" in err and "repaired: tiny-llama/" in err, err
    assert verify_store(store) == []
    assert_same_store(store, pristine, ("tiny-llama",))


def test_compaction_keeps_the_check_record_usable(tmp_path, workbench_cache, monkeypatch):
    """A run's compaction deletes chunk files the record of its start check lists (superseded
    versions from the run before): they leave the record, so the next start still reads only what
    is new instead of taking the missing files for damage."""
    from workbench import verified

    store = tmp_path / "run.zarr"
    spec = write_llama_spec(tmp_path, store)
    spec.write_text(spec.read_text().replace("n: 2", "n: 3") + "backend: {commit_interval_s: 0}\n")
    monkeypatch.setenv("WORKBENCH_COMPACT_GRACE_S", "3600")  # the first run's superseded chunk versions kept
    assert main(["run", str(spec), "--no-progress", "--no-table", "--limit", "2"]) == 0
    after_first = verified.file_stats(store)
    monkeypatch.delenv("WORKBENCH_COMPACT_GRACE_S")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0  # records its check, compacts
    ledger, now = verified.load(store), verified.file_stats(store)
    assert set(after_first) - set(now), "compaction deleted nothing"
    assert set(ledger.files) == set(after_first) & set(now) and not ledger.changed(now)
    with StoreWriter(store) as writer:
        assert writer.damage_since_check() == [] and "since the last check" in writer.checked


# -- no silent mixing ------------------------------------------------------------------------

LLAMA_SPEC = """\
name: mixing
models: [tiny-llama]
data: {{source: builtin, n: 2, seed: {seed}}}
conditions:
  baseline: {{}}
  scaled: {{interventions: [{{kind: scale, site: layer, layers: [1], factor: {factor}, positions: all}}]}}
capture: [{{site: layer, layers: [0, 1]}}]
store: {{path: {store}}}
"""


def write_llama_spec(folder: Path, store: Path, factor: float = 2.0, seed: int = 0, name: str = "spec.yaml") -> Path:
    spec = folder / name
    spec.write_text(LLAMA_SPEC.format(store=store, factor=factor, seed=seed))
    return spec


@pytest.fixture(scope="module")
def mixing_store(tmp_path_factory, workbench_cache) -> Path:
    folder = tmp_path_factory.mktemp("mixing")
    store = folder / "store.zarr"
    assert main(["run", str(write_llama_spec(folder, store)), "--no-progress", "--no-table", "--limit", "1"]) == 0
    return store


@pytest.mark.parametrize("change, expected", [
    ({"factor": 5.0}, "factor=2.0"),
    ({"seed": 3}, "data.seed: stored 0, now 3"),
    ({"dtype": "bfloat16"}, "dtype: stored \"float32\", now \"bfloat16\""),
])
def test_a_resume_with_another_meaning_is_refused(tmp_path, mixing_store, change, expected, capsys):
    store = tmp_path / "store.zarr"
    shutil.copytree(mixing_store, store)
    before = store_info(store)
    args = {k: v for k, v in change.items() if k in ("factor", "seed")}
    spec = write_llama_spec(tmp_path, store, **args)
    extra = ["--dtype", change["dtype"]] if "dtype" in change else []
    assert main(["run", str(spec), "--no-progress", "--no-table", *extra]) == 2
    err = capsys.readouterr().err
    assert expected in err and "new store" in err and "Traceback" not in err, err
    assert store_info(store)["models"] == before["models"] and verify_store(store) == []


def test_a_changed_input_under_the_same_id_is_refused(tmp_path, workbench_cache, capsys):
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(images / "a.png")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "image": str(images / "a.png"), "question": "What colour?"}) + "\n")
    store = tmp_path / "store.zarr"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: files\nmodels: [tiny-qwen3vl]\ndata: {{source: jsonl, path: {data}, n: 1}}\n"
                    f"conditions: {{baseline: {{}}}}\ncapture: [{{site: layer, layers: [0]}}]\nstore: {{path: {store}}}\n")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    Image.new("RGB", (32, 32), "blue").save(images / "a.png")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 2
    assert "changed since they were stored" in capsys.readouterr().err


def test_provenance_records_the_effective_spec_and_command_and_run_tags_read_back(tmp_path, mixing_store, capsys):
    store = tmp_path / "store.zarr"
    shutil.copytree(mixing_store, store)
    spec = write_llama_spec(tmp_path, store)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0  # the second sample
    record = json.loads(open_store(store, model="tiny-llama").attrs["provenance"])
    assert [r["effective_spec"]["data"]["n"] for r in record] == [1, 2]  # --limit 1, then the spec's n
    assert record[0]["overrides"]["limit"] == 1 and record[0]["spec_name"] == record[1]["spec_name"] == "mixing"
    assert all("command" in r for r in record)
    assert len(samples_by_condition(open_store(store, model="tiny-llama", snapshot="run-1"))["baseline"]) == 1
    assert len(samples_by_condition(open_store(store, model="tiny-llama", snapshot="run-2"))["baseline"]) == 2
    assert main(["info", str(store), "--history"]) == 0
    out = capsys.readouterr().out
    # the background writer gathers a run's results into few commits, each naming what it holds
    assert "run-1" in out and "run-2" in out and "tiny-llama | baseline + scaled | builtin/color/001" in out


# -- names and paths -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", "zarr.json", "_analyses", "layer", "sample"])
def test_reserved_condition_names_are_refused_in_the_spec(tmp_path, name, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: n\nmodels: [tiny-llama]\nconditions:\n  '{name}': {{}}\ncapture: [{{site: layer}}]\n"
                    f"store: {{path: {tmp_path / 'store.zarr'}}}\n")
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:4: conditions" in err and "expected" in err, err
    assert not (tmp_path / "store.zarr").exists()


@pytest.mark.parametrize("name", ["condition", "layer", "sample", "position", "token"])
def test_reserved_sweep_variables_are_refused_in_the_spec(tmp_path, name, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: n\nmodels: [tiny-llama]\nconditions:\n  a:\n    sweep: {{{name}: [1.0, 2.0]}}\n"
                    f"    interventions: [{{kind: scale, site: layer, layers: [1], factor: ${name}}}]\n"
                    f"capture: [{{site: layer}}]\nstore: {{path: {tmp_path / 'store.zarr'}}}\n")
    assert main(["run", str(spec), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "reserved" in err and f"{spec}:5" in err, err
    assert not (tmp_path / "store.zarr").exists()


def _bad_path(kind: str, tmp_path: Path, existing: Path) -> Path:
    if kind == "a file":
        (tmp_path / "file.zarr").write_text("not a store")
        return tmp_path / "file.zarr"
    if kind == "a non-store directory":
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "keep.txt").write_text("precious")
        return tmp_path / "notes"
    return existing / "model"  # inside another store


@pytest.mark.parametrize("kind, message", [
    ("a file", "is a file"),
    ("a non-store directory", "not a workbench store"),
    ("inside a store", "lies inside the store"),
])
def test_bad_store_paths_are_refused_before_anything_is_written(tmp_path, mixing_store, kind, message, capsys):
    existing = tmp_path / "existing.zarr"
    shutil.copytree(mixing_store, existing)
    target = _bad_path(kind, tmp_path, existing)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    spec = write_llama_spec(tmp_path, target, name="bad.yaml")
    before.append(spec.relative_to(tmp_path))
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 2
    err = capsys.readouterr().err
    assert message in err and "hint:" in err and "Traceback" not in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == sorted(before)


def test_a_symlinked_store_path_shares_the_lock(tmp_path, mixing_store, capsys):
    store = tmp_path / "store.zarr"
    shutil.copytree(mixing_store, store)
    link = tmp_path / "link.zarr"
    link.symlink_to(store)
    with StoreWriter(store):
        spec = write_llama_spec(tmp_path, link)
        assert main(["run", str(spec), "--no-progress", "--no-table"]) == 1
    assert "being written by another workbench process" in capsys.readouterr().err


# -- disk failures ---------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _runs_stored(store: Path) -> int:
    if not workbench.store.is_store(store):
        return 0
    info = store_info(store)
    return sum(c["samples"] for m in info["models"].values() for c in m["conditions"].values())


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_a_full_disk_stops_with_a_message_and_the_rerun_finishes(tmp_path, small_tmpfs, mixing_store, capsys):
    store = small_tmpfs / "store.zarr"
    spec = write_llama_spec(tmp_path, store)
    # 24 samples x 2 conditions: more than 1 MB even with format 3's few arrays and paced commits
    spec.write_text(spec.read_text().replace("n: 2", "n: 24"))
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 1
    err = capsys.readouterr().err
    assert "the disk is full" in err and "keeps its last commit" in err and "rerun" in err, err
    # the estimate warned before the run (captures past the tmpfs's free space), then the message and its hint
    warning, *rest = err.strip().splitlines()
    assert warning.startswith("warning: this run's captures are estimated at") and "free on the disk" in warning, err
    assert len(rest) == 2 and "Traceback" not in err
    kept = _runs_stored(store)
    subprocess.run(["mount", "-o", "remount,size=256m", str(small_tmpfs)], check=True)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    assert f"skipped {kept} of 48" in capsys.readouterr().out
    assert verify_store(store) == []


def test_a_read_only_disk_stops_with_a_message(tmp_path, small_tmpfs, mixing_store, capsys):
    store = small_tmpfs / "store.zarr"
    shutil.copytree(mixing_store, store)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    spec = write_llama_spec(tmp_path, store)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 1
    err = capsys.readouterr().err
    assert "read-only" in err and "nothing was written" in err and "Traceback" not in err, err
    assert _runs_stored(store) == 2
    subprocess.run(["mount", "-o", "remount,rw,size=256m", str(small_tmpfs)], check=True)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0  # the rerun finishes the job
    assert _runs_stored(store) == 4 and verify_store(store) == []


def test_a_file_size_limit_stops_with_a_message(tmp_path, workbench_cache):
    import resource

    from workbench.models.tiny import tiny_model_dir

    tiny_model_dir("tiny-llama")  # built beforehand: its weights are over the limit
    store = tmp_path / "store.zarr"
    spec = write_llama_spec(tmp_path, store)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))  # under the largest chunk files

    done = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(spec), "--no-progress", "--no-table"],
                          cwd=ROOT, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "exceeds the size limit" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    assert verify_store(store) == []
