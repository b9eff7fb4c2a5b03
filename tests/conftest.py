"""Shared fixtures: offline, tiny models built once per session in a private cache; stores on a local
path and on a loopback S3 server; a DatBench-shaped copy. Their helpers: tests/support/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# one intra-op thread per xdist worker (`make test` runs one worker per core): torch's default, a
# thread per core in every worker, oversubscribes the cores and spin-waits
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

VLM_NAMES = ("tiny-smolvlm", "tiny-qwen3vl")
from workbench.models.refs import TRAINED_MODEL_NAMES as TRAINED_NAMES  # noqa: E402
_TRAINED_ROOT: list = []  # the user's model cache, where the trained models persist across sessions


@pytest.fixture(scope="session", autouse=True)
def workbench_cache(tmp_path_factory):
    """Build tiny models into a cache private to this test session (subprocesses inherit it). The
    trained models (minutes to build) live in the user's cache (`make trained-models`), shared by
    every session: `ensure_trained` links them in."""
    from workbench.models.tiny import _default_root

    _TRAINED_ROOT[:] = [_default_root()]
    cache = tmp_path_factory.mktemp("workbench-cache")
    previous = os.environ.get("WORKBENCH_CACHE")
    os.environ["WORKBENCH_CACHE"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("WORKBENCH_CACHE", None)
    else:
        os.environ["WORKBENCH_CACHE"] = previous


_models: dict[str, object] = {}


@pytest.fixture(scope="session")
def load_tiny(workbench_cache):
    """load_tiny(name, attn="eager") -> a WorkbenchModel in float32 on CPU, loaded once per session."""
    from workbench.models.model import load_model

    def load(name: str, attn: str = "eager"):
        if name in TRAINED_NAMES:
            ensure_trained(name)
        if (name, attn) not in _models:
            _models[(name, attn)] = load_model(name, device="cpu", dtype="float32", attn=attn)
        return _models[(name, attn)]

    return load


def ensure_trained(name: str):
    """The trained model `name` from the user's cache (trained there on first use), linked into this
    session's cache so that `--models NAME` and `NAME@step-N` resolve in subprocesses too."""
    from workbench.models.training import _VERSION, trained_model_dir

    built = trained_model_dir(name, _TRAINED_ROOT[0])
    link = Path(os.environ["WORKBENCH_CACHE"]) / "models" / f"{name}-{_VERSION}"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(built, target_is_directory=True)
    return built


@pytest.fixture(scope="session")
def trained(workbench_cache):
    """{name: directory} of both trained models (built once into the user's cache)."""
    return {name: ensure_trained(name) for name in TRAINED_NAMES}


# -- stores: a local path and an s3:// URL on a loopback S3 server (support/stores.py) ------------


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on loopback for the whole session, with one bucket; its endpoint URL."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from support.stores import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The AWS environment pointing at the loopback server (subprocesses inherit it); returns a
    fresh store URL per call: s3(name="store")."""
    from support.stores import aws_environment, new_s3_url

    for name, value in aws_environment(s3_server).items():
        monkeypatch.setenv(name, value)
    return new_s3_url


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path) -> str:
    """Where a test's store goes: a path under tmp_path, then a fresh s3:// URL on the loopback
    server. A test that takes it runs once per kind; the same body passes on both."""
    if request.param == "local":
        return str(tmp_path / "store.zarr")
    return request.getfixturevalue("s3")()


# -- a DatBench-shaped local copy (support/datbench.py) ---------------------------------------------


@pytest.fixture(scope="module")
def saved_copy(tmp_path_factory):
    """<root>/<config>: `DatasetDict({"test": ...}).save_to_disk`, the documented layout."""
    pytest.importorskip("datasets")
    from support.datbench import save_copy

    return save_copy(tmp_path_factory.mktemp("datbench-saved"))


@pytest.fixture(scope="module")
def source_rows() -> dict[str, dict]:
    pytest.importorskip("datasets")
    from support import datbench

    return datbench.source_rows()
