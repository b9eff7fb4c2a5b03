"""Fault drills: malformed specs through the CLI, fuzzed. Any malformed spec gives a located error
and exit 2, never a traceback, and writes nothing. (Kill -9 drills are in test_runner.py.)"""

from __future__ import annotations

import contextlib
import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.spec import SpecError, parse_spec

from support.specs import VALID

LINES = VALID.splitlines(keepends=True)
JUNK = st.sampled_from(["", "-", ":", "{", "]", "!!python/name:os.system", "&a", "*a", "\t", "null", "1e999",
                        "[1, 2", "'x", "models: 7", "- - -", "? x", "%YAML 9", "---", "...", "\x00", "é"])


@st.composite
def broken_specs(draw):
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["delete", "duplicate", "junk", "splice"]))
        if action == "delete" and len(lines) > 1:
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "junk":
            line = lines[i]
            cut = draw(st.integers(0, len(line)))
            lines[i] = line[:cut] + draw(JUNK) + line[cut:]
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=broken_specs())
def test_malformed_spec_exits_2_with_located_error_and_writes_nothing(tmp_path_factory, text):
    try:
        parse_spec(text)
        return  # the mutation happened to stay valid: not this drill's subject
    except SpecError:
        pass
    folder = tmp_path_factory.mktemp("fuzz")
    spec = folder / "fuzz.yaml"
    spec.write_text(text.replace("stores/probe.zarr", str(folder / "store.zarr")), encoding="utf-8", errors="surrogatepass")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", str(spec), "--no-progress"])
    assert code == 2
    message = err.getvalue()
    assert message.startswith("error: ") and "Traceback" not in message
    assert str(spec) in message
    assert [p.name for p in folder.iterdir()] == ["fuzz.yaml"]
