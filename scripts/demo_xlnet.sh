#!/usr/bin/env bash
# XLNet and the Transformer-XL style on the embedded corpus (after `make demo`, whose dataset they reuse): a tiny XLNet
# (permutation LM, two streams) and a tiny causal Transformer-XL style model (causal LM), each trained with 4 processes
# (tensor parallel 2 x data parallel 2, ZeRO-2; CPU, a few minutes each), then their held-out accuracy on the
# predicted tokens beside the unigram guess.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
[ -f "$out/data/manifest.json" ] || { echo "run 'make demo' first: it builds $out/data"; exit 2; }
for preset in ${PTM_DEMO_PRESETS:-xlnet-tiny transfo-xl-tiny}; do
  $py -m torch.distributed.run --nproc_per_node 4 --master_port "${PTM_DEMO_PORT:-29519}" -m pretrain train \
    --config "configs/$preset.yaml" --set "data.path=$out/data" "out_dir=$out/$preset" parallel.tp=2 zero.stage=2 \
    train.eval_steps=50
  $py - "$out/$preset" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
print(sys.argv[1], json.dumps({k: s[k] for k in ("valid_lm_loss", "valid_ppl", "valid_lm_acc", "valid_lm_unigram_acc")
                               if k in s}))
PY
done
