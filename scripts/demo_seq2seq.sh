#!/usr/bin/env bash
# The encoder-decoders on the embedded corpus (after `make demo`, whose dataset and tokenizer they reuse): a tiny
# T5 (span corruption; its dataset rebuilt with 100 sentinels), BART (denoising) and MASS, each trained with 4
# processes (tensor parallel 2 x data parallel 2, ZeRO-2; CPU, a few minutes each), then their held-out accuracy on
# the predicted tokens beside the unigram guess (for BART also copying the corrupted input; for T5 also on the span
# tokens alone, the spans it fills).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
[ -f "$out/data/manifest.json" ] || { echo "run 'make demo' first: it builds $out/data"; exit 2; }
[ -f "$out/data-t5/manifest.json" ] || $py -m data_prep build "$out/corpus" --out "$out/data-t5" \
  --tokenizer "$out/data" --sentinels 100 --shard-size 1MB --workers 2
for family in ${PTM_DEMO_FAMILIES:-t5 bart mass}; do
  data=$out/data; [ "$family" = t5 ] && data=$out/data-t5
  $py -m torch.distributed.run --nproc_per_node 4 --master_port "${PTM_DEMO_PORT:-29518}" -m pretrain train \
    --config "configs/$family-tiny.yaml" --set "data.path=$data" "out_dir=$out/$family-tiny" parallel.tp=2 \
    zero.stage=2 train.eval_steps=50
  $py - "$out/$family-tiny" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
shown = {k: s[k] for k in ("valid_lm_loss", "valid_lm_acc", "valid_lm_unigram_acc", "valid_lm_copy_acc",
                           "valid_lm_span_acc", "valid_lm_span_unigram_acc") if k in s}
print(sys.argv[1], json.dumps(shown))
PY
done
