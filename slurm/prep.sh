#!/usr/bin/env bash
# Submit a partitioned data_prep build to Slurm: an array job (one partition per task) and a finalize
# job that runs after all of them succeed.
#   slurm/prep.sh [--wait] PARTITIONS OUT INPUT... --tokenizer TOK [build options]
# Train the shared tokenizer first if you have none:
#   sbatch --wrap "python -m data_prep train-tokenizer INPUT... --out TOK --vocab-size 32000"
# Extra sbatch options (account, partition, time) go in PTM_SBATCH_ARGS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
wait=()
if [ "${1:-}" = "--wait" ]; then wait=(--wait); shift; fi
[ $# -ge 3 ] || { echo "usage: $0 [--wait] PARTITIONS OUT INPUT... --tokenizer TOK [build options]" >&2; exit 2; }
parts=$1 out=$2; shift 2
case $parts in ''|*[!0-9]*|0) echo "$0: PARTITIONS '$parts' is not a count (1, 2, ...)" >&2; exit 2;; esac
case " $* " in *" --tokenizer "*|*" --tokenizer="*) ;;
  *) echo "$0: pass --tokenizer (partitions must share one tokenizer)" >&2; exit 2;; esac
mkdir -p "$out"
# shellcheck disable=SC2086
array=$(sbatch --parsable ${PTM_SBATCH_ARGS:-} --array=0-$((parts - 1)) -o "$out/slurm-prep-%A_%a.out" \
  "$here/prep.sbatch" "$out" "$@")
echo "submitted array job $array ($parts partitions)"
# shellcheck disable=SC2086
final=$(sbatch --parsable ${PTM_SBATCH_ARGS:-} "${wait[@]}" --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  -J ptm-prep-finalize -o "$out/slurm-finalize-%j.out" --wrap "${PTM_PYTHON:-python} -m data_prep finalize '$out'")
echo "submitted finalize job $final (runs after $array succeeds)"
