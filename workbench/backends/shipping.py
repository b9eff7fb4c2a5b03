"""What a remote job ships by value besides the workbench: plugin modules (their intervention
kinds and sites) whose code imports only what NDIF allows.

NDIF has no workbench and no plugin installed: a job's code travels in its payload, pickled by value
(`workbench.backends.remote.shipped_by_value`), and NDIF runs it inside a module whitelist. A plugin
module is shipped the same way when every module it imports is on that whitelist (or is the
workbench, which travels too); otherwise the run is refused before any job, naming the import.
Imports are read from the module's source (every `import` statement, at any depth), so a module
imported only inside a function counts as well. Neither nnsight nor torch is imported here: the
spec's validation asks it too (`workbench.spec.schema`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from typing import Iterable, NamedTuple

# NDIF's import whitelist while a request runs, (module, strict): a strict entry matches the module
# alone, another its submodules too (ndif-team/ndif at 028db44,
# src/services/ray/src/ray/nn/security/protected_environment.py, WHITELISTED_MODULES)
NDIF_MODULES: tuple[tuple[str, bool], ...] = (
    ("builtins", True), ("torch", False), ("collections", False), ("nnsight", False), ("time", False),
    ("numpy", False), ("sympy", False), ("nnterp", False), ("math", False), ("einops", False),
    ("urllib3", False), ("typing", False), ("_operator", True), ("operator", True), ("pandas", False),
    ("enum", False),
)
# shipped by value with every job; `__future__` only tells the compiler how to read the module
SHIPPED = ("workbench",)
COMPILE_ONLY = ("__future__",)


class ImportLine(NamedTuple):
    """One import of a module's source: the module it names and the line it is on."""

    module: str
    line: int


def allowed_on_ndif(name: str) -> bool:
    """Whether code that NDIF runs may import module `name` (the whitelist, or shipped with the job)."""
    top = name.split(".")[0]
    return top in SHIPPED or top in COMPILE_ONLY or any(
        name == entry or (not strict and name.startswith(entry + ".")) for entry, strict in NDIF_MODULES)


def imports_of(module: str) -> list[ImportLine]:
    """Every module the source of `module` imports (relative imports resolved), in order."""
    source = _source(module)
    package = module if _is_package(module) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [ImportLine(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            found.append(ImportLine(base, node.lineno))
    return sorted(found, key=lambda i: i.line)


def ndif_problem(module: str) -> str | None:
    """None when `module` can be shipped to NDIF by value, else why not (naming the import)."""
    try:
        refused = [i for i in imports_of(module) if not allowed_on_ndif(i.module)]
        annotated = _annotated_without_future(module)
    except (OSError, TypeError, SyntaxError) as err:
        return f"its source cannot be read to check its imports ({type(err).__name__}: {err})"
    if annotated is not None and not refused:
        # cloudpickle 3.1 ships a function's annotations as objects, and `int | None` as
        # `_functools.reduce(_operator.or_, ...)`, which NDIF's unpickler refuses; as text
        # (PEP 563) they travel untouched
        return (f"its annotations ({_file(module)}:{annotated}) would travel as objects that NDIF refuses; "
                "expected `from __future__ import annotations` at its top, as the workbench's modules have")
    if not refused:
        return None
    first = refused[0]
    more = f" (and {', '.join(repr(i.module) for i in refused[1:])})" if len(refused) > 1 else ""
    allowed = ", ".join(m for m, _ in NDIF_MODULES if m != "builtins")
    return (f"it imports {first.module!r} ({_file(module)}:{first.line}){more}, not on NDIF's whitelist "
            f"({allowed}) nor the workbench, so its code cannot be shipped to NDIF")


def _annotated_without_future(module: str) -> int | None:
    """The line of the first annotated function of a module that lacks `from __future__ import
    annotations`, or None."""
    tree = ast.parse(_source(module))
    if any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
           for n in tree.body):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if node.returns is not None or any(a.annotation is not None for a in arguments):
                return node.lineno
    return None


def shippable(modules: Iterable[str]) -> list[str]:
    """The plugin modules among `modules` (those outside the workbench), each once, in order."""
    return [m for m in dict.fromkeys(modules) if m.split(".")[0] not in SHIPPED]


def _source(module: str) -> str:
    import inspect

    return inspect.getsource(sys.modules[module])


def _is_package(module: str) -> bool:
    return hasattr(sys.modules[module], "__path__")


def _file(module: str) -> str:
    path = getattr(sys.modules[module], "__file__", None)
    return os.path.basename(path) if path else module
