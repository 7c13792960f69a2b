"""`ptm compare`: families pretrained on one dataset at an equal budget, each fine-tuned on the same tasks beside
the same architecture without pretraining.

The budget is training FLOPs (`ptm plan`'s model FLOPs per sequence x global batch x steps; the default), tokens
seen, or wall time (steps from the tokens/s of a short calibration run in the same layout). Each preset trains with
its own defaults except the steps the budget gives (warm-up kept under a tenth of them), on the dataset its
objective reads: the given one with T5's sentinels added where it lacks them (`data_prep sentinels`: every token
family reads the same tokens), its words for ELMo (`data_prep words`).

Every cell is a run with its own directory, so an interrupted comparison continues where it stopped: a finished
pretraining or evaluation is read back, an unfinished pretraining resumes from its last checkpoint (re-running
`pretrain train` on its out_dir), an evaluation skips the tasks it finished. The same OUT with another budget or
--set is refused (a cell's pretraining is of one plan).

    OUT/data/               the datasets derived from DATA
    OUT/PRESET/run/         its pretraining run (ptm's out_dir); OUT/PRESET/plan.json its plan, pretrain.json when done
    OUT/PRESET/eval/        `ptm eval` of the run; OUT/PRESET/scratch/ of the same architecture, not pretrained
    OUT/compare.json, compare.md, compare.png
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

from downstream import TaskError
from downstream import evaluate as E
from downstream import finetune as FT
from ptm.files import write_json, write_text

BUDGETS = ("flops", "tokens", "time")


def datasets(data: str, out: str, presets: list[str], overrides: list[str]) -> dict[str, str]:
    """{"tokens": a dataset with sentinels when a preset needs them, "words": its words when one reads words}."""
    from data_prep.dataset import Corpus
    from pretrain import objectives
    from pretrain.config import load

    kinds = [objectives.get(load(p, [f"data.path={data}", *overrides]).data.objective) for p in presets]
    found = {"tokens": data}
    if any(o.sentinels for o in kinds) and not Corpus(data).sentinel_ids:
        from data_prep.sentinels import add_sentinels

        found["tokens"] = os.path.join(out, "data", "tokens")
        if not os.path.isfile(os.path.join(found["tokens"], "manifest.json")):
            os.makedirs(os.path.dirname(found["tokens"]), exist_ok=True)
            add_sentinels(data, found["tokens"])
    if any(o.reads == "words" for o in kinds):
        from data_prep.words import build_words

        found["words"] = os.path.join(out, "data", "words")
        if not os.path.isfile(os.path.join(found["words"], "manifest.json")):
            build_words(found["tokens"], found["words"], progress=False)
    return found


def plan_cell(preset: str, data: dict[str, str], out: str, kind: str, budget: float, overrides: list[str],
              launcher: list[str]) -> dict:
    """The run of one preset under the budget: its overrides and what it costs."""
    from pretrain import cost, objectives
    from pretrain.config import load

    probe = load(preset, [f"data.path={data['tokens']}", *overrides])
    path = data[objectives.get(probe.data.objective).reads]
    run_dir = os.path.join(out, preset, "run")
    base = [f"data.path={path}", f"out_dir={run_dir}", *overrides]
    cfg = _costed(preset, base)
    if cfg.train.batch_rampup:  # (its steps read fewer samples than the budget's price of a step)
        raise TaskError(f"{preset}: train.batch_rampup varies the samples of a step, and the budget prices steps of "
                        "train.global_batch_size; leave it out of compare's --set")
    per_step = cfg.train.global_batch_size
    if kind == "flops":
        steps = budget / (cost.flops_per_sample(cfg) * per_step)
    elif kind == "tokens":
        steps = budget / (cfg.data.seq_len * per_step)
    else:
        steps = budget * calibrate(preset, base, os.path.join(out, preset, "calibrate"), launcher) / (
            cfg.data.seq_len * per_step)
    steps = int(steps)
    if steps < 2:
        raise TaskError(f"--budget {kind}={budget:g} buys {preset} {steps} steps of {per_step} sequences; raise the "
                        "budget or lower train.global_batch_size with --set")
    warmup = min(cfg.optimizer.warmup_steps, max(steps // 10, 1))
    sets = base + [f"train.steps={steps}", f"optimizer.warmup_steps={warmup}", f"train.eval_interval={steps}",
                   f"checkpoint.interval={max(steps // 4, 1)}"]
    cfg = _costed(preset, sets)
    return {"preset": preset, "family": cfg.model.arch, "objective": cfg.data.objective, "steps": steps,
            "parameters": cost.count_parameters(cfg.model), "flops_per_step": cost.flops_per_sample(cfg) * per_step,
            "tokens_per_step": cfg.data.seq_len * per_step, "sets": sets, "run": run_dir}


def _costed(preset: str, sets: list[str]):
    """The config as `ptm plan` costs it: model.vocab_size 0 takes the dataset's (its LM head's FLOPs)."""
    from pretrain.config import load
    from pretrain.plan import resolve_vocab

    cfg = load(preset, sets)
    resolve_vocab(cfg, None)
    return cfg


def calibrate(preset: str, sets: list[str], out: str, launcher: list[str]) -> float:
    """Tokens per second of `preset` over a short run in the same layout (read back when done before)."""
    done = os.path.join(out, "summary.json")
    if not os.path.isfile(done):
        _train(preset, sets + [f"out_dir={out}", "train.steps=8", "optimizer.warmup_steps=1", "train.eval_interval=0",
                               "checkpoint.interval=0"], launcher, out)
    with open(done) as f:
        return float(json.load(f)["tokens_per_s"])


def _ends_with_parent():
    """What a pretraining's process runs before it starts (preexec_fn): SIGTERM when `ptm compare` dies (Linux's
    PR_SET_PDEATHSIG; torchrun passes it on to its workers), so a compare killed outright leaves no trainer writing its
    cell. The function is looked up here, in the parent: the child, forked from a process with threads, only calls."""
    import ctypes
    import signal

    try:
        prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()
    except (OSError, AttributeError):  # not Linux: the trainer outlives a killed compare
        return None

    def in_child() -> None:
        prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before: no signal will come
            os._exit(1)
    return in_child


def _train(preset: str, sets: list[str], launcher: list[str], out: str) -> None:
    """`pretrain train` of `preset` under the launcher (re-running it resumes its out_dir), in a session of its own
    (a terminal's Ctrl-C reaches the compare alone). Stopped (Ctrl-C, SIGTERM: `stop_alone`), the compare sends the
    pretraining SIGTERM and waits while it checkpoints where it is and ends (a second Ctrl-C ends it at once)."""
    import signal

    os.makedirs(out, exist_ok=True)
    cmd = [*launcher, "-m", "pretrain", "train", "--config", preset, "--set", *sets]
    with open(os.path.join(out, "train.log"), "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_ends_with_parent(),
                                start_new_session=True)
        try:
            code = proc.wait()
        except BaseException:
            try:
                print(f"downstream: stopping: the pretraining of {preset} checkpoints where it is (Ctrl-C again ends "
                      f"it at once)", file=sys.stderr)
                proc.send_signal(signal.SIGTERM)
                proc.wait()
            finally:
                proc.kill()  # (nothing, if it has ended)
                proc.wait()
            raise
    if code:
        raise TaskError(f"pretraining {preset} failed (exit {code}); see {out}/train.log")


def pretrain(cell: dict, launcher: list[str]) -> dict:
    """The cell's pretraining: read back if done, else trained (resuming its checkpoints). A cell's directory
    that holds a pretraining of another plan (another budget or --set) is refused, not continued under this one."""
    here = os.path.dirname(cell["run"])
    done, planned = os.path.join(here, "pretrain.json"), os.path.join(here, "plan.json")
    for path in (done, planned):
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
            if saved["sets"] != cell["sets"]:
                was = dict(s.split("=", 1) for s in saved["sets"])
                now = dict(s.split("=", 1) for s in cell["sets"])
                changed = "; ".join(f"{k} {was.get(k)} -> {now.get(k)}" for k in {**was, **now}
                                    if was.get(k) != now.get(k))
                raise TaskError(f"{here} holds {cell['preset']}'s pretraining of another budget or --set ({changed}); "
                                f"choose another --out, or remove {here} to pretrain it again")
            if path == done:
                return saved
    os.makedirs(here, exist_ok=True)
    write_json(planned, {"sets": cell["sets"]})
    t0 = time.time()
    _train(cell["preset"], cell["sets"], launcher, cell["run"])
    with open(os.path.join(cell["run"], "summary.json")) as f:
        summary = json.load(f)
    result = {**cell, "seconds": round(time.time() - t0, 1), "train_seconds": summary.get("seconds"),
              "valid": {k: v for k, v in summary.items() if k.startswith("valid_")}}
    write_json(done, result)
    return result


def compare(presets: list[str], data: str, task_args: list[str], kind: str, budget: float, out: str,
            opts: FT.Options, overrides: list[str] = (), nproc: int = 1) -> dict:
    """Pretrain each preset at the budget, evaluate it and its unpretrained twin; returns and writes the table."""
    from downstream import tasks as T

    if kind not in BUDGETS:
        raise TaskError(f"--budget {kind}=...: choose {' | '.join(BUDGETS)}")
    T.load_all(task_args)  # bad task files fail before any training
    if not os.path.isfile(os.path.join(data, "manifest.json")):  # (nor is OUT made)
        raise TaskError(f"--data {data}: not a ptm dataset (no manifest.json); build one with `ptm prep build`")
    if os.path.exists(out) and not os.path.isdir(out):
        raise TaskError(f"--out {out} is a file; pass a directory for the comparison")
    os.makedirs(out, exist_ok=True)
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     f"--nproc_per_node={nproc}"]
    data_sets = datasets(data, out, presets, list(overrides))
    rows = []
    for preset in presets:
        cell = plan_cell(preset, data_sets, out, kind, budget, list(overrides), launcher)
        trained = pretrain(cell, launcher)
        scores, model = {}, cell["run"]
        for pretrained in (True, False):
            where = os.path.join(out, preset, "eval" if pretrained else "scratch")
            run_opts = dataclasses.replace(opts, pretrained=pretrained)
            scores["pretrained" if pretrained else "scratch"] = E.evaluate(model, where, task_args, run_opts)
            exported = os.path.join(where, "export")
            model = exported if os.path.isdir(exported) else model  # the twin reads the same export's architecture
        rows.append({**trained, "eval": {k: {t: _brief(r) for t, r in v["tasks"].items()} for k, v in scores.items()}})
    result = {"budget": {kind: budget}, "data": os.path.abspath(data), "tasks": task_args, "rows": rows}
    write_json(os.path.join(out, "compare.json"), result)
    write_text(os.path.join(out, "compare.md"), table(result) + "\n")
    plot(result, os.path.join(out, "compare.png"))
    return result


def _brief(r: dict) -> dict:
    return {k: r[k] for k in ("metric", "median", "min", "max", "std", "lr", "seeds", "head")}


def table(result: dict) -> str:
    """One Markdown row per preset: cost, pretraining, and each task's median (min..max) pretrained | scratch."""
    tasks = list(result["rows"][0]["eval"]["pretrained"]) if result["rows"] else []
    metric = {t: result["rows"][0]["eval"]["pretrained"][t]["metric"] for t in tasks}
    head = ["preset", "params", "train FLOPs", "steps", "pretrain s", "held-out loss"] + \
        [f"{t} ({metric[t]}): pretrained / none" for t in tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        cells = [r["preset"], f"{r['parameters'] / 1e6:.2f}M", f"{r['flops_per_step'] * r['steps']:.2e}",
                 str(r["steps"]), f"{r['train_seconds'] or r['seconds']:.0f}",
                 f"{r['valid'].get('valid_loss', float('nan')):.3f}"]
        for t in tasks:
            p, s = r["eval"]["pretrained"][t], r["eval"]["scratch"][t]
            cells.append(f"{p['median']:.3f} ({p['min']:.2f}..{p['max']:.2f}) / {s['median']:.3f} "
                         f"({s['min']:.2f}..{s['max']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: dict, out: str) -> str:
    """Each task's median score against training FLOPs: filled, pretrained; hollow, the same model without."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    tasks = list(rows[0]["eval"]["pretrained"]) if rows else []
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(4.5 * max(len(tasks), 1), 4), squeeze=False,
                             constrained_layout=True)
    for ax, t in zip(axes[0], tasks):
        for i, r in enumerate(rows):
            x = r["flops_per_step"] * r["steps"]
            p, s = r["eval"]["pretrained"][t], r["eval"]["scratch"][t]
            color = f"C{i % 10}"
            ax.errorbar([x], [p["median"]], yerr=[[p["median"] - p["min"]], [p["max"] - p["median"]]], fmt="o",
                        color=color, label=r["preset"])
            ax.plot([x], [s["median"]], "o", mfc="none", color=color)
            ax.plot([x, x], [s["median"], p["median"]], color=color, linewidth=0.7)
            ax.annotate(r["preset"], (x, p["median"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
        spread = [r["flops_per_step"] * r["steps"] for r in rows]
        if max(spread) >= 10 * min(spread):  # budgets that differ (else a linear axis keeps its ticks readable)
            ax.set_xscale("log")
        ax.set_xlabel("training FLOPs")
        ax.set_title(f"{t}: {rows[0]['eval']['pretrained'][t]['metric']} (hollow: not pretrained)")
        ax.legend(fontsize=7)
    tmp = f"{out}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, out)
    return out
