#!/usr/bin/env bash
# The comparison demo (README "Stage 4"): BERT, RoBERTa, ELECTRA, GPT, T5, XLNet and ELMo at their tiny sizes,
# pretrained on the embedded corpus for the same training FLOPs (2e12, as `ptm plan` counts them), each fine-tuned
# on two shipped tasks (4 epochs of at most 400 examples, 3 seeds) beside the same architecture without pretraining.
# CPU, about 26 minutes on 2 cores (25.6 measured from a fresh directory); re-running continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
if [ ! -f "$out/data/manifest.json" ]; then
  $py -m data_prep corpus --out "$out/corpus"
  $py -m data_prep build "$out/corpus" --out "$out/data" --vocab-size 8000 --shard-size 1MB --workers 2
fi
corpus=(); [ -d "$out/corpus" ] && corpus=(--corpus "$out/corpus")
[ -f "$out/tasks/next/task.yaml" ] || $py -m downstream tasks --out "$out/tasks" "${corpus[@]}"
$py -m downstream compare bert roberta electra gpt t5 xlnet elmo --size tiny --data "$out/data" \
  --task "$out/tasks/source" --task "$out/tasks/next" --budget flops=2e12 --out "$out/compare" \
  --epochs 4 --batch-size 16 --seeds 1 2 3 --lrs 1e-3 --task-model-lrs 3e-3 --max-train 400 --max-len 64 \
  --no-progress \
  --set data.seq_len=64
