#!/usr/bin/env bash
# The package as a user installs it: build the wheel and the sdist, install the wheel into two
# fresh venvs outside the checkout (nothing imports its sources), and use them:
#   capture: `vlm-workbench[models]` (torch 2.13.0 CPU first: a bare torch requirement pulls a
#            multi-GB CUDA build) runs `workbench --version` and a tiny spec into a store;
#   read:    `vlm-workbench` alone (no torch) opens that store, imports analyses, and runs
#            `workbench info` and `workbench analyze` on it.
# pip's cache serves the dependencies after the first time. Usage: .ci/wheel_check.sh [PYTHON]
# (PYTHON builds the venvs and must have `build`, the test extra's; default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=$(realpath -s "${1:-.venv/bin/python}")  # -s: a venv's python, not the interpreter it links to
REPO=$PWD
WORK=$(mktemp -d "${TMPDIR:-/tmp}/wheel-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg
export WORKBENCH_CACHE="$WORK/cache"  # the tiny models, built here from transformers classes
unset PYTHONPATH VIRTUAL_ENV
step() { printf '\n== %s\n' "$*"; }

step "build the sdist and the wheel"
left=$(ls -d "$REPO/build" "$REPO"/*.egg-info 2>/dev/null || true)  # what setuptools may leave beside the sources
"$PYTHON" -m build --outdir "$WORK/dist" "$REPO" >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
for made in "$REPO/build" "$REPO"/*.egg-info; do
    if [[ -e $made && $'\n'$left$'\n' != *$'\n'$made$'\n'* ]]; then rm -rf "$made"; fi  # only what this build made
done
ls "$WORK"/dist
WHEEL=$(ls "$WORK"/dist/vlm_workbench-*.whl)
ls "$WORK"/dist/vlm_workbench-*.tar.gz >/dev/null

step "the capture side: torch 2.13.0 (CPU), then the wheel with [models]"
"$PYTHON" -m venv "$WORK/capture"
"$WORK/capture/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
"$WORK/capture/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL[models]"

step "the read side: the wheel alone"
"$PYTHON" -m venv "$WORK/read"
"$WORK/read/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL"

cd "$WORK"
cat >tiny.yaml <<'SPEC'
name: wheel-check
models: [tiny-smolvlm]
data: {source: builtin, n: 2}
conditions:
  baseline: {}
  alpha:
    sweep: {alpha: [0.5, 2.0]}
    interventions:
      - {kind: scale, site: projector, factor: $alpha, positions: vision}
capture:
  - {site: layer, layers: all}
store: {path: stores/tiny.zarr}
SPEC

step "capture: workbench --version, then the tiny spec"
capture/bin/workbench --version
capture/bin/workbench run tiny.yaml --no-progress

step "read: no torch, the store opened, analysed and reported"
read/bin/workbench --version
if read/bin/python -c "import torch" 2>/dev/null; then echo "the read side installed torch" >&2; exit 1; fi
read/bin/python - <<'PY'
import sys

import analyses  # noqa: F401  (the analysis package, as installed)
import workbench

ds = workbench.open_store("stores/tiny.zarr", model="tiny-smolvlm")
assert ds.sizes["run"] == 2 * 3, ds.sizes  # 2 samples x (baseline + 2 alphas)
frame = workbench.to_dataframe(ds, "hidden")
assert len(frame) and {"layer", "condition"} <= set(frame.columns), frame.columns
heavy = sorted(m for m in ("torch", "transformers", "nnsight") if m in sys.modules)
assert not heavy, f"reading a store imported {heavy}"
print(f"read side: {len(frame)} rows of hidden, imports neither torch nor nnsight")
PY
read/bin/workbench info stores/tiny.zarr
read/bin/workbench analyze stores/tiny.zarr norm-ratio
read/bin/workbench report stores/tiny.zarr --out report >/dev/null
test -s report/report.md && test -s report/report.html
step "wheel check passed"
