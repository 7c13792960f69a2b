#!/usr/bin/env bash
# A short lease of one GPU machine that has torch but no package registry: one command that installs what ptm still
# needs from wheels carried in .whl/, then runs, each within what is left of BUDGET seconds (default 480):
#   1. bench/gpu_step.py on BERT-large seq 128 bf16 at micro batch 64 and 256: ptm next to Hugging Face compiled and
#      ptm's whole model compiled;
#   2. bench/gpu_profile.py on the same: where ptm's step spends its time, per variant;
#   3. bench/gpu_smoke.py: every GPU-only path for a few steps (BERT-base), the most used paths first;
#   4. one `ptm train` of BERT-large phase 1 (seq 128, micro batch auto, bf16, LAMB, ZeRO-1), `ptm plan --calibrate`
#      (this host's time per kernel launch) and `ptm plan --check` on the run and on every smoke path that ran: the
#      speed model's prediction next to what this GPU measured (launches counted for BERT-large and bf16-zero1);
#   5. with what is left, CUDA-graphed blocks (a process of their own), then bench/gpu_step.py on BERT-large seq 512
#      and GPT-2 medium seq 1024.
# Runs go to WORK (default runs/gpu-lease); what it prints to RESULTS/log.txt and the runs' logs and metrics (no
# checkpoints) to RESULTS/runs.tgz (RESULTS defaults to WORK).
# DATA: a dataset built beforehand (the embedded corpus's Chinese part needs Debian's fortunes-zh, which such a
# machine may lack), built where it is as gpu_smoke.py builds its own: `python -m data_prep corpus --out C` and
# `python -m data_prep build C --out DATA --vocab-size 30522`.
#
# The wheels, fetched on a machine with the registry (python 3.12 shown; match the GPU machine's python):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl megatron-core==0.16.1 liger-kernel==0.8.5 zstandard \
#     hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions
#   pip download --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8  # an sdist, built there against its torch
# (plus jieba==0.42.1's sdist, 19 MB, only where DATA is not given: the embedded corpus's Chinese part needs it.)
# data_prep's compiled loops are built there too (setup.py; the image has Cython and a compiler).
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${BUDGET:-480} start=$SECONDS out=${WORK:-runs/gpu-lease} data=${DATA:-}
source bench/gpu_setup.sh

# Each step gets at most its share (seconds) of what is left: the re-measurement of the step first, then where its
# time goes, then every GPU path, then a real `ptm train` for the speed model's check.
share() { local n=$(($(left) - $2)); [ "$n" -gt "$1" ] && n=$1; echo "$n"; }
if [ "$(share 200 60)" -gt 60 ]; then
  timeout -k 10 "$(share 200 60)" $py bench/gpu_step.py --cases bert-large-128 --precisions bf16 --steps 8 \
    --micro 64 256 --rows ptm "HF compiled" "ptm whole-compiled"
  echo "== gpu_step exited $? at $((SECONDS - start)) s"
fi
if [ "$(share 100 60)" -gt 40 ]; then
  timeout -k 10 "$(share 100 60)" $py bench/gpu_profile.py --steps 4 2>&1 |
    grep -v -E "^MA |CPU Virtual|group|bf16_optimizer|untested"  # DeepSpeed's memory notes
  echo "== gpu_profile exited at $((SECONDS - start)) s"
fi
paths="bf16-zero1 bf16-zero0 bf16-zero2 bf16-zero3 fp16-zero1 fp16-zero2 fp16-zero0 fp16-zero3 fused-loss-on
fused-loss-off unpadded compile fp32-zero1 fp32-zero0 fp32-zero2 fp32-zero3 offload-zero2 offload-zero3"
if [ "$(share 260 50)" -gt 30 ]; then
  timeout -k 10 "$(share 260 50)" $py bench/gpu_smoke.py --out "$out/smoke" --steps 6 --timeout 120 --paths $paths \
    ${data:+--data "$data"}
  echo "== gpu_smoke exited $? at $((SECONDS - start)) s"
fi

large=$out/bert-large data=${data:-$out/smoke/data}
if [ -f "$data/manifest.json" ] && [ "$(left)" -gt 45 ]; then
  timeout -k 10 $(($(left) - 15)) $py -m pretrain train --config bert-large --set "data.path=$data" \
    model.vocab_size=0 data.seq_len=128 train.micro_batch_size=auto train.global_batch_size=512 train.steps=10 \
    precision=bf16 zero.stage=1 optimizer.name=lamb optimizer.warmup_steps=0 train.eval_interval=0 \
    checkpoint.interval=0 "out_dir=$large" > "$out/bert-large.log" 2>&1
  echo "== bert-large exited $? at $((SECONDS - start)) s"; tail -3 "$out/bert-large.log"
fi
if [ -f "$data/manifest.json" ] && [ "$(left)" -gt 60 ]; then
  timeout -k 10 60 $py -m pretrain plan --config bert-base --calibrate --set "data.path=$data" model.vocab_size=0 \
    data.seq_len=128 precision=bf16
fi
for run in "$large" "$out"/smoke/runs/n1/*; do
  count=$([ "$run" = "$large" ] || [ "${run##*/}" = bf16-zero1 ] && echo --count-launches)
  [ -f "$run/metrics.jsonl" ] && timeout -k 10 90 $py -m pretrain plan --check "$run" $count
done
if [ "$(left)" -gt 60 ]; then  # CUDA-graphed blocks, in a process of their own: a failed capture spoils the next rows
  timeout -k 10 $(($(left) - 45)) $py bench/gpu_step.py --cases bert-large-128 --precisions bf16 --steps 8 \
    --micro 256 --rows "ptm graphed"
  echo "== gpu_step (graphed) exited $? at $((SECONDS - start)) s"
fi
if [ "$(left)" -gt 90 ]; then  # what is left: the longer sequences, for the speed model's length terms
  timeout -k 10 $(($(left) - 20)) $py bench/gpu_step.py --cases bert-large-512 gpt2-medium-1024 gpt3-small-2048 \
    gpt3-small-2048-dense --precisions bf16 --steps 6
  echo "== gpu_step (longer sequences) exited $? at $((SECONDS - start)) s"
fi
find "$out" \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.yaml' -o -name 'events.*' \) \
  -not -path '*/checkpoints/*' -not -path '*/data/*' | tar czf "$results/runs.tgz" -T - 2>/dev/null
echo "== done in $((SECONDS - start)) s"
