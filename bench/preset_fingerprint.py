"""Every preset, narrowed, trained a few steps: a fingerprint of its weights and losses, to show that a change of the
shared machinery changes no family's training (issue 40: "every preset is bit-identical before and after").

    python bench/preset_fingerprint.py DATA [DATA_T5 WORDS] --out before.json
    python bench/preset_fingerprint.py DATA [DATA_T5 WORDS] --against before.json   # exit 1 if any preset differs

Each preset runs as its config says (objective, masking, precision, ZeRO stage, optimizer, dropout, kernels) at a width
where compute is nothing (`pretrain.launches.narrow`'s: 8-wide heads, the same layers and heads), one process, 2
micro-batches of one sequence a step, STEPS steps, on the first of the datasets it can train on (DATA; DATA_T5, with
T5's sentinels; WORDS, `data_prep words`' for ELMo), each preset in a process of its own. The fingerprint: the
sha256 of every final weight, bit for bit, and the loss of every step. A distillation preset whose teacher is not on
this machine gets one trained first, as `_teacher` says. A preset that cannot run here says why and is compared as such.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data_prep import PrepError  # noqa: E402
from pretrain import checkpoint as C  # noqa: E402
from pretrain.config import PRESETS_DIR, ConfigError, load  # noqa: E402
from pretrain.launches import narrow  # noqa: E402

STEPS = 8


def presets() -> list[str]:
    return sorted(f.removesuffix(".yaml") for f in os.listdir(PRESETS_DIR) if f.endswith(".yaml"))


def _shortened(cfg):
    """`cfg` at STEPS steps; a schedule of stages whose steps add up to train.steps (ERNIE's) keeps its shares, and so
    does a phase counted in steps (`distill.layer_steps`)."""
    for section in vars(cfg).values():
        for key, value in vars(section).items() if dataclasses.is_dataclass(section) else ():
            if key.endswith("_steps") and key != "warmup_steps" and type(value) is int and 0 < value < cfg.train.steps:
                setattr(section, key, max(1, round(STEPS * value / cfg.train.steps)))
        for value in vars(section).values() if dataclasses.is_dataclass(section) else ():
            if isinstance(value, list) and value and all(dataclasses.is_dataclass(v) and hasattr(v, "steps")
                                                         for v in value):
                if sum(v.steps for v in value) == cfg.train.steps:
                    shares = [max(1, round(STEPS * v.steps / cfg.train.steps)) for v in value]
                    shares[-1] = STEPS - sum(shares[:-1])
                    for v, steps in zip(value, shares):
                        v.steps = steps
    cfg.train.steps = STEPS
    return cfg


def _teacher(preset: str, path: str, out: str, overrides: tuple) -> str:
    """A teacher for distillation preset `preset`: its base preset (the file's `base:`) with twice the student's layers,
    masked LM only, narrowed and trained as the fingerprinted runs are, in `out`."""
    with open(os.path.join(PRESETS_DIR, preset + ".yaml")) as f:
        base = yaml.safe_load(f)["base"].removesuffix(".yaml")
    layers = load(preset).model.num_layers * 2
    cfg = _shortened(load(base, [f"data.path={path}", "model.vocab_size=0", "optimizer.warmup_steps=2",
                                 "data.valid_fraction=0.3", f"model.num_layers={layers}", "model.heads=[mlm]",
                                 "data.objective=mlm", *overrides]))
    from pretrain.train import Trainer
    return Trainer(narrow(cfg, 2, out)).fit()["checkpoint"]


def fingerprint(preset: str, datasets: list[str], overrides: tuple = ()) -> dict:
    """{"weights": sha256 of every final weight, "losses": [the loss of each step]}, or {"not run": why}."""
    from pretrain.train import Trainer

    error = None
    for path in datasets:
        with tempfile.TemporaryDirectory(prefix="ptm-fingerprint-") as out:
            try:
                cfg = _shortened(load(preset, [f"data.path={path}", "model.vocab_size=0", "optimizer.warmup_steps=2",
                                               "data.valid_fraction=0.3", *overrides]))
                if cfg.distill.teacher and not os.path.exists(cfg.distill.teacher):
                    cfg.distill.teacher = _teacher(preset, path, os.path.join(out, "teacher"), overrides)
                kept = cfg.model.attention_dropout, cfg.kernels, cfg.fused_lm_loss, cfg.optimizer.multi_tensor
                cfg = narrow(cfg, 2, out)  # the width; the rest as the preset says:
                cfg.model.attention_dropout, cfg.kernels, cfg.fused_lm_loss, cfg.optimizer.multi_tensor = kept
                summary = Trainer(cfg).fit()
            except (ConfigError, PrepError, C.CheckpointError) as e:
                error = error or str(e).splitlines()[0]
                continue
            with open(os.path.join(out, "metrics.jsonl")) as f:
                losses = [json.loads(line)["loss"] for line in f if '"loss"' in line]
            pieces = C.Pieces(summary["checkpoint"])
            digest = hashlib.sha256()
            for name in sorted(pieces.params):
                digest.update(name.encode())
                digest.update(pieces.full("param", name).contiguous().view(-1).numpy().tobytes())
            return {"weights": digest.hexdigest(), "losses": losses}
    return {"not run": error}


def isolated(preset: str, datasets: list[str], overrides: list[str]) -> dict:
    """`fingerprint` in a process of its own: no state of an earlier preset's run (a ZeRO-3 engine patches torch's
    functions process-wide) reaches the next one."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *datasets, "--one", preset, "--set", *overrides],
                          capture_output=True, text=True)
    if proc.returncode:
        return {"not run": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+", help="ptm datasets, each preset trained on the first it can train on: "
                                            "e.g. DATA, DATA_T5 (`data_prep build --sentinels 100`), WORDS (ELMo's)")
    ap.add_argument("--presets", nargs="*", default=None, help="the presets to run (default: every one)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config keys of every preset")
    ap.add_argument("--out", help="write the fingerprints to this JSON file")
    ap.add_argument("--against", help="compare with fingerprints written before; exit 1 if any differs")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # one preset, its fingerprint printed as JSON (`isolated`)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(fingerprint(args.one, args.data, tuple(args.set))))
        return
    try:
        before = json.load(open(args.against)) if args.against else {}
    except (OSError, ValueError) as e:
        sys.exit(f"preset_fingerprint.py: --against {args.against}: {e}: give a file an earlier --out wrote")
    found, differ = {}, []
    for preset in args.presets or presets():
        found[preset] = isolated(preset, args.data, args.set)
        same = "" if preset not in before else " (same)" if before[preset] == found[preset] else " DIFFERS"
        differ += [preset] if same == " DIFFERS" else []
        shown = found[preset].get("weights", "")[:16] or f"not run: {found[preset]['not run']}"
        print(f"{preset:<22} {shown}{same}", flush=True)
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(found, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    if args.against:
        new = [p for p in found if p not in before]
        print(f"{len(found) - len(differ) - len(new)} of {len(found)} presets as before" +
              (f"; differ: {', '.join(differ)}" if differ else "") + (f"; new: {', '.join(new)}" if new else ""))
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
