"""Helpers shared by the test modules; the fixtures built on them live in tests/conftest.py.

Test modules import from here (`from support.stores import ...`), never from one another
(tests/test_layout_of_tests.py checks it). `tests/` is on `sys.path` the way pytest's default
"prepend" import mode puts it there: the folder of a test module or conftest.py that is not in a
package (pytest 9.2 `_pytest/pathlib.py` `import_path`), which is also how `store_drill`,
`ndif_server` and `ndif_sandbox` are imported."""
