#!/usr/bin/env bash
# XLNet and the Transformer-XL style on long documents of the embedded corpus (after `make demo`): its English half
# with each standard-library module's docstrings made one document (169 documents, median 859 tokens), encoded with
# the demo's tokenizer. A tiny XLNet (permutation LM, two streams; 1800 steps) and a tiny causal Transformer-XL style
# model (causal LM; 600 steps) are each trained with 4 processes (tensor parallel 2 x data parallel 2, ZeRO-2; CPU,
# minutes each) twice: with the preset's memory carried along streams (model.mem_len) and without it on the same
# samples in the same order (model.mem_len=0 data.streams=true); then scripts/memory_eval.py gives the held-out loss
# (a tenth of the documents held out) of both runs on the same tokens, and of the memory run with its memory masked,
# with XLNet's accuracy on the predicted tokens beside the unigram guess.
# PTM_DEMO_PRESETS="PRESET:STEPS ..." picks the presets and their steps; PTM_DEMO_SET="KEY=VALUE ..." adds overrides
# to every run (another learning rate).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
[ -f "$out/data/manifest.json" ] || { echo "run 'make demo' first: it builds $out/data"; exit 2; }
if [ ! -f "$out/data-long/manifest.json" ]; then
  mkdir -p "$out/corpus-long"
  $py - "$out/corpus/en.jsonl" "$out/corpus-long/modules.jsonl" <<'PY'
import json, sys
modules = {}
for line in open(sys.argv[1]):
    doc = json.loads(line)
    modules.setdefault(doc["source"].split(".")[0], []).append(doc["text"])
with open(sys.argv[2], "w") as f:
    for name, texts in modules.items():
        f.write(json.dumps({"text": "\n\n".join(texts), "source": name}) + "\n")
PY
  $py -m data_prep build "$out/corpus-long" --out "$out/data-long" --tokenizer "$out/data/tokenizer" --workers 2 \
    --no-progress
fi
for run in ${PTM_DEMO_PRESETS:-xlnet-tiny:1800 transfo-xl-tiny:600}; do
  preset=${run%:*} steps=${run#*:}
  for memory in "" -nomem; do
    $py -m torch.distributed.run --nproc_per_node 4 --master_port "${PTM_DEMO_PORT:-29519}" -m pretrain train \
      --config "configs/$preset.yaml" --set "data.path=$out/data-long" "out_dir=$out/$preset$memory" parallel.tp=2 \
      zero.stage=2 data.valid_fraction=0.1 train.eval_steps=50 "train.steps=$steps" \
      ${memory:+model.mem_len=0 data.streams=true} ${PTM_DEMO_SET:-}
  done
  $py scripts/memory_eval.py "$out/$preset" "$out/$preset-nomem"  # both runs on the same held-out tokens
done
