"""Stores in tests: comparing two of them, and where one lies. A store's tests run one body
against a local path and an s3:// URL on a loopback S3 server (moto's server mode), through the
`store_url` fixture (conftest.py); `StoreObjects` reads, writes and deletes a store's objects by
key on either, for the damage a test does."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import xarray as xr

import store_drill
from workbench.store import open_store

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
BUCKET = "workbench-tests"
CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}
_prefixes = itertools.count()


def comparable(path: Path | str, model: str = store_drill.MODEL) -> xr.Dataset:
    """One model's Dataset, loaded, with its labels as plain coordinates (the MultiIndex's tuples
    hold NaN, and NaN != NaN inside tuples). Provenance is dropped: it lists every run that
    wrote, so a killed-then-resumed store has one record more than an uninterrupted one."""
    ds = open_store(path, model=model).load()
    ds.attrs.pop("provenance")
    return ds.reset_index([d for d in ("token", "run", "vision_patch") if d in ds.indexes])


def assert_same_store(a: Path | str, b: Path | str, models: tuple[str, ...]) -> None:
    for model in models:
        xr.testing.assert_identical(comparable(a, model), comparable(b, model))


# -- the loopback S3 server ----------------------------------------------------------------------


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free loopback port, with one bucket; its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)


def aws_environment(endpoint: str) -> dict[str, str]:
    """The AWS environment that points the workbench (and its subprocesses) at the server."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"], "AWS_REGION": CREDENTIALS["region_name"]}


def new_s3_url(name: str = "store") -> str:
    """A store URL no other test in this session uses."""
    return f"s3://{BUCKET}/{name}-{os.getpid()}-{next(_prefixes)}.zarr"


def bucket_keys(endpoint: str, prefix: str) -> list[str]:
    return [o["Key"] for o in s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


# -- a store's objects, by key ---------------------------------------------------------------------


class StoreObjects:
    """The objects of the store at `url` by key (`refs/branch.main/ref.json`, `chunks/<id>`):
    files under a local path, or objects under an s3:// prefix of the loopback server (named by
    AWS_ENDPOINT_URL). The icechunk specification names a repository's files relative to its root,
    whatever the storage (icechunk 1.1 `spec/icechunk-spec.md`, "File Layout"), so a local store's
    files uploaded under a prefix are that store on S3."""

    def __init__(self, url: Path | str):
        self.url = str(url)
        self.local = not self.url.startswith("s3://")
        if not self.local:
            self.bucket, self.prefix = self.url.removeprefix("s3://").split("/", 1)
            self.client = s3_client(os.environ["AWS_ENDPOINT_URL"])

    def keys(self) -> list[str]:
        if self.local:
            root = Path(self.url)
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + "/")
        return sorted(o["Key"].removeprefix(self.prefix + "/") for page in pages for o in page.get("Contents", []))

    def read(self, key: str) -> bytes:
        if self.local:
            return (Path(self.url) / key).read_bytes()
        return self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        if self.local:
            path = Path(self.url) / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        else:
            self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)

    def delete(self, key: str) -> None:
        if self.local:
            (Path(self.url) / key).unlink()
        else:
            self.client.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")

    def copy_from(self, store: Path) -> None:
        """Every file of the local store `store`, as this store's objects."""
        for path in sorted(p for p in store.rglob("*") if p.is_file()):
            self.write(str(path.relative_to(store)), path.read_bytes())
