"""`ptm eval`: one model on several tasks; results as JSON (one file per task as each finishes, so a re-run skips
what is done), a line per task, and the curves as a PNG."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from downstream import TaskError
from downstream import finetune as FT
from downstream import models as M
from downstream import tasks as T
from pretrain import device as dev
from ptm.files import write_json


def _done(path: str, key: dict):
    """A task's saved result when it was computed with the same options (`key`), else None."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        saved = json.load(f)
    return saved if saved.get("key") == key else None


def evaluate(model: str, out: str, task_args: list[str], opts: FT.Options, text: str | None = None,
             last_word: str | None = None, cloze: bool = False) -> dict:
    """Fine-tune and score `model` on each task (and the zero-shot scores asked for); returns the results, written
    to OUT/results.json with OUT/curves.png."""
    from downstream import zero_shot as Z

    if os.path.exists(out) and not os.path.isdir(out):
        raise TaskError(f"--out {out} is a file; pass a directory for the results")
    tasks = T.load_all(task_args)  # bad task files fail before any work
    for path in (text, last_word):
        if path:
            Z.read_texts(path)
    if cloze and not any(t.cloze for t in tasks) and FT.world()[0] == 0:
        print("downstream: note: --cloze scores nothing: no --task has a cloze pattern (task.yaml `cloze:`, as the "
              "shipped `source` has)", file=sys.stderr)
    rank = FT.world()[0]

    def resolved():
        try:
            return M.resolve(model, out), None
        except TaskError as e:  # every rank stops with it (none waits in the broadcast)
            return None, str(e)

    source, error = dev.rank0s(resolved)
    if error:
        raise TaskError(error)
    Z.check(source, causal=bool(text or last_word), cloze=cloze and any(t.cloze for t in tasks))
    os.makedirs(os.path.join(out, "tasks"), exist_ok=True)
    options = {k: v for k, v in dataclasses.asdict(opts).items() if k not in ("progress", "save_dir")}
    results = {"model": os.path.abspath(model), "family": source.family, "pretrained": opts.pretrained,
               "options": options, "tasks": {}, "zero_shot": {}}
    for task in tasks:
        path = os.path.join(out, "tasks", f"{task.name}.json")
        key = json.loads(json.dumps({"task": task.name, "data": T.digest(task), "options": options,
                                     "model": results["model"], "weights": _weights_of(source)}))
        models = os.path.join(out, "models", task.name)
        unsaved = opts.save_dir and not source.elmo and not os.path.isfile(os.path.join(models, "config.json"))
        saved = dev.rank0s(lambda: None if unsaved else _done(path, key))  # (ranks: rank 0's reading)
        if saved is not None and rank == 0:
            print(f"downstream: {task.name}: the result in {path} (same model, weights, options and examples; delete "
                  "it to run again)", file=sys.stderr)
        if saved is None:
            run_opts = dataclasses.replace(opts, save_dir=models if opts.save_dir else "")
            saved = {"key": key, "result": FT.finetune(source, task, run_opts)}
            if rank == 0:
                write_json(path, saved)
        results["tasks"][task.name] = saved["result"]
        if cloze and task.cloze and rank == 0:
            results["zero_shot"][f"{task.name} (cloze)"] = Z.cloze(source, task, opts.max_len)
    if rank == 0:
        if text:
            results["zero_shot"]["perplexity"] = {**Z.perplexity(source, text), "file": os.path.abspath(text)}
        if last_word:
            results["zero_shot"]["last word"] = {**Z.last_word(source, last_word), "file": os.path.abspath(last_word)}
        write_json(os.path.join(out, "results.json"), results)
        if results["tasks"]:
            plot(results, os.path.join(out, "curves.png"))
    return results


def _weights_of(source: M.Source) -> str:
    """What identifies the weights evaluated: the checkpoint an export was made from, else the directory (a run
    trained further is evaluated again)."""
    stamp = os.path.join(source.hf_dir, "ptm_source.json") if source.hf_dir else ""
    if stamp and os.path.isfile(stamp):
        with open(stamp) as f:
            return json.load(f)["checkpoint"]
    return os.path.abspath(source.elmo or source.hf_dir)


def summary(results: dict) -> list[str]:
    """One line per task and zero-shot score."""
    name = os.path.basename(results["model"].rstrip("/"))
    kind = "" if results["pretrained"] else " (not pretrained)"
    lines = []
    for task, r in results["tasks"].items():
        left_out = r.get("skipped") or {}  # (an earlier result's count: a number)
        left_out = left_out.get("dev") if isinstance(left_out, dict) else None
        lines.append(f"{name}{kind} {task}: {r['metric']} {r['median']:.4f} (median of {r['seeds']} seeds, "
                     f"{r['min']:.4f}..{r['max']:.4f}; lr {r['lr']:g}; {r['head']}"
                     + (f"; {left_out} dev questions without an answer left out)" if left_out else ")"))
    for what, r in results["zero_shot"].items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in r.items() if isinstance(v, float))
        lines.append(f"{name} {what}: {shown}")
    return lines


def plot(results: dict, out: str) -> str:
    """Each task's training loss (every run) and dev score after each epoch (median over seeds, per rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["tasks"])
    fig, axes = plt.subplots(2, len(names), figsize=(4 * len(names), 6), squeeze=False, constrained_layout=True)
    for col, task in enumerate(names):
        r = results["tasks"][task]
        for lr, g in r["grid"].items():
            for run in g["runs"]:
                steps, losses = zip(*run["curve"]["loss"])
                axes[0, col].plot(steps, losses, linewidth=0.7, alpha=0.6, label=f"lr {lr} seed {run['seed']}")
            epochs = [e for e, _ in g["runs"][0]["curve"]["dev"]]
            import statistics

            med = [statistics.median(run["curve"]["dev"][i][1][r["metric"]] for run in g["runs"])
                   for i in range(len(epochs))]
            axes[1, col].plot(epochs, med, marker="o", label=f"lr {lr}")
        axes[0, col].set_title(f"{task}: training loss")
        axes[0, col].set_xlabel("step")
        axes[1, col].set_title(f"{task}: dev {r['metric']} (median)")
        axes[1, col].set_xlabel("epoch")
        axes[1, col].legend(fontsize=7)
    fig.suptitle(os.path.basename(results["model"].rstrip("/")))
    tmp = f"{out}.tmp{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=90)
    except OSError as e:  # (a refused write: PIL's error names no file)
        raise OSError(e.errno, e.strerror, e.filename or out) from e
    finally:
        plt.close(fig)
    os.replace(tmp, out)
    return out
