# Quick start: `make demo` (embedded corpus -> dataset -> tiny BERT -> curves -> HF -> fill-mask), `make test`.
# Both run scripts/setup.sh first: apt packages, .venv, pinned torch/deepspeed/megatron-core, ptm.
PY := .venv/bin/python

.PHONY: setup demo test bench
setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not serial" tests; a=$$?; \
	$(PY) -m pytest -q -m serial tests; b=$$?; [ $$a = 0 ] && [ $$b = 0 ]

bench: setup
	@bash scripts/setup.sh dev,hf,mpi,kernels,eval,bench
	$(PY) bench/prep_throughput.py
	$(PY) bench/parallel_overhead.py
