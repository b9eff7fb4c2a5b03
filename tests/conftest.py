"""Shared fixtures: offline, tiny models built once per session in a private cache."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

VLM_NAMES = ("tiny-smolvlm", "tiny-qwen3vl")


@pytest.fixture(scope="session", autouse=True)
def workbench_cache(tmp_path_factory):
    """Build tiny models into a cache private to this test session (subprocesses inherit it)."""
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
        if (name, attn) not in _models:
            _models[(name, attn)] = load_model(name, device="cpu", dtype="float32", attn=attn)
        return _models[(name, attn)]

    return load
