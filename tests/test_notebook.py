"""The tutorial notebook (examples/tutorial.ipynb) runs from top to bottom in a real Jupyter kernel
(nbclient, ipykernel), and is committed without outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import workbench

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "tutorial.ipynb"


def test_the_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


@pytest.mark.slow
def test_the_tutorial_runs_every_cell(tmp_path, monkeypatch):
    shutil.copy2(NOTEBOOK, tmp_path / NOTEBOOK.name)
    nb = nbformat.read(tmp_path / NOTEBOOK.name, as_version=4)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the kernel imports this checkout
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own (inline) backend draws the figure
    # the tiny models come from the test session's cache (WORKBENCH_CACHE, inherited by the kernel)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))  # every cell ran, in order
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for cell in code for o in cell.outputs if o.output_type == "stream")
    assert "<dict>: capture[0].site: got 'layr'" in text  # the located error of a bad dict
    assert "Loading weights" not in text  # progress=False: transformers' bars too
    figures = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 1
    # the custom analysis's table: one row per condition of the store the notebook wrote
    ds = workbench.open_store(tmp_path / "stores" / "tutorial.zarr", "tiny-qwen3vl")
    conditions = sorted(set(ds.run_condition.values.tolist()))
    assert conditions == ["alpha[alpha=0.5]", "alpha[alpha=1.0]", "alpha[alpha=2.0]", "baseline"]
    assert "### Vision-token norm at the last layer" in text
    for condition in conditions:
        assert f"| tiny-qwen3vl | {condition} | " in text
