# Two entry points for a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Both create the virtual environment first: `make demo` installs the package alone (its base dependencies are all the
# demo imports), `make test` (and `make venv`) adds every extra the suite, mypy and the benchmarks use.
#
# torch==2.13.0 is installed only when the venv has no torch. PyPI's Linux torch is the CUDA build (about 20 nvidia-*
# packages, several GB), so on a machine without a GPU (no nvidia-smi on PATH) pip also reads PyTorch's CPU index:
# "==2.13.0" matches its "2.13.0+cpu", the higher version, which wins. --no-deps asks that index for torch alone; its
# dependencies come with the package's install from the ordinary index. With a GPU the install is the plain one.
# `make TORCH_FROM= ...` forces the plain install.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
BASE   := $(VENV)/.smile-llm-base
STAMP  := $(VENV)/.smile-llm-installed
EXTRAS := test,dev,hf,bench,java,ray
TORCH_FROM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,--no-deps --extra-index-url https://download.pytorch.org/whl/cpu)

.PHONY: venv demo test bench typecheck clean

venv: $(STAMP)

$(BASE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_FROM) "torch==2.13.0"
	$(PY) -m pip install --quiet -e .
	touch $(BASE)

$(STAMP): $(BASE)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: $(BASE)
	$(PY) -m smile_llm demo
	$(PY) -m smile_llm demo --kind hybrid

test: $(STAMP)
	$(PY) -m mypy smile_llm java_bridge
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/cache_trace.py
	$(PY) benchmarks/put_get_throughput.py
	$(PY) benchmarks/step_bookkeeping.py
	$(PY) benchmarks/reference_attention.py
	$(PY) benchmarks/speculative.py

typecheck: $(STAMP)
	$(PY) -m mypy smile_llm java_bridge

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache
