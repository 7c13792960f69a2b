#!/usr/bin/env bash
# The quick-start job on the embedded corpus (English + Chinese): prepare an Arrow dataset, train a tiny BERT on
# it with 4 processes (tensor parallel 2 x data parallel 2, ZeRO-2; CPU, about five minutes), plot its curves,
# export it to Hugging Face format and ask transformers to fill masks.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
$py -m data_prep corpus --out "$out/corpus"
$py -m data_prep build "$out/corpus" --out "$out/data" --vocab-size 8000 --shard-size 1MB --workers 2
$py -m data_prep verify "$out/data"
$py -m data_prep inspect "$out/data" --samples 1 --top 10
$py -m torch.distributed.run --nproc_per_node 4 --master_port "${PTM_DEMO_PORT:-29517}" -m pretrain train \
  --config configs/bert-tiny.yaml --set "data.path=$out/data" "out_dir=$out/bert-tiny" parallel.tp=2 zero.stage=2
$py -m pretrain report "$out/bert-tiny" > /dev/null
echo "curves: $out/bert-tiny/report.png"
$py -m checkpoints_tools to-hf "$out/bert-tiny" --out "$out/hf"
$py scripts/fill_mask.py "$out/hf"
