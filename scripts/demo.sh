#!/usr/bin/env bash
# The quick-start job: fetch the embedded corpus (English + Chinese), build a dataset, verify, inspect.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PTM_DEMO_DIR:-runs/demo}
py=.venv/bin/python
$py -m data_prep corpus --out "$out/corpus"
$py -m data_prep build "$out/corpus" --out "$out/data" --vocab-size 8000 --shard-size 1MB --workers 2 --overwrite
$py -m data_prep verify "$out/data"
$py -m data_prep inspect "$out/data" --samples 2 --top 15
