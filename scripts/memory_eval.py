"""Held-out loss of a run trained with a memory (model.mem_len > 0) and of the same config trained without one,
on the same samples and predicted tokens (the memory run's validation streams), in one process:

    with memory      the memory run's weights reading their memory
    memory masked    the same weights, every memory slot masked out
    without memory   the no-memory run's weights (memory masked: they never learned to read one)

    python scripts/memory_eval.py RUN_WITH RUN_WITHOUT [--eval-steps N]

Each run's latest checkpoint, whatever layout trained it.
"""
from __future__ import annotations

import argparse
import json
import sys

from eval_runs import take_weights, trainer_of

KEYS = ("valid_lm_loss", "valid_lm_acc", "valid_lm_unigram_acc")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("with_memory", help="the out_dir of the run trained with model.mem_len > 0")
    ap.add_argument("without_memory", help="the out_dir of the same config trained with model.mem_len=0")
    ap.add_argument("--eval-steps", type=int, default=50, help="held-out global batches (train.eval_steps; default: "
                                                               "%(default)s)")
    args = ap.parse_args()
    trainer, rows = trainer_of(args.with_memory, args.eval_steps), {}
    try:
        if not trainer.cfg.model.mem_len:
            sys.exit(f"memory_eval: {args.with_memory} was trained without a memory (model.mem_len=0); pass the run "
                     "trained with one first")
        rows["with memory"] = trainer.evaluate()
        reads = trainer.objective.memory_inputs

        def masked(model, batch):
            return {k: v & False if k == "memory_mask" else v for k, v in reads(model, batch).items()}
        trainer.objective.memory_inputs = masked
        rows["memory masked"] = trainer.evaluate()
        take_weights(trainer, args.without_memory, "memory_eval")
        rows["without memory"] = trainer.evaluate()
    finally:
        trainer.close()
    print(f"{'':<16}" + "".join(f"{k[6:]:>20}" for k in KEYS))
    for name, row in rows.items():
        print(f"{name:<16}" + "".join(f"{row[k]:>20.4f}" if k in row else f"{'-':>20}" for k in KEYS))
    print(json.dumps({name: {k: row[k] for k in KEYS if k in row} for name, row in rows.items()}))


if __name__ == "__main__":
    main()
