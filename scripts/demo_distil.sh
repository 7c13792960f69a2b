#!/usr/bin/env bash
# Distillation on the embedded corpus (after `make demo`): a 4-layer bert-tiny teacher (masked LM on full sentences,
# the students' samples; 2400 steps), then a 2-layer DistilBERT student distilled from it (soft targets, masked LM,
# hidden-state cosine; starting from teacher layers 0 and 2) and the same student trained from scratch on masked LM
# alone, 600 steps each; then a 2-layer TinyBERT student half as wide (400 steps layer-wise, 200 on the prediction
# layer) and the same student from scratch; all with 4 processes (tensor parallel 2 x data parallel 2, ZeRO-2; CPU).
# scripts/distil_eval.py then gives each student's, its scratch twin's and the teacher's held-out masked-LM loss and
# accuracy on the same masked tokens; the students are exported as DistilBertForMaskedLM and BertForMaskedLM.
# PTM_DEMO_SET="KEY=VALUE ..." adds overrides to the student runs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
[ -f "$out/data/manifest.json" ] || { echo "run 'make demo' first: it builds $out/data"; exit 2; }
launch=($py -m torch.distributed.run --nproc_per_node 4 --master_port "${PTM_DEMO_PORT:-29523}" -m pretrain train)
"${launch[@]}" --config configs/bert-tiny.yaml --set "data.path=$out/data" "out_dir=$out/bert-tiny-4l" \
  model.num_layers=4 "model.heads=[mlm]" data.objective=mlm train.steps=2400 parallel.tp=2 zero.stage=2
for student in distilbert tinybert; do
  "${launch[@]}" --config "configs/$student-tiny.yaml" --set "data.path=$out/data" "out_dir=$out/$student-tiny" \
    "distill.teacher=$out/bert-tiny-4l" parallel.tp=2 zero.stage=2 ${PTM_DEMO_SET:-}
  "${launch[@]}" --config "configs/$student-tiny.yaml" --set "data.path=$out/data" "out_dir=$out/$student-tiny-scratch" \
    data.objective=mlm parallel.tp=2 zero.stage=2 ${PTM_DEMO_SET:-}
  $py scripts/distil_eval.py "$out/$student-tiny" "$out/$student-tiny-scratch"
  $py -m checkpoints_tools to-hf "$out/$student-tiny" --out "$out/hf-$student"
done
