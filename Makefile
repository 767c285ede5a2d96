# Two entry points for a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Both create the virtual environment first. torch==2.13.0 is installed only when the venv has no torch:
# on CPU machines that is the local CPU wheel; never let pip resolve an unpinned CUDA build here.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.smile-llm-installed

.PHONY: venv demo test bench typecheck clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test,dev,hf,bench,java,ray]"
	touch $(STAMP)

demo: $(STAMP)
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
