"""A run's provenance record: the spec as written and as it ran, the command line, the
versions of what ran it, the time (`StoreWriter.add_provenance` keeps one per run)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import platform
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spec import Spec

_VERSIONED = ("torch", "transformers", "nnsight", "zarr", "xarray", "numpy")


def package_versions() -> dict[str, str | None]:
    from . import __version__

    # the source's own version: the distribution is named vlm-workbench, and a checkout on
    # PYTHONPATH has none installed
    versions: dict[str, str | None] = {"workbench": __version__}
    for name in _VERSIONED:
        try:
            versions[name] = _md.version(name)
        except _md.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(spec: Spec, command: list[str] | None = None) -> dict[str, Any]:
    """What a run was: the spec as written and as it ran (after CLI overrides), the command line,
    versions, time."""
    return {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "spec_name": spec.name,
        "spec_hash": spec.spec_hash,
        "spec": spec.source_text,
        "effective_spec": spec.model_dump(mode="json", by_alias=True),
        "overrides": dict(getattr(spec, "_overrides", {}) or {}),
        "command": list(sys.argv if command is None else command),
        "models": list(spec.models),
        "versions": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
