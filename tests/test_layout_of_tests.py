"""The test suite's own layout: no test module imports another (shared helpers live in
tests/support/, shared fixtures in tests/conftest.py), so each test file runs, and reads, alone."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TEST_MODULES = {path.stem for path in TESTS.glob("test_*.py")}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import in `tree`, at any depth (inside functions too), and of
    `importlib.import_module("...")` / `__import__("...")` with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def test_imported_modules_finds_every_form_of_import():
    code = ("import a.b\nfrom c import d\nfrom . import e\n"
            "def f():\n    import g\n    importlib.import_module('h')\n    __import__('i')\n")
    assert imported_modules(ast.parse(code)) == [(1, "a.b"), (2, "c"), (5, "g"), (6, "h"), (7, "i")]


def test_no_test_module_imports_another():
    """Every tests/test_*.py and every module of tests/support/: an import of a test module
    (`from test_store import ...`, `import test_spec`) is a helper that belongs in support/."""
    sources = sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "support").glob("*.py")) + [TESTS / "conftest.py"]
    offending = [f"{path.relative_to(TESTS)}:{line}: imports {module}"
                 for path in sources
                 for line, module in imported_modules(ast.parse(path.read_text(), filename=str(path)))
                 if module.split(".")[0] in TEST_MODULES]
    assert offending == [], "\n".join(offending)
    assert len(TEST_MODULES) > 40 and (TESTS / "support" / "__init__.py").is_file()  # the glob found the suite
