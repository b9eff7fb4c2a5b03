"""Progress bars: one per long command on a terminal (a real pseudo-terminal, in a subprocess),
none on a pipe or a file; transformers' own bars follow `-q` and `progress=False`; in a notebook
without ipywidgets a text bar and no warning."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
# what a tqdm bar draws: "NN%|" then later "| n/total ["
BAR = re.compile(r"\d+%\|.*\| *\d+/\d+ \[")

SPEC = """\
name: bars
models: [tiny-llama]
data: {source: builtin, n: 3}
conditions:
  baseline: {}
capture:
  - {site: layer, layers: all}
store: {path: STORE}
backend: {kind: local, device: cpu, dtype: float32}
"""

# Every long command in one process (one import of torch), each after a marker line on stderr;
# the second shard runs with -q.
DRIVER = """\
import sys
from workbench.cli import main
spec, out = sys.argv[1], sys.argv[2]
commands = {
    "run": ["run", spec, "--shard", "0/2", "--no-table"],
    "run -q": ["run", spec, "--shard", "1/2", "--no-table", "-q"],
    "merge": ["merge", f"{out}/s.shard0of2.zarr", f"{out}/s.shard1of2.zarr", "--out", f"{out}/m.zarr"],
    "verify": ["verify", f"{out}/m.zarr"],
    "analyze": ["analyze", f"{out}/m.zarr"],
    "report": ["report", f"{out}/m.zarr", "--out", f"{out}/report"],
}
for name, argv in commands.items():
    print(f"<<{name}>>", file=sys.stderr, flush=True)
    if main(argv) != 0:
        sys.exit(f"{name} failed")
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("COLUMNS", None)
    return env


def _under_pty(argv: list[str], cwd: Path, size: tuple[int, int] | None = None) -> tuple[int, str]:
    """Run `argv` with stdin, stdout and stderr on a new pseudo-terminal (of `size` (rows, columns),
    or unsized: 0 x 0); returns (exit status, everything it wrote)."""
    main, child = os.openpty()
    if size is not None:
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
    process = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, cwd=cwd, env=_env(), close_fds=True)
    os.close(child)
    out = b""
    while True:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not data:
                break
            out += data
        elif process.poll() is not None:
            break
    os.close(main)
    return process.wait(), out.decode(errors="replace")


def _parts(text: str) -> dict[str, str]:
    pieces = re.split(r"<<([^>]+)>>", text)
    return dict(zip(pieces[1::2], pieces[2::2]))


SNIPPET = "from workbench.progress import progress_bar\nwith progress_bar(3, desc='steps') as bar:\n    bar.update(3)\n"


@pytest.mark.parametrize("size", [(40, 100), None], ids=["sized", "unsized"])
def test_a_bar_is_drawn_on_a_terminal_of_any_size(tmp_path, size):
    code, out = _under_pty([sys.executable, "-c", SNIPPET], tmp_path, size)
    assert code == 0, out
    assert BAR.search(out) and "3/3" in out, out


def test_no_bar_on_a_file_or_a_pipe(tmp_path):
    with open(tmp_path / "err.txt", "w") as err:
        subprocess.run([sys.executable, "-c", SNIPPET], stderr=err, env=_env(), check=True)
    piped = subprocess.run([sys.executable, "-c", SNIPPET], stderr=subprocess.PIPE, env=_env(), check=True, text=True)
    assert (tmp_path / "err.txt").read_text() == "" and piped.stderr == ""


@pytest.mark.slow
def test_each_long_command_draws_one_bar_on_a_terminal_and_none_into_a_file(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC.replace("STORE", str(tmp_path / "s.zarr")))
    (tmp_path / "drive.py").write_text(DRIVER)
    argv = [sys.executable, "drive.py", "spec.yaml", str(tmp_path)]
    code, out = _under_pty(argv, tmp_path)
    assert code == 0, out
    parts = _parts(out)
    assert list(parts) == ["run", "run -q", "merge", "verify", "analyze", "report"]
    for name, text in parts.items():
        # a bar redraws itself in place: one bar is one line, however many times it was drawn
        bars = [line for line in text.split("\r\n") if BAR.search(line)]
        if name == "run -q":  # -q: no bar of ours, nor transformers' "Loading weights"
            assert not bars and "\r" not in text.replace("\r\n", ""), text
        else:
            assert len(bars) == 1, (name, text)
    assert "Loading weights" not in out

    for store in tmp_path.glob("*.zarr"):  # again from scratch, every stream a file
        subprocess.run(["rm", "-rf", str(store)], check=True)
    with open(tmp_path / "out.txt", "w") as stdout, open(tmp_path / "err.txt", "w") as stderr:
        subprocess.run(argv, cwd=tmp_path, stdout=stdout, stderr=stderr, env=_env(), check=True)
    err = (tmp_path / "err.txt").read_text()
    assert list(_parts(err)) == ["run", "run -q", "merge", "verify", "analyze", "report"]
    for text in (err, (tmp_path / "out.txt").read_text()):
        assert "\r" not in text and not BAR.search(text) and "Loading weights" not in text


def test_progress_false_hides_the_libraries_bars_too(tmp_path, capfd):
    import transformers.utils.logging as hf_logging

    from workbench.runner import run_spec
    from workbench.spec import parse_spec

    spec = parse_spec(SPEC.replace("STORE", str(tmp_path / "s.zarr")).replace("n: 3", "n: 1"))
    before = hf_logging.is_progress_bar_enabled()
    run_spec(spec, progress=False, log=lambda _: None)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled() == before  # restored: the switch is process-wide


def test_a_notebook_without_ipywidgets_gets_a_text_bar_and_no_warning(tmp_path, monkeypatch):
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    cell = ("import sys, warnings\n"
            "sys.modules['ipywidgets'] = None  # as where it is not installed\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n" + "".join(f"    {line}\n" for line in SNIPPET.splitlines()) +
            "print('warnings:', [str(w.message) for w in caught])\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    streams = {name: "".join(o.text for o in nb.cells[0].outputs if o.output_type == "stream" and o.name == name)
               for name in ("stdout", "stderr")}
    assert "warnings: []" in streams["stdout"]
    assert BAR.search(streams["stderr"]) and "3/3" in streams["stderr"]
