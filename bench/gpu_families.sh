#!/usr/bin/env bash
# Every family on a lent GPU in one call (set-up as bench/gpu_lease.sh's, from wheels carried in .whl/):
#   1. bench/gpu_smoke.py with every family's base preset (BERT, GPT, GPT-2, ERNIE 1.0/2.0, RoBERTa, ALBERT, MacBERT,
#      ELECTRA, NEZHA, UniLM, T5, BART, MASS, XLNet with its memory, Transformer-XL with its memory) on one GPU: bf16,
#      ZeRO-1, seq 128, micro batch 32 x 2, 6 steps;
#   2. the recurrent families' memory on the other 16-bit and ZeRO paths (fp16 ZeRO-2, bf16 ZeRO-3, ZeRO-Offload);
#   3. `ptm plan --check` on every run that trained: the speed model's step time next to the measured one on models
#      it was not fitted to.
# DATA: a dataset built beforehand with vocabulary 30522 (`python -m data_prep build CORPUS --out DATA --vocab-size
# 30522`); DATA_T5: the same corpus with the same tokenizer and T5's sentinels (`--tokenizer DATA/tokenizer
# --sentinels 100`). Budget: BUDGET seconds (default 420). Output: RESULTS/log.txt (RESULTS defaults to WORK,
# default runs/gpu-families) and the runs' logs and metrics in RESULTS/runs.tgz. SMOKE: more gpu_smoke.py arguments
# (on a CPU, to check this script: SMOKE="--micro-batch 2 --accumulation 1" PYTHON=.venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${BUDGET:-420} start=$SECONDS out=${WORK:-runs/gpu-families}
data=${DATA:?DATA: a dataset with vocabulary 30522} t5data=${DATA_T5:?DATA_T5: the same with --sentinels 100}
source bench/gpu_setup.sh

# the presets at seq 128: ERNIE's stages cut to the 6 steps, XLNet's reused part and memory to fit 128 tokens, and the
# memory families' validation split large enough to give each of the 64 streams a window of the small corpus
memory=(xlnet-base:model.reuse_len=64 xlnet-base:model.mem_len=128 xlnet-base:xlnet.perm_size=32
        xlnet-base:data.valid_fraction=0.3 transfo-xl:data.valid_fraction=0.3)
others=(t5-base:data.path=$t5data
        "ernie-base:ernie.stages=[{steps: 3, knowledge_level: token}, {steps: 3, knowledge_level: entity}]"
        "ernie2-base:ernie.stages=[{steps: 3, tasks: {knowledge_masking: 1.0, capitalization: 0.5}},
{steps: 3, tasks: {knowledge_masking: 1.0, capitalization: 0.25, sentence_reordering: 0.5, sentence_distance: 0.5}}]")
smoke=($py bench/gpu_smoke.py --out "$out/smoke" --data "$data" --nproc 1 --steps 6 --timeout 120 ${SMOKE:-})
[ "$(left)" -gt 150 ] || { echo "gpu_families.sh: $(left) s left after the set-up: give a larger BUDGET" >&2; exit 2; }
timeout -k 10 $(($(left) - 90)) "${smoke[@]}" --paths bf16-zero1 --set "${memory[@]}" "${others[@]}" --configs \
  xlnet-base transfo-xl bert-base gpt2 t5-base bart-base roberta-base albert-base electra-base ernie-base ernie2-base \
  macbert-base nezha-base gpt mass-base unilm-large
echo "== every family exited $? at $((SECONDS - start)) s"
if [ "$(left)" -gt 60 ]; then
  timeout -k 10 $(($(left) - 30)) "${smoke[@]}" --paths fp16-zero2 bf16-zero3 offload-zero2 --set "${memory[@]}" \
    --configs xlnet-base transfo-xl
  echo "== the memory's paths exited $? at $((SECONDS - start)) s"
fi
for run in "$out"/smoke/runs/n1/*; do
  [ -f "$run/metrics.jsonl" ] && echo "== $(basename "$run")" && $py -m pretrain plan --check "$run" 2>&1 | tail -4
done
find "$out" \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.yaml' -o -name 'events.*' \) \
  -not -path '*/checkpoints/*' -not -path '*/data/*' | tar czf "$results/runs.tgz" -T - 2>/dev/null
echo "== done in $((SECONDS - start)) s"
