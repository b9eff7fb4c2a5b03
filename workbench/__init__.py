"""workbench: declarative interpretability experiments on vision-language models over nnsight.

The public surface, importable without torch (the analysis side):
- `open_store(path, model=None)`: a store as an xarray DataTree, or one model's Dataset;
- `ds.wb` on that Dataset: selection across the token and run dims at once, norms, tidy frames
  (`workbench.accessor`, registered on import);
- `store_info(path)`: what a store holds;
- `to_dataframe(ds, variable)`: tidy rows (one per token and layer, every label a column);
- `load_spec(path)`, `Spec` (`Spec.from_dict(data)`): a validated experiment spec.
The capture side imports torch when called: `run(spec, **overrides)` (a path, a dict or a Spec,
run as `workbench run` does, the store returned opened; `workbench.api`),
`workbench.models.load_model`, `workbench.runner.run_spec`.
"""

from typing import Any

from . import accessor  # noqa: F401  (registers `ds.wb`)
from .frames import to_dataframe
from .store import open_store, store_info

__all__ = ["open_store", "store_info", "load_spec", "to_dataframe", "Spec", "run", "as_spec"]
__version__ = "0.1.0"


def load_spec(path):  # lazy: keeps `import workbench` light
    from .spec import load_spec as _load_spec

    return _load_spec(path)


def __getattr__(name: str) -> Any:  # lazy, as load_spec: the spec schema and the runner load on first use
    if name == "Spec":
        from .spec import Spec

        return Spec
    if name in ("run", "as_spec"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
