# Quick start: `make demo` (prepare the embedded corpus and show it), `make test` (the test suite).
# Both run scripts/setup.sh first: apt packages, .venv, pinned torch/deepspeed/megatron-core, ptm.
PY := .venv/bin/python

.PHONY: setup demo test bench
setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(PY) -m pytest -q tests

bench: setup
	@bash scripts/setup.sh dev,hf,mpi,kernels,eval,bench
	$(PY) bench/prep_throughput.py
	$(PY) bench/parallel_overhead.py
