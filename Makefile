# Two commands do all the set-up on a fresh clone:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow typecheck wheel-check docs install clean-stores trained-models

demo: $(STAMP)
	$(BIN)/workbench run specs/demo.yaml

# one pytest-xdist worker per core; a test file stays on one worker (--dist loadfile), so its module
# fixtures (a shared store, a loaded model) are built once
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow"

# the trained tiny VLMs (tiny-smolvlm-trained, tiny-qwen3vl-trained), trained on the CPU into the
# model cache ($$WORKBENCH_CACHE or ~/.cache/workbench) once; the tests and the README's offline
# path reuse them. CI runs it before `make test`; it prints each build's wall and CPU time.
trained-models: $(STAMP)
	$(BIN)/python -m workbench.models.training

# the slow drills (kill at every store write, every README command, the benchmark smoke tests,
# batching on every family): CI runs them after `make test`
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# mypy over workbench/ and analyses/ ([tool.mypy] in pyproject.toml: every body checked, the
# libraries' stubs from the `test` extra). CI runs it after `make test`.
typecheck: $(STAMP)
	$(BIN)/python -m mypy

# the package as a user installs it (.ci/wheel_check.sh): the wheel and sdist built, the wheel
# installed into fresh venvs (the read side alone, without torch; the capture side with [models]),
# a tiny spec run and its store analysed from there. CI runs it after test-slow.
wheel-check: $(STAMP)
	.ci/wheel_check.sh $(BIN)/python

# the docs site (mkdocs.yml, docs/) into site/, in strict mode: a warning (a broken link, a page
# missing from the nav) fails it. The reference, the families table and the analysis catalogue are
# generated from the registries by docs/hooks/reference.py. CI runs it after test-slow.
docs: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m mkdocs build --strict

install: $(STAMP)

# torch first and pinned to the CPU wheel: a bare `torch` requirement pulls a multi-GB CUDA build.
# A torch already in the venv (e.g. a CUDA build on a GPU machine) is kept. The `sae` extra (SAELens)
# is installed so that the tests and CI run the sparse-autoencoder commands.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[models,test,docs,sae]"
	touch $(STAMP)

clean-stores:
	rm -rf stores/*.zarr stores/*.lock stores/*.readers

# Benchmarks (benchmarks/README.md): ratios against baselines timed in the same run.
# `bench`: tiny + real-size random-weight models (~12 min, ~12 GB RAM); writes
# benchmarks/results/latest.json and the table into benchmarks/README.md.
# `bench-quick`: tiny models only (~4 min); writes benchmarks/results/quick.json.
# `bench-disk`: on-disk bytes of a store after a run ends against its arrays' bytes (~3 min).
# `bench-cluster`: analyses on a dask cluster of a store 4x larger than each worker's memory limit.
.PHONY: bench bench-quick bench-disk bench-cluster
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick --out benchmarks/results/quick.json --no-readme

bench-disk: $(STAMP)
	$(BIN)/python -m benchmarks.disk_bench --out benchmarks/results/disk.json

bench-cluster: $(STAMP)
	$(BIN)/python -m benchmarks.cluster_bench --store-mb 3072 --worker-mb 768 --out benchmarks/results/cluster.json
