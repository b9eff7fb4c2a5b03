"""The analyses registry: each analysis declared once, by `register_analysis(Analysis(...))` in its
own module. `workbench analyze` (its tables and the names it accepts), `workbench report` (its
sections, in order) and `python -m analyses` read the registry and nothing else.

Where declarations come from, all registered the same way:
- built-ins: every module of `analyses/builtin/` (one file per analysis), imported on first use;
- installed packages: the modules an entry point of the group `workbench.analyses` names;
- a user's own modules: `--plugins mylab.analyses` of `analyze` / `report` (`load_plugins`).

Adding an analysis is one module that registers it; nothing else names it.

Import-light on purpose (no xarray, no matplotlib): the CLI imports it while building its parser.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import xarray as xr

    from .figures import FigureFile
    from .tables import Options, Table

ENTRY_POINT_GROUP = "workbench.analyses"
PLUGIN_ORDER = 1000  # a declaration without an order goes after every built-in


class TableBuilder(Protocol):
    def __call__(self, models: dict[str, xr.Dataset], options: Options, /) -> Table: ...


class FigureMaker(Protocol):
    __name__: str

    def __call__(self, models: dict[str, xr.Dataset], options: Options, out: Path, /) -> FigureFile: ...


@dataclass(frozen=True)
class Analysis:
    """One analysis: what it reads, what it computes, and how the report shows it."""

    name: str                           # the table's name: `workbench analyze STORE NAME`
    section: str                        # the report's heading: what is measured
    inputs: tuple[str, ...]             # store variables it reads (the captures that write them)
    metrics: tuple[Callable[..., object], ...]  # the per-model functions a Python user calls for the same numbers
    table: TableBuilder                 # every model of a store -> one table
    figures: tuple[FigureMaker, ...] = ()   # each writes one figure file of the report's section
    claim: str | None = None            # what the study reports about it, quoted in the report, or None
    order: int = PLUGIN_ORDER           # position of its table and section (built-ins: the study's order)


_REGISTERED: dict[str, Analysis] = {}
_BUILTINS_LOADED = False


class RegistryError(ValueError):
    """Two modules declare one analysis name."""


class PluginError(ImportError):
    """A plugin module (or an entry point's) that cannot be imported."""

    def __init__(self, module: str, cause: BaseException):
        super().__init__(f"cannot import plugin module {module!r}: {cause}")
        self.module = module


def register_analysis(analysis: Analysis) -> Analysis:
    """Register `analysis` (its module calls this once, at import). A second module registering the
    same name is refused; the same module registering it again (a reload) replaces it."""
    held = _REGISTERED.get(analysis.name)
    if held is not None and held.table.__module__ != analysis.table.__module__:
        raise RegistryError(f"analysis {analysis.name!r} is registered twice: by {held.table.__module__} "
                            f"and by {analysis.table.__module__}")
    _REGISTERED[analysis.name] = analysis
    return analysis


def _load_builtins() -> None:
    """Import every built-in analysis module, then every entry point's, once."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    from . import builtin

    for module in pkgutil.iter_modules(builtin.__path__, builtin.__name__ + "."):
        importlib.import_module(module.name)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except ImportError as err:
            raise PluginError(entry.value, err) from err
    _BUILTINS_LOADED = True


def load_plugins(modules: Iterable[str]) -> None:
    """Import the named modules (each registers its analyses); PluginError names one that fails."""
    _load_builtins()
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise PluginError(name, err) from err


def analyses() -> tuple[Analysis, ...]:
    """Every registered analysis, in order (then in the order registered)."""
    _load_builtins()
    return tuple(sorted(_REGISTERED.values(), key=lambda a: a.order))


def names() -> tuple[str, ...]:
    return tuple(a.name for a in analyses())


def by_name(name: str) -> Analysis:
    for analysis in analyses():
        if analysis.name == name:
            return analysis
    raise KeyError(f"no analysis {name!r}; registered: {', '.join(names())}")
