"""Extending the workbench: declare an intervention kind or a site once, in a module of its own.

An intervention kind is two classes registered together:

- its spec fields: a pydantic model, subclass of :class:`InterventionSpec` (site, positions,
  layers) or :class:`KindSpec` (site only), whose ``kind: Literal["name"]`` names the kind;
- what runs: a subclass of :class:`Intervention` (a `Record`) with ``edit(x, layer)`` and
  ``from_spec(raw, common)``; optionally ``bind`` (values read from a `source` condition) and
  ``resolve(model)`` (defaults taken from the model, e.g. `normalize`'s target).

``@register_intervention(MySpec, ...)`` on the runtime class declares the kind: from then on the
spec accepts it (sweepable fields included: a field whose type carries a `Swept` marker, such as
`NumberOrVar` or `InterventionSpec`'s `LayersOrVar` / `PositionsOrVar`, takes a '$variable', and
each run of a sweep is validated by the kind's model with its values in place), ``workbench validate`` checks it against each
model, and runs apply it. The built-in kinds are declared this way too, one module each under
``workbench/interventions/``. A spec loads other modules with ``plugins: [mylab.interventions]``;
installed packages may declare theirs under the entry-point group ``workbench.plugins``.

A site is one `Site` record passed to ``register_site`` (see `workbench.sites.base`): where it
runs, its index and dims, how its value is reached (`tensor`) and the reader a capture of it adds
(`capture`); the built-in sites are one module each under ``workbench/sites/``. A plugin module
declares its own the same way: the spec reads the registry when it is validated, so from then on
``capture`` and the interventions take the site, ``validate`` checks it against each model, and its
variables are stored with the dims it declares.

On NDIF a plugin module's kinds and sites run too when its code imports only what NDIF's
whitelist allows (torch, numpy, typing, ..., and the workbench): the module is shipped by value
with each job, as the workbench's own code is. Otherwise a remote run is refused before any job,
naming the import (`workbench.backends.shipping`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, get_args

from .errors import BadInputError
from .interventions.base import Intervention
from .sites import SITES, Site
from .sites import register_site as _declare_site
from .spec.fields import Layers, LayersOrVar, Number, NumberOrVar, Positions, PositionsOrVar, Swept
from .spec.kinds import InterventionSpec, KindSpec, swept_fields

__all__ = ["Intervention", "InterventionSpec", "KindSpec", "InterventionKind", "register_intervention",
           "intervention_kinds", "load_plugin", "Layers", "LayersOrVar", "Number", "NumberOrVar", "Positions",
           "PositionsOrVar", "Swept", "ENTRY_POINT_GROUP", "Site", "register_site", "site_module", "plugin_site_modules",
           "load_entry_points"]

ENTRY_POINT_GROUP = "workbench.plugins"
# how a site's value is reached (`workbench.sites.Site.access`) where an edit can act
EDIT_ACCESSES = ("sequence", "modules", "patches", "branch", "heads")

SpecPath = tuple[Any, ...]
Check = Callable[[Any, Any], list[tuple[SpecPath, str]]]


@dataclass(frozen=True)
class InterventionKind:
    """One declared intervention kind. Fields:
    name: the spec's `kind`; spec: its pydantic model; runtime: the `Intervention` that runs it
    sites: the sites it may edit (None: every editable site); accesses: the site accesses it acts
      at (`workbench.sites.Site.access`: `sequence` positions, connector `modules`, tower `patches`)
    source: the spec field naming a condition whose values it reads first (`bind`), if any
    check: (spec entry, `ModelInfo`) -> [(sub-path, message)]: what a model cannot give it
    module: where it was declared (a module outside `workbench` is a plugin)
    local_only: why it cannot run on NDIF, for a kind that never can (None: it can, or a plugin's
      imports decide)"""

    name: str
    spec: type[KindSpec]
    runtime: type[Intervention]
    sites: tuple[str, ...] | None
    accesses: tuple[str, ...]
    source: str | None
    check: Check | None
    module: str
    local_only: str | None = None

    @property
    def builtin(self) -> bool:
        return self.module == "workbench" or self.module.startswith("workbench.")

    @property
    def remote(self) -> bool:
        """Whether it runs on NDIF: its code travels there by value, as the workbench's own does,
        when its module imports only what NDIF allows (`workbench.backends.shipping`)."""
        return self.remote_problem() is None

    def remote_problem(self) -> str | None:
        """Why it cannot run on NDIF (its declared reason, or the import its code cannot ship), or None."""
        if self.local_only is not None:
            return self.local_only
        if self.builtin:
            return None
        from .backends.shipping import ndif_problem

        return ndif_problem(self.module)

    def swept(self) -> dict[str, str]:
        """{field: what it holds} of the fields that take a '$variable': those whose type carries
        a `Swept` marker (`NumberOrVar`, `LayersOrVar`, `PositionsOrVar`, or a kind's own)."""
        return {name: marker.kind for name, marker in swept_fields(self.spec).items()}

    def source_of(self, raw: Any) -> tuple[str, str] | None:
        """(field name as the spec writes it, condition) of the source `raw` reads, if any."""
        if self.source is None or getattr(raw, self.source, None) is None:
            return None
        info = self.spec.model_fields[self.source]
        return info.alias or self.source, getattr(raw, self.source)


_KINDS: dict[str, InterventionKind] = {}
_LOADED = False

R = TypeVar("R", bound=type[Intervention])


def _kind_name(spec: type[KindSpec]) -> str:
    info = spec.model_fields.get("kind")
    names = get_args(info.annotation) if info is not None else ()
    if len(names) != 1 or not isinstance(names[0], str):
        raise TypeError(f"{spec.__name__}.kind must be Literal['<kind name>']; got {info and info.annotation!r}")
    return names[0]


def register_intervention(spec: type[KindSpec], *, sites: tuple[str, ...] | None = None,
                          accesses: tuple[str, ...] = EDIT_ACCESSES, source: str | None = None,
                          check: Check | None = None, local_only: str | None = None) -> Callable[[R], R]:
    """Class decorator declaring the runtime class of the kind `spec` names (see the module doc);
    `local_only`: why the kind never runs on NDIF (a remote run is refused before any job, saying so)."""
    if not (isinstance(spec, type) and issubclass(spec, KindSpec)):
        raise TypeError(f"register_intervention takes the kind's spec model (a KindSpec subclass); got {spec!r}")
    name = _kind_name(spec)
    unknown = set(accesses) - set(EDIT_ACCESSES)
    if unknown:
        raise ValueError(f"unknown site accesses {sorted(unknown)}; expected some of {EDIT_ACCESSES}")
    if source is not None and source not in spec.model_fields:
        raise ValueError(f"source {source!r} is not a field of {spec.__name__}")

    def declare(runtime: R) -> R:
        if not (isinstance(runtime, type) and issubclass(runtime, Intervention)):
            raise TypeError(f"@register_intervention decorates an Intervention subclass; got {runtime!r}")
        previous = _KINDS.get(name)
        if previous is not None and previous.module != runtime.__module__:
            raise ValueError(f"intervention kind {name!r} is declared twice: in {previous.module} and "
                             f"{runtime.__module__}")
        _KINDS[name] = InterventionKind(name, spec, runtime, tuple(sites) if sites is not None else None,
                                        tuple(accesses), source, check, runtime.__module__, local_only)
        return runtime

    return declare


def load_entry_points() -> None:
    """Import the built-in kinds, then every module of the installed packages' entry-point group
    ``workbench.plugins`` (once per process): their kinds and sites declare themselves."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    _import_builtins()
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as exc:  # a broken installed plugin: say which, not a traceback
            raise BadInputError(f"the plugin {entry.name!r} ({entry.value}) of entry-point group "
                                f"{ENTRY_POINT_GROUP!r} failed to load ({type(exc).__name__}: {exc}); "
                                "expected an importable module") from exc


def intervention_kinds() -> dict[str, InterventionKind]:
    """Every declared kind, the built-ins first (in their folder's order), then the entry points'."""
    load_entry_points()
    # the built-ins by name (whichever was imported first), then the others as they registered
    ordered = sorted(_KINDS.values(), key=lambda k: (not k.builtin, k.name if k.builtin else ""))
    return {k.name: k for k in ordered}


def _import_builtins() -> None:
    """Every module of `workbench/interventions/` but `base` is one built-in kind: importing it
    declares it (so adding a kind is adding its file)."""
    import pkgutil

    from . import interventions

    for module in sorted(m.name for m in pkgutil.iter_modules(interventions.__path__)):
        if module != "base":
            importlib.import_module(f"{interventions.__name__}.{module}")


# the module that declared each site through `register_site` below (the built-ins declare theirs in
# `workbench.sites`, each in its own module)
SITE_MODULES: dict[str, str] = {}
# what a capture's rows are: its first dim (`workbench.sites.Site.stores`)
ROW_DIMS = ("token", "vision_patch", "run")


def register_site(entry: Site) -> Site:
    """Declare a site from a plugin module (see the module doc): its name, its variables and their
    row dim are checked against the sites already declared, then it joins the registry."""
    from .names import RESERVED_NAMES

    if not isinstance(entry, Site):
        raise TypeError(f"register_site takes a Site; got {entry!r}")
    caller = inspect.currentframe()
    module = getattr(inspect.getmodule(caller.f_back if caller else None), "__name__", "__main__")
    previous = SITE_MODULES.get(entry.name, "workbench.sites" if entry.name in SITES else None)
    if previous is not None and previous != module:
        raise ValueError(f"site {entry.name!r} is declared twice: in {previous} and {module}")
    for variable, dims in entry.stores.items():
        owner = next((s.name for s in SITES.values() if variable in s.stores and s.name != entry.name), None)
        if owner is not None or variable in RESERVED_NAMES:
            raise ValueError(f"site {entry.name!r}: variable {variable!r} is already "
                             + (f"stored by site {owner!r}" if owner else "a name the store reserves")
                             + "; expected a name of its own")
        if not dims or dims[0] not in ROW_DIMS:
            raise ValueError(f"site {entry.name!r}: variable {variable!r} has dims {tuple(dims)}; expected the "
                             f"first to be a row dim, one of {ROW_DIMS}")
    SITE_MODULES[entry.name] = module
    return _declare_site(entry)


def plugin_site_modules() -> dict[str, str]:
    """{site: module} of the sites plugins declared (they travel to NDIF with the registry)."""
    return {name: module for name, module in SITE_MODULES.items() if name in SITES}


def site_module(name: str) -> str:
    """The module that declared site `name` (`workbench.sites.<name>` for a built-in)."""
    return SITE_MODULES.get(name, f"workbench.sites.{name.replace('.', '_')}")


def kind_of(runtime: Intervention) -> InterventionKind | None:
    """The declared kind whose runtime class `runtime` is an instance of."""
    return next((k for k in intervention_kinds().values() if type(runtime) is k.runtime), None)


def load_plugin(name: str) -> str | None:
    """Import plugin module `name` (its kinds declare themselves); None, or why it failed.
    The current directory is searched too, as `python -m` does, so a module beside the spec's
    commands needs no install."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.append(here)
    try:
        importlib.import_module(name)
    except Exception as exc:  # any failure of the user's module is a problem of the spec line naming it
        return f"{type(exc).__name__}: {exc}"
    finally:
        if added and here in sys.path:
            sys.path.remove(here)
    return None

