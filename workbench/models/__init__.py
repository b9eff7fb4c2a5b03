"""The unified model abstraction: architectures (declarative), tiny offline models, and the
`WorkbenchModel` wrapper over nnsight."""

from .architectures import ARCHITECTURES, Architecture, architecture_for

__all__ = ["ARCHITECTURES", "Architecture", "architecture_for", "load_model", "model_info", "WorkbenchModel"]


def __getattr__(name):  # torch is imported only when a model is actually needed
    if name in ("load_model", "model_info", "WorkbenchModel"):
        from . import model

        return getattr(model, name)
    raise AttributeError(name)
