"""Held-out masked LM of a teacher, the student distilled from it and the same student trained from scratch, on the
same samples and masked tokens (the distilled run's validation split), in one process:

    teacher             distill.teacher of the distilled run
    distilled student   the distilled run's weights
    student from scratch  the other run's weights (the same model config, trained on masked LM alone)

    python scripts/distil_eval.py DISTILLED_RUN SCRATCH_RUN [--eval-steps N]
"""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("PTM_EVAL_PORT", "29543")
from eval_runs import take_weights, trainer_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("distilled", help="the out_dir of the run with data.objective=distil or tinybert")
    ap.add_argument("scratch", help="the out_dir of the same student trained without a teacher")
    ap.add_argument("--eval-steps", type=int, default=50, help="held-out global batches (train.eval_steps; default: "
                                                               "%(default)s)")
    args = ap.parse_args()
    trainer, rows = trainer_of(args.distilled, args.eval_steps), {}
    try:
        distilled = trainer.evaluate()
        rows["teacher"] = {"loss": distilled["valid_teacher_mlm_loss"], "acc": distilled["valid_teacher_mlm_acc"]}
        rows["distilled student"] = {"loss": distilled["valid_mlm_loss"], "acc": distilled["valid_mlm_acc"]}
        take_weights(trainer, args.scratch, "distil_eval", besides=("teacher.", "fit."))  # TinyBERT's projection
        scratch = trainer.evaluate()
        rows["student from scratch"] = {"loss": scratch["valid_mlm_loss"], "acc": scratch["valid_mlm_acc"]}
    finally:
        trainer.close()
    print(f"{'held-out masked LM':<22}{'loss':>10}{'accuracy':>10}")
    for name, row in rows.items():
        print(f"{name:<22}{row['loss']:>10.4f}{row['acc']:>10.4f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
