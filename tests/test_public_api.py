"""The project uses zarr and icechunk through their public API only: no `zarr.core`, no module,
import or attribute with a leading underscore of theirs, no `AsyncArray`/`AsyncGroup`, anywhere
in workbench/, analyses/ and benchmarks/.

Private names are read from the installed libraries' own source: every function, class, method
and attribute of theirs whose name starts with one underscore. An attribute access `x._name` of
the project is flagged when `_name` is such a name and the project defines no name of its own
spelled so (its own `self._root` is not zarr's)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import icechunk
import zarr

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("workbench", "analyses", "benchmarks")
LIBRARIES = ("zarr", "icechunk")
# public, but what the project chose to stay off: zarr's asynchronous classes
AVOIDED = {"AsyncArray", "AsyncGroup"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines: functions, classes, assignments (also to attributes), arguments."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
    return out


def _library_private_names() -> set[str]:
    names: set[str] = set()
    for package in (zarr, icechunk):
        folder = Path(package.__file__).parent
        for file in [*folder.rglob("*.py"), *folder.rglob("*.pyi")]:
            try:
                tree = ast.parse(file.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            names |= {n for n in _defined_names(tree) if _private(n)}
    return names


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _library_path_problem(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] not in LIBRARIES:
        return None
    if parts[0] == "zarr" and len(parts) > 1 and parts[1] == "core":
        return "zarr.core"
    private = [p for p in parts[1:] if _private(p)]
    return f"private {private[0]}" if private else None


def private_uses(source: str, library_private: set[str], own: set[str]) -> list[str]:
    """Each private or avoided use of zarr or icechunk in `source`, as 'line N: what'."""
    tree = ast.parse(source)
    aliases = {}  # local name -> the library path it stands for
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                problem = _library_path_problem(alias.name)
                if problem:
                    problems.append(f"line {node.lineno}: import {alias.name} ({problem})")
                if alias.name.split(".")[0] in LIBRARIES:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            problem = _library_path_problem(node.module)
            if problem:
                problems.append(f"line {node.lineno}: from {node.module} ({problem})")
            if node.module.split(".")[0] in LIBRARIES:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _private(alias.name) or alias.name in AVOIDED or _library_path_problem(full):
                        problems.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                    aliases[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted and dotted[0] in aliases:
                full = ".".join([aliases[dotted[0]], *dotted[1:]])
                problem = _library_path_problem(full) or (
                    "avoided" if set(dotted[1:]) & AVOIDED else None)
                if problem:
                    problems.append(f"line {node.lineno}: {'.'.join(dotted)} ({problem})")
                    continue
            if node.attr in library_private and node.attr not in own:
                problems.append(f"line {node.lineno}: .{node.attr} (a private name of zarr or icechunk)")
            elif node.attr in AVOIDED:
                problems.append(f"line {node.lineno}: .{node.attr} (avoided)")
        elif isinstance(node, ast.Name) and node.id in AVOIDED:
            problems.append(f"line {node.lineno}: {node.id} (avoided)")
    text = re.findall(r"^.*\bzarr\.core\b.*$", source, flags=re.M)  # also in strings (importlib)
    problems += [f"mentions zarr.core: {line.strip()}" for line in text]
    return sorted(set(problems))


def _sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))}


def test_no_private_zarr_or_icechunk_api_in_the_project():
    sources = _sources()
    own: set[str] = set()
    for source in sources.values():
        own |= _defined_names(ast.parse(source))
    library_private = _library_private_names()
    found = {str(path.relative_to(ROOT)): p for path, source in sources.items()
             if (p := private_uses(source, library_private, own))}
    assert not found, found


def test_the_check_finds_private_uses():
    """The checker itself, on uses the store once made (a zarr 3.1.6 private codec pipeline)."""
    library_private = _library_private_names()
    assert {"_encode_sync", "_async_group"} <= library_private
    source = '''
import zarr
import zarr.core.sync
import icechunk as ic
from zarr.core.array import init_array
from zarr.api import asynchronous as _a
from zarr import AsyncArray
from icechunk import _icechunk_python

zarr.core.sync.sync(group._async_group.getitem("x"))
codec._encode_sync(chunk, spec)
ic._icechunk_python.PyRepository
importlib.import_module("zarr.core.buffer")
array = AsyncArray(metadata=m, store_path=p)
'''
    found = "\n".join(private_uses(source, library_private, own={"_root"}))
    for expected in ("import zarr.core.sync", "from zarr.core.array", "from zarr import AsyncArray",
                     "from icechunk import _icechunk_python", "._async_group", "._encode_sync",
                     "ic._icechunk_python", "zarr.core.buffer", "line 14: AsyncArray"):
        assert expected in found, (expected, found)
    clean = "import zarr\nimport icechunk as ic\nroot = zarr.open_group(s.store)\nself._root = root\nic.Repository.open(x)\n"
    assert private_uses(clean, library_private, own={"_root"}) == []
