"""A store whose repository metadata is damaged (its branch pointer deleted, truncated or garbled,
a run tag deleted, its config garbled) comes back from its intact snapshots: `verify` names the
damaged file and lists the intact snapshots, `verify --repair` or the rerun itself points the
branch at the newest one, the store then reads as that snapshot did, and the rerun finishes it
as an uninterrupted run would have. Where nothing intact is left, the message says so and what
to delete, and nothing is changed. The scenarios run on a local store and on a store on object
storage (moto on loopback): one body each, over the `store_url` fixture (conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import xarray as xr

import store_drill
from support.stores import TESTS, StoreObjects, comparable
from workbench.cli import main
from workbench.errors import StoreError
from workbench.store import store_history, store_info, verify_store

POINTER = "refs/branch.main/ref.json"


def results(path: Path | str) -> int:
    """(condition, sample) results a store holds, from `store_info`."""
    return sum(c["samples"] for m in store_info(path)["models"].values() for c in m["conditions"].values())


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The drill's store, written without interruption (tagged run-1)."""
    path = tmp_path_factory.mktemp("finished") / "store.zarr"
    assert store_drill.run(str(path)) == 0
    return path


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> Path:
    """The drill killed after its 3rd of 4 commits: 3 results, no run tag yet."""
    path = tmp_path_factory.mktemp("interrupted") / "store.zarr"
    env = {**os.environ, "WORKBENCH_KILL_AT": "store.commit:3", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, str(TESTS / "store_drill.py"), str(path)], env=env, capture_output=True)
    assert proc.returncode == -9, proc.stderr
    return path


def _garble(data: bytes) -> bytes:
    return bytes(b ^ 0xFF for b in data)


DAMAGE: dict[str, Callable[[StoreObjects], None]] = {
    "pointer deleted": lambda s: s.delete(POINTER),
    "pointer truncated": lambda s: s.write(POINTER, s.read(POINTER)[:12]),
    "pointer garbled": lambda s: s.write(POINTER, _garble(s.read(POINTER))),
    # the tag is how a finished store's last snapshot is named; without it the stored snapshots are searched
    "pointer and run tag deleted": lambda s: [s.delete(key) for key in s.keys()
                                              if key == POINTER or (key.startswith("refs/tag.") and key.endswith("/ref.json"))],
    "config garbled": lambda s: s.write("config.yaml", _garble(s.read("config.yaml"))),
}


def _damaged_copy(source: Path, store: str, kind: str) -> tuple[str, dict]:
    """A copy of the local store `source` at `store` (a path or an s3:// URL), damaged."""
    objects = StoreObjects(store)
    objects.copy_from(source)
    tip = store_history(store)[0]
    DAMAGE[kind](objects)
    return store, tip


def _names_what_is_left(out: str, store: Path | str, tip: dict, n_results: int, kind: str) -> None:
    """verify's report: the damaged file, the intact snapshot with its time, tags and results,
    and advice that moves forward (--repair), never back to plain `verify`."""
    assert ("config.yaml" if kind == "config garbled" else POINTER) in out, out
    assert "intact snapshots, newest first:" in out
    line = next(line for line in out.splitlines() if tip["snapshot"] in line and " of " in line)
    assert tip["time"][:19].replace("T", " ") in line, line
    assert f"{n_results} result(s)" in line, line
    tags = ", ".join(tip["tags"]) if "tag" not in kind else ""
    assert f"({tags or 'no tag'};" in line, line
    assert f"workbench verify {store} --repair" in out
    assert f"workbench verify {store}`" not in out  # no advice points back to itself


# every damage to both local stores; on object storage, to the finished one (each case there takes
# seconds of the loopback server's requests)
REPAIR_CASES = [("local", which, kind) for which in ("finished", "interrupted") for kind in DAMAGE]
REPAIR_CASES += [("s3", "finished", kind) if i == 0 else pytest.param("s3", "finished", kind, marks=pytest.mark.slow)
                 for i, kind in enumerate(DAMAGE)]   # the first on every make test, every one in the slow suite


@pytest.mark.parametrize("store_url, which, kind", REPAIR_CASES, indirect=["store_url"])
def test_verify_lists_the_intact_snapshots_and_repair_restores_the_newest(store_url, request, finished, which, kind,
                                                                          capsys):
    source = request.getfixturevalue(which)
    store, tip = _damaged_copy(source, store_url, kind)
    assert main(["verify", str(store), "--no-progress"]) == 1
    _names_what_is_left(capsys.readouterr().out, store, tip, results(source), kind)

    assert main(["verify", str(store), "--no-progress", "--repair"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("repaired: ") and "every chunk read back" in out, out
    assert store_history(store)[0]["snapshot"] == tip["snapshot"]  # the last intact snapshot, as it was
    xr.testing.assert_identical(comparable(store), comparable(source))

    assert store_drill.run(str(store)) == 0  # the rerun captures only what that snapshot lacks
    assert f"wrote {4 - results(source)}" in capsys.readouterr().out
    assert verify_store(store) == []
    xr.testing.assert_identical(comparable(store), comparable(finished))


@pytest.mark.parametrize("store_url, which, kind", [
    *[("local", "interrupted", kind) for kind in ("pointer deleted", "pointer garbled", "config garbled")],
    ("s3", "finished", "pointer deleted"),
], indirect=["store_url"])
def test_the_rerun_repairs_by_itself(store_url, request, finished, which, kind, capsys):
    source = request.getfixturevalue(which)
    store, tip = _damaged_copy(source, store_url, kind)
    assert store_drill.run(store) == 0
    out = capsys.readouterr().out
    assert "repaired: " in out and f"wrote {4 - results(source)}" in out.split("repaired: ")[-1], out
    assert verify_store(store) == []
    xr.testing.assert_identical(comparable(store), comparable(finished))


def test_a_deleted_tag_alone_leaves_the_store_whole(store_url, finished, capsys):
    """The branch still names the last snapshot: nothing to repair, the rerun adds nothing."""
    store = store_url
    objects = StoreObjects(store)
    objects.copy_from(finished)
    objects.delete("refs/tag.run-1/ref.json")
    assert main(["verify", str(store), "--no-progress", "--repair"]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    xr.testing.assert_identical(comparable(store), comparable(finished))
    assert store_drill.run(str(store)) == 0 and "wrote 0" in capsys.readouterr().out
    xr.testing.assert_identical(comparable(store), comparable(finished))


def test_a_repair_stopped_halfway_is_found_and_finished(tmp_path, finished, capsys):
    """A repair killed between putting a fresh pointer in place and moving it leaves the branch at
    the empty first snapshot while the run tag names the last one: found, and repaired."""
    import icechunk

    store = tmp_path / "store.zarr"
    shutil.copytree(finished, store)
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(store)))
    first = list(repo.ancestry(branch="main"))[-1].id
    repo.reset_branch("main", first)
    assert main(["verify", str(store), "--no-progress"]) == 1
    assert "names the repository's first, empty snapshot" in capsys.readouterr().out
    assert main(["verify", str(store), "--no-progress", "--repair"]) == 0
    xr.testing.assert_identical(comparable(store), comparable(finished))


def test_nothing_intact_says_what_to_delete_and_changes_nothing(tmp_path, finished, capsys):
    store = tmp_path / "store.zarr"
    shutil.copytree(finished, store)
    (store / POINTER).unlink()
    for snapshot in (store / "snapshots").iterdir():
        snapshot.write_bytes(_garble(snapshot.read_bytes()))
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}

    assert main(["verify", str(store), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert POINTER in out and "no intact snapshot is left" in out and f"rm -r {store}" in out, out
    assert "workbench verify" not in out

    assert main(["verify", str(store), "--no-progress", "--repair"]) == 1
    err = capsys.readouterr().err
    assert "no intact snapshot is left" in err and f"rm -r {store}" in err and "workbench verify" not in err, err
    with pytest.raises(StoreError) as refused:  # the rerun says the same, and writes nothing
        store_drill.run(str(store))
    assert f"rm -r {store}" in (refused.value.hint or "") and "verify" not in refused.value.user_message()
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
