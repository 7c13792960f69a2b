# Sourced by bench/gpu_lease.sh and bench/gpu_families.sh after they set `budget`, `start` and `out`: everything after
# goes to RESULTS/log.txt too (RESULTS defaults to `out`); `left` says the seconds left of the budget. On a GPU machine
# with torch but no package registry, install what ptm still needs from wheels carried in .whl/ (the list in
# gpu_lease.sh's header; DeepSpeed as its sdist, built there), build data_prep's compiled loops for this python, and
# print the GPU and the versions. Sets `py` and `results`; exits 2 on a failed set-up.
results=${RESULTS:-$out}
left() { echo $((budget - (SECONDS - start))); }
mkdir -p "$out" "$results"
exec > >(tee "$results/log.txt") 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py=${PYTHON:-python3}
if ! $py -c "import deepspeed, megatron.core" 2>/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 2
  DS_BUILD_OPS=0 $py -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site \
    .whl/*.tar.gz || exit 2
fi
$py -c "import data_prep._structure" 2>/dev/null || $py setup.py -q build_ext --inplace || exit 2
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
$py -c "import torch, deepspeed, megatron.core, transformers; print('torch', torch.__version__, 'deepspeed', \
deepspeed.__version__, 'transformers', transformers.__version__)" || exit 2
echo "== set-up took $((SECONDS - start)) s"
