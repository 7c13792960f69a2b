"""What scripts/memory_eval.py and scripts/distil_eval.py share: one process (no launcher) that evaluates a run's
config from its latest checkpoint, and then another run's weights in their place."""
from __future__ import annotations

import os
import sys

for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", os.environ.get("PTM_EVAL_PORT", "29541")),
                   ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(key, value)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pretrain.checkpoint import load_full_model, resolve  # noqa: E402
from pretrain.config import load  # noqa: E402
from pretrain.train import Trainer  # noqa: E402


def trainer_of(run: str, eval_steps: int) -> Trainer:
    """A one-process trainer of `run`'s config, resumed from its latest checkpoint, evaluating `eval_steps` global
    batches."""
    return Trainer(load(os.path.join(run, "config.yaml"),
                        ["parallel.tp=1", "zero.stage=1", f"out_dir={run}", f"train.eval_steps={eval_steps}"]))


def take_weights(trainer: Trainer, run: str, script: str, besides: tuple[str, ...] = ()) -> None:
    """`run`'s weights in the trainer's model (whose parameters under the prefixes `besides`, e.g. a teacher, stay);
    exits with one line when they are another model's."""
    missing, unexpected = trainer.engine.module.load_state_dict(load_full_model(resolve(run)), strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and not k.startswith(besides)]
    if missing or unexpected:
        sys.exit(f"{script}: {run} holds another model (missing {missing[:3]}, unexpected {unexpected[:3]})")
