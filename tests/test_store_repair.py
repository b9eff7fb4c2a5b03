"""A store whose repository metadata is damaged (its branch pointer deleted, truncated or garbled,
a run tag deleted, its config garbled) comes back from its intact snapshots: `verify` names the
damaged file and lists the intact snapshots, `verify --repair` or the rerun itself points the
branch at the newest one, the store then reads as that snapshot did, and the rerun finishes it
as an uninterrupted run would have. Where nothing intact is left, the message says so and what
to delete, and nothing is changed. Local stores and a store on object storage (moto on loopback)."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import xarray as xr

import store_drill
from workbench.cli import main
from workbench.errors import StoreError
from workbench.store import open_store, store_history, store_info, verify_store

TESTS = Path(__file__).resolve().parent
POINTER = "refs/branch.main/ref.json"
BUCKET = "workbench-repair-tests"
_prefixes = itertools.count()


def comparable(path: Path | str, model: str = store_drill.MODEL) -> xr.Dataset:
    """A model's Dataset, loaded, labels as plain coordinates, provenance dropped (a resumed store
    holds one record more than an uninterrupted one)."""
    ds = open_store(path, model=model).load()
    ds.attrs.pop("provenance")
    return ds.reset_index([d for d in ("token", "run") if d in ds.indexes])


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


def _garble(file: Path) -> None:
    file.write_bytes(bytes(b ^ 0xFF for b in file.read_bytes()))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "pointer deleted": lambda s: (s / POINTER).unlink(),
    "pointer truncated": lambda s: (s / POINTER).write_bytes((s / POINTER).read_bytes()[:12]),
    "pointer garbled": lambda s: _garble(s / POINTER),
    # the tag is how a finished store's last snapshot is named; without it the stored snapshots are searched
    "pointer and run tag deleted": lambda s: [f.unlink() for f in [s / POINTER, *(s / "refs").glob("tag.*/ref.json")]],
    "config garbled": lambda s: _garble(s / "config.yaml"),
}


def _damaged_copy(source: Path, folder: Path, kind: str) -> tuple[Path, dict]:
    store = folder / "damaged.zarr"
    shutil.copytree(source, store)
    tip = store_history(store)[0]
    DAMAGE[kind](store)
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


@pytest.mark.parametrize("which", ["finished", "interrupted"])
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_verify_lists_the_intact_snapshots_and_repair_restores_the_newest(tmp_path, request, finished, which, kind,
                                                                          capsys):
    source = request.getfixturevalue(which)
    store, tip = _damaged_copy(source, tmp_path, kind)
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


@pytest.mark.parametrize("kind", ["pointer deleted", "pointer garbled", "config garbled"])
def test_the_rerun_repairs_by_itself(tmp_path, interrupted, finished, kind, capsys):
    store, tip = _damaged_copy(interrupted, tmp_path, kind)
    assert store_drill.run(str(store)) == 0
    out = capsys.readouterr().out
    assert "repaired: " in out and "wrote 1" in out, out
    assert verify_store(store) == []
    xr.testing.assert_identical(comparable(store), comparable(finished))


def test_a_deleted_tag_alone_leaves_the_store_whole(tmp_path, finished, capsys):
    """The branch still names the last snapshot: nothing to repair, the rerun adds nothing."""
    store = tmp_path / "store.zarr"
    shutil.copytree(finished, store)
    (store / "refs" / "tag.run-1" / "ref.json").unlink()
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
        _garble(snapshot)
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


# -- a store on object storage ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto S3 server on a free loopback port, with one bucket; its endpoint URL."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _client(endpoint).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def _client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                        region_name="us-east-1")


@pytest.fixture
def s3_url(moto_endpoint, monkeypatch) -> str:
    for name, value in {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/repair-{os.getpid()}-{next(_prefixes)}.zarr"


S3_DAMAGE = {
    "pointer deleted": lambda c, p: c.delete_object(Bucket=BUCKET, Key=f"{p}/{POINTER}"),
    "pointer garbled": lambda c, p: c.put_object(Bucket=BUCKET, Key=f"{p}/{POINTER}", Body=b"\xff\xfe garbage"),
    "pointer and run tag deleted": lambda c, p: [c.delete_object(Bucket=BUCKET, Key=f"{p}/{key}")
                                                 for key in (POINTER, "refs/tag.run-1/ref.json")],
    "config garbled": lambda c, p: c.put_object(Bucket=BUCKET, Key=f"{p}/config.yaml", Body=b"\x00: [garbage"),
}


@pytest.mark.parametrize("kind", list(S3_DAMAGE))
def test_an_object_store_comes_back_the_same_way(s3_url, moto_endpoint, finished, kind, capsys):
    assert store_drill.run(s3_url) == 0
    tip = store_history(s3_url)[0]
    S3_DAMAGE[kind](_client(moto_endpoint), s3_url.removeprefix(f"s3://{BUCKET}/"))
    assert main(["verify", s3_url, "--no-progress"]) == 1
    _names_what_is_left(capsys.readouterr().out, s3_url, tip, 4, kind)
    assert main(["verify", s3_url, "--no-progress", "--repair"]) == 0
    assert store_history(s3_url)[0]["snapshot"] == tip["snapshot"]
    xr.testing.assert_identical(comparable(s3_url), comparable(finished))


def test_an_object_store_rerun_repairs_by_itself(s3_url, moto_endpoint, finished, capsys):
    assert store_drill.run(s3_url) == 0
    _client(moto_endpoint).delete_object(Bucket=BUCKET, Key=f"{s3_url.removeprefix(f's3://{BUCKET}/')}/{POINTER}")
    assert store_drill.run(s3_url) == 0
    out = capsys.readouterr().out
    assert "repaired: " in out and "wrote 0" in out.split("repaired: ")[-1], out
    assert verify_store(s3_url) == []
    xr.testing.assert_identical(comparable(s3_url), comparable(finished))
