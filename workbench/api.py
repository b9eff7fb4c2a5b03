"""The workbench from Python: `run(spec, **overrides)` runs a spec as `workbench run` does and
returns the store it wrote, opened; `as_spec` turns a path, a dict or a `Spec` into a validated
`Spec`. A notebook's cell is then `ds = workbench.run("specs/demo.yaml", limit=2)`.

The semantics are the CLI's (workbench/cli.py `cmd_run`): what is stored is skipped (a rerun
resumes), a bad spec or argument raises one `WorkbenchError` naming the field and what was
expected before anything is written, and Ctrl-C (a notebook's "interrupt") stops between two
samples and raises `Interrupted` saying how much is stored. Where the CLI prints an error and
exits, this raises it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import xarray as xr

from .errors import BadInputError

if TYPE_CHECKING:
    from .spec import Spec

SpecLike = Union[str, "os.PathLike[str]", Mapping[str, Any], "Spec"]
_LOG = logging.getLogger("workbench")


def as_spec(spec: SpecLike, *, max_conditions: int | None = None, max_samples: int | None = None) -> "Spec":
    """A validated `Spec` from a spec file's path, a dict (as the YAML would read) or a `Spec`.
    Problems raise `SpecError`, located by file and line for a file and by field path for a dict.
    `max_conditions`/`max_samples` raise the size limits as `--max-conditions`/`--max-samples` do."""
    from .spec import Spec, load_spec
    from .spec.loading import spec_from_data

    limits = {"conditions": max_conditions, "samples": max_samples}
    if isinstance(spec, Spec):
        if any(v is not None for v in limits.values()):
            return spec_from_data(spec.model_dump(by_alias=True, exclude_none=True), spec.source, limits)
        return spec
    if isinstance(spec, Mapping):
        return spec_from_data(spec, limits=limits)
    if isinstance(spec, (str, os.PathLike)):
        return load_spec(os.fspath(spec), limits=limits)
    raise BadInputError(f"spec: got {type(spec).__name__}; expected a path to a YAML spec, a dict or a workbench.Spec")


def run(
    spec: SpecLike,
    *,
    models: str | Sequence[str] | None = None,
    data_source: str | None = None,
    limit: int | None = None,
    store_path: str | os.PathLike[str] | None = None,
    device: str | None = None,
    dtype: str | None = None,
    max_conditions: int | None = None,
    max_samples: int | None = None,
    remote: Any = None,
    progress: bool = True,
    model: str | None = None,
) -> xr.Dataset | xr.DataTree:
    """Run `spec` (a path, a dict or a `Spec`) into its store and return the store, opened.

    The overrides are `workbench run`'s options: `models` (`--models`), `data_source` (`--data`),
    `limit` (`--limit`), `store_path` (`--store`), `device`, `dtype`, `max_conditions`,
    `max_samples` and `remote` (`--remote`: True for NDIF, "local", or a server URL).

    Returns `open_store(store, model)`: one model's `xarray.Dataset` when the spec runs one model
    or `model` names one, else a `DataTree` with a node per model."""
    from .runner import run_spec

    loaded = as_spec(spec, max_conditions=max_conditions, max_samples=max_samples)
    store_text = None if store_path is None else os.fspath(store_path)
    if any(v is not None for v in (models, data_source, limit, store_text, device, dtype)):
        loaded = loaded.with_overrides(models=models, data_source=data_source, limit=limit, store_path=store_text,
                                       device=device, dtype=dtype)
    if model is not None and model not in loaded.models:
        raise BadInputError(f"model: got {model!r}; expected one of the spec's models: {', '.join(loaded.models)}")
    # The CLI also tunes glibc's allocator for its process (runner.tune_allocator); a notebook's
    # kernel is the user's process, so it is left as it is.
    # progress=False also hides transformers' and huggingface_hub's bars, for this run only (runner)
    summary = run_spec(loaded, device=device or "auto", dtype=dtype or "auto", progress=progress, remote=remote)
    if summary.nonfinite:
        _LOG.warning(f"{len(summary.nonfinite)} capture(s) hold NaN or Inf (stored as is, counted in the "
                     "'nonfinite' variable):\n  " + "\n  ".join(summary.nonfinite[:20]))
    from .store import open_store

    if model is None and len(loaded.models) == 1:
        model = loaded.models[0]
    return open_store(summary.store, model)
