"""`ptm convert rollback OUT_DIR --step N`: make a run resume from an earlier checkpoint of its own, as after a loss
spike (README "Loss spikes"). Nothing is deleted: the later checkpoints, the logs' rows past step N and the run's
summary.json / failed.json move to OUT_DIR/checkpoints/rolled-back-after-step_N (never resumed nor pruned), and
`latest` names step_N; the same training command then resumes there (with train.skip_steps to leave batches out).
A rollback cut short is finished by the same command, into the same directory."""
from __future__ import annotations

import os
import re

from pretrain.checkpoint import LATEST, CheckpointError, mark_latest, verify
from pretrain.runlog import FAILED, set_aside_past
from ptm.files import fsync_dir

STEP = re.compile(r"step_(\d{8})")
UNFINISHED = ".unfinished"  # in a rolled-back-after-* directory until everything has moved there
RECORDS = ("summary.json", FAILED)  # the abandoned run's: a resumed run writes its own


def rollback(out_dir: str, step: int) -> tuple[str, list[str], dict[str, int]] | None:
    """Roll run `out_dir` back to its checkpoint of `step`: (the directory the rest went to, the checkpoints moved
    there, {log: rows moved}); None where there is nothing to move and that checkpoint is already the one resumed."""
    root = os.path.join(out_dir, "checkpoints")
    if not os.path.isdir(root):
        raise CheckpointError(f"{out_dir} holds no checkpoints ({root} is missing); pass the out_dir of a training run")
    steps = sorted(int(m[1]) for m in map(STEP.fullmatch, os.listdir(root)) if m)
    name = f"step_{step:08d}"
    if step not in steps:
        before = [s for s in steps if s <= step]
        raise CheckpointError(f"{root} has no checkpoint of step {step} (it has step{'s' * (len(steps) != 1)} "
                              f"{', '.join(map(str, steps)) or 'none'}); "
                              + (f"pass --step {before[-1]}, the last before it" if before else
                                 "pass one of those" if steps else "there is nothing to roll back to"))
    problem = verify(os.path.join(root, name), hashes=False)  # (its files' hashes: when the run resumes it)
    if problem:
        raise CheckpointError(f"{name} is damaged ({problem}); roll back to another checkpoint")
    later = [f"step_{s:08d}" for s in steps if s > step]
    records = [r for r in RECORDS if os.path.isfile(os.path.join(out_dir, r))]
    if not later and not records and _latest(root) == name and not any(set_aside_past(out_dir, step, None).values()):
        return None
    aside = _aside(root, name)
    mark_latest(out_dir, name)  # (first: a crash from here on resumes step_N, whatever it moved)
    for moved in later:
        os.rename(os.path.join(root, moved), os.path.join(aside, moved))
    fsync_dir(root)
    rows = set_aside_past(out_dir, step, aside)
    for record in records:
        os.rename(os.path.join(out_dir, record), os.path.join(aside, record))
    fsync_dir(out_dir)
    os.remove(os.path.join(aside, UNFINISHED))
    return aside, later, rows


def _latest(root: str) -> str | None:
    try:
        with open(os.path.join(root, LATEST)) as f:
            return f.read().strip()
    except OSError:
        return None


def _aside(root: str, name: str) -> str:
    """rolled-back-after-NAME (.1, .2, ... after earlier rollbacks to the same step), or the one a rollback cut short
    left unfinished."""
    base, n = os.path.join(root, f"rolled-back-after-{name}"), 0
    while os.path.lexists(base + (f".{n}" if n else "")):
        if os.path.exists(os.path.join(base + (f".{n}" if n else ""), UNFINISHED)):
            return base + (f".{n}" if n else "")
        n += 1
    aside = base + (f".{n}" if n else "")
    os.makedirs(aside)
    open(os.path.join(aside, UNFINISHED), "w").close()
    return aside
