#!/usr/bin/env bash
# Submit a partitioned data_prep build to Slurm: an array job (one partition per task) and a finalize
# job that runs after all of them succeed.
#   slurm/prep.sh [--wait] PARTITIONS OUT INPUT... --tokenizer TOK [build options]
# Train the shared tokenizer first if you have none:
#   sbatch --wrap "python -m data_prep train-tokenizer INPUT... --out TOK --vocab-size 32000"
# --wait: wait for the finalize job; exit 1 naming the failed job and its logs unless it completed.
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
array=${array%%;*}  # (--parsable: JOBID[;CLUSTER])
echo "submitted array job $array ($parts partitions)"
# shellcheck disable=SC2086
final=$(sbatch --parsable ${PTM_SBATCH_ARGS:-} "${wait[@]}" --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  -J ptm-prep-finalize -o "$out/slurm-finalize-%j.out" --wrap "${PTM_PYTHON:-python} -m data_prep finalize '$out'") \
  || [ -n "${final:-}" ]  # (with --wait, sbatch exits with the job's status: judged below)
final=${final%%;*}
echo "submitted finalize job $final (runs after $array succeeds)"
[ ${#wait[@]} -gt 0 ] || exit 0
# sbatch --wait returns 0 for a job cancelled because a dependency failed: the finalize job's state decides
state=$(scontrol show job -o "$final" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2) || true
case ${state:-UNKNOWN} in
  COMPLETED) echo "dataset $out finalized" ;;
  CANCELLED) echo "$0: array job $array failed (finalize job $final cancelled); see $out/slurm-prep-${array}_*.out" >&2
             exit 1 ;;
  *) echo "$0: finalize job $final ended ${state:-UNKNOWN}; see $out/slurm-finalize-$final.out" >&2; exit 1 ;;
esac
