#!/usr/bin/env bash
# ELMo on the embedded corpus (after `make demo`): the demo dataset's words (`data_prep words`: Latin words and jieba's
# Chinese words, each sentence <S> words </S>, the vocabulary by count), a tiny ELMo (character CNN, 2 x 2 LSTM layers
# of 256 cells projected to 64, one shared softmax over the 35k words) trained with 4 processes (tensor parallel 2 x
# data parallel 2, ZeRO-2; CPU, about 6 minutes), its held-out loss in both directions beside the unigram guess's,
# its export to bilm-tf's files (what AllenNLP's Elmo reads), and the representations of a sentence from them.
# PTM_DEMO_SET="KEY=VALUE ..." adds overrides (train.steps=..., another learning rate).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
[ -f "$out/data/manifest.json" ] || { echo "run 'make demo' first: it builds $out/data"; exit 2; }
[ -f "$out/words/manifest.json" ] || $py -m data_prep words "$out/data" --out "$out/words" --no-progress
$py -m torch.distributed.run --nproc_per_node 4 --master_port "${PTM_DEMO_PORT:-29521}" -m pretrain train \
  --config configs/elmo-tiny.yaml --set "data.path=$out/words" "out_dir=$out/elmo-tiny" parallel.tp=2 zero.stage=2 \
  ${PTM_DEMO_SET:-}
$py - "$out/elmo-tiny" <<'PY'
import json, math, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/valid.jsonl")]
last = rows[-1]
for d, name in (("fwd", "forward"), ("bwd", "backward")):
    print(f"held-out {name} LM at step {last['step']}: loss {last[f'valid_{d}_loss']:.3f} (perplexity "
          f"{math.exp(last[f'valid_{d}_loss']):.0f}), unigram guess {last[f'valid_{d}_unigram_loss']:.3f} (perplexity "
          f"{math.exp(last[f'valid_{d}_unigram_loss']):.0f})")
PY
$py -m checkpoints_tools to-elmo "$out/elmo-tiny" --out "$out/elmo"
$py -m pretrain elmo "$out/elmo" --text "Return the value of the attribute ."
