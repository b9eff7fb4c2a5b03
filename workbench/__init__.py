"""workbench: declarative interpretability experiments on vision-language models over nnsight.

The public surface, importable without torch (the analysis side):
- `open_store(path, model=None)`: a store as an xarray DataTree, or one model's Dataset;
- `store_info(path)`: what a store holds;
- `to_dataframe(ds, variable)`: tidy rows (one per token and layer, every label a column);
- `load_spec(path)`: a validated experiment spec.
The capture side (`workbench.models.load_model`, `workbench.runner.run_spec`) imports torch.
"""

from .frames import to_dataframe
from .store import open_store, store_info

__all__ = ["open_store", "store_info", "load_spec", "to_dataframe"]
__version__ = "0.1.0"


def load_spec(path):  # lazy: keeps `import workbench` light
    from .spec import load_spec as _load_spec

    return _load_spec(path)
