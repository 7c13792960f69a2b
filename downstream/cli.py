"""`python -m downstream` (also `ptm eval`, `ptm compare`, `ptm tasks`)."""
from __future__ import annotations

import argparse
import math
import os
import sys

from downstream import TaskError
from ptm.cli import positive, show_defaults, stop_on_sigterm, whole
from ptm.files import refused_write


def _finetune_options(p: argparse.ArgumentParser) -> None:
    from downstream.finetune import Options

    d = Options()
    g = p.add_argument_group("fine-tuning (Cramming's 'sane' spirit: few epochs, one grid for every task)")
    g.add_argument("--epochs", type=whole("a count (1, 2, ...)"), default=d.epochs,
                   help=f"epochs per run (default {d.epochs})")
    g.add_argument("--lrs", type=positive("a learning rate (e.g. 5e-5)"), nargs="+", default=list(d.lrs),
                   help="learning-rate grid shared by every task (default %(default)s)")
    g.add_argument("--task-model-lrs", type=positive("a learning rate (e.g. 1e-3)"), nargs="+",
                   default=list(d.task_model_lrs),
                   help="the grid of a task model trained from scratch over frozen features (ELMo's; default "
                        "%(default)s)")
    g.add_argument("--seeds", type=whole("a seed (0, 1, ...)", 0), nargs="+", default=list(d.seeds),
                   help="seeds per learning rate; the median and spread are reported (default %(default)s)")
    g.add_argument("--batch-size", type=whole("a count (1, 2, ...)"), default=d.batch_size,
                   help="global batch (default %(default)s)")
    g.add_argument("--max-len", type=whole("a length in tokens (8 or more)", 8), default=d.max_len,
                   help="tokens per input; longer texts keep head + tail (default %(default)s)")
    g.add_argument("--max-train", type=whole("a count (0: all)", 0), default=0,
                   help="use at most this many training examples (0: all)")
    g.add_argument("--features", choices=("first", "mean", "whiten"),
                   help="feature-based instead of fine-tuning: the model frozen, a linear layer trained (over the "
                        "--task-model-lrs grid) on a text's vector: its first token (a causal model's last), the "
                        "mean of its tokens, or that mean whitened over the training texts (BERT-whitening); on "
                        "each token's state for tagging and QA. ELMo is always feature-based")


def _options(a):
    from downstream.finetune import Options

    return Options(epochs=a.epochs, lrs=tuple(a.lrs), task_model_lrs=tuple(a.task_model_lrs), seeds=tuple(a.seeds),
                   batch_size=a.batch_size, max_len=a.max_len, max_train=a.max_train,
                   features=a.features or "", progress=getattr(a, "progress", True))


def parser() -> argparse.ArgumentParser:
    prog = "ptm" if sys.argv[0] == "ptm" else "python -m downstream"  # `ptm eval` runs `ptm` + eval ...
    ap = argparse.ArgumentParser(prog=prog,
                                 description="Fine-tune and evaluate what ptm pretrains; compare families at an "
                                             "equal budget.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    e = sub.add_parser("eval", help="fine-tune and score a run, checkpoint or export on tasks",
                       description="Fine-tune MODEL on each --task (the family's transformers head; ELMo under a "
                                   "task model) over a learning-rate grid and seeds; report the median and spread "
                                   "of the best rate. Also: zero-shot cloze (MLM models), perplexity and last-word "
                                   "accuracy (causal models). Writes OUT/results.json, OUT/curves.png and a line "
                                   "per task; a re-run skips tasks already done with the same options.")
    e.add_argument("model", help="a Hugging Face directory ptm exported (any family), a ptm run or checkpoint "
                                 "(exported first), or an ELMo run / bilm-tf directory")
    e.add_argument("--task", dest="tasks", action="append", default=[], metavar="DIR|NAME=DIR",
                   help="a task directory with task.yaml (`ptm tasks` writes the shipped ones), or a known layout "
                        "and its files, e.g. sst2=~/glue/SST-2, conll2003=~/conll, squad=~/squad (repeatable)")
    e.add_argument("--out", help="results directory (default eval/NAME-OF-MODEL; a checkpoint's eval/RUN-step_N; "
                                 "-scratch added with --no-pretraining, -FEATURES with --features)")
    e.add_argument("--no-pretraining", dest="pretrained", action="store_false",
                   help="the same architecture randomly initialised: the baseline that shows what pretraining bought")
    e.add_argument("--cloze", action="store_true",
                   help="also score tasks with a `cloze` pattern zero-shot through the MLM head")
    e.add_argument("--text", metavar="FILE", help="perplexity of a causal model on this file (one document per line, "
                                                  "or JSONL with \"text\")")
    e.add_argument("--last-word", metavar="FILE", help="LAMBADA-style last-word accuracy of a causal model on these "
                                                       "passages (one per line, or JSONL with \"text\")")
    e.add_argument("--save-model", action="store_true",
                   help="save each task's fine-tuned model to OUT/models/TASK (transformers loads it): the best "
                        "seed's at the learning rate reported")
    e.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    _finetune_options(e)
    c = sub.add_parser("compare", help="families pretrained on one dataset at an equal budget, each beside its "
                                       "unpretrained twin",
                       description="Pretrain each preset on DATA for the same budget (training FLOPs by default, "
                                   "tokens, or wall time), fine-tune it and the same architecture without "
                                   "pretraining on the same tasks, and write OUT/compare.md (the table), "
                                   "compare.png (score against FLOPs) and compare.json. Re-running continues an "
                                   "interrupted comparison without retraining finished cells.")
    c.add_argument("presets", nargs="+", metavar="PRESET",
                   help="presets (bert-tiny gpt2 ...), or families with --size (bert roberta --size tiny)")
    c.add_argument("--size", help="the size of each family named without one: FAMILY-SIZE (e.g. tiny, base)")
    c.add_argument("--data", required=True, help="a ptm dataset; T5's sentinels and ELMo's words are derived from it")
    c.add_argument("--task", dest="tasks", action="append", required=True, metavar="DIR|NAME=DIR",
                   help="a task, as for `ptm eval` (repeatable)")
    c.add_argument("--budget", required=True, metavar="KIND=VALUE",
                   help="flops=3e13 (training FLOPs, as `ptm plan` counts them; a bare number means FLOPs), "
                        "tokens=2e6, or time=600 (seconds)")
    c.add_argument("--out", required=True, help="the comparison's directory (re-run it to continue)")
    c.add_argument("--nproc", type=whole("a count (1, 2, ...)"), default=1,
                   help="processes per pretraining run (torchrun; default 1)")
    c.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                   help="config overrides for every preset (e.g. data.seq_len=64)")
    c.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    _finetune_options(c)
    t = sub.add_parser("tasks", help="write the shipped tasks, built from the embedded corpus",
                       description="Write the tasks built from the embedded corpus (labels known by construction): "
                                   "source (classification), next and order (pairs), position (regression), code "
                                   "(CoNLL tagging), follow (SQuAD-style QA), each a directory with task.yaml.")
    t.add_argument("--out", required=True, help="directory for the task directories")
    t.add_argument("--corpus", help="a `data_prep corpus` directory (default: written into OUT/corpus)")
    t.add_argument("--max-train", type=whole("a count (1, 2, ...)"), default=2000,
                   help="training examples per task (default 2000)")
    t.add_argument("--max-dev", type=whole("a count (1, 2, ...)"), default=400,
                   help="dev examples per task (default 400)")
    t.add_argument("--seed", type=int, default=0, help="the draws that build pairs and questions")
    return show_defaults(ap)


def run(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.command == "tasks":
        from downstream import shipped

        counts = shipped.write(a.out, a.corpus, a.seed, a.max_train, a.max_dev)
        for name, (train, dev) in counts.items():
            if name == "text":
                print(f"{a.out}/text: dev.txt ({train} documents, --text), last_word.txt ({dev} passages, --last-word)")
            else:
                print(f"{a.out}/{name}: {train} train, {dev} dev ({shipped.SPECS[name]['kind']})")
        return 0
    if a.command == "compare":
        from downstream import compare as CMP

        kind, _, value = a.budget.rpartition("=")
        kind = kind or "flops"  # a bare number: training FLOPs
        try:
            budget = float(value)
        except ValueError:
            budget = math.nan
        if not 0 < budget < math.inf:
            raise TaskError(f"--budget {a.budget}: write KIND=NUMBER, a finite number above 0, e.g. flops=3e13")
        _quiet()
        result = CMP.compare(_presets(a.presets, a.size), a.data, a.tasks, kind, budget, a.out, _options(a),
                             a.overrides, a.nproc)
        print(CMP.table(result))
        print(f"{a.out}/compare.md, compare.png, compare.json")
        return 0
    if a.command == "eval":
        from downstream import evaluate as E

        if not (a.tasks or a.text or a.last_word):
            raise TaskError("nothing to evaluate: give --task (repeatable), --text or --last-word")
        _quiet()
        opts = _options(a)
        opts.pretrained, opts.save_dir = a.pretrained, "yes" if a.save_model else ""
        out = a.out or default_out(a.model, a.pretrained, a.features)
        results = E.evaluate(a.model, out, a.tasks, opts, a.text, a.last_word, a.cloze)
        if E.FT.world()[0] == 0:
            print("\n".join(E.summary(results)))
            print(f"results: {out}/results.json" + (f", curves: {out}/curves.png" if results["tasks"] else ""))
    return 0


def _presets(names: list[str], size: str | None) -> list[str]:
    """Preset names; a family name with --size becomes FAMILY-SIZE."""
    from pretrain.config import PRESETS_DIR
    from pretrain.yaml_config import did_you_mean

    known = {f.removesuffix(".yaml") for f in os.listdir(PRESETS_DIR) if f.endswith(".yaml")}
    out = []
    for name in names:
        pick = f"{name}-{size}" if size and f"{name}-{size}" in known else name  # (gpt is a preset, gpt-tiny too)
        pick = pick if pick in known or os.path.isfile(pick) or not size else f"{name}-{size}"
        if pick not in known and not os.path.isfile(pick):
            raise TaskError(f"{pick!r} is not a preset{did_you_mean(pick, known)} ({', '.join(sorted(known)[:8])}, "
                            "...) or a YAML file; name a preset, or a family with --size")
        out.append(pick)
    return out


def _quiet() -> None:
    """transformers' load reports (a new head's weights are expected to be missing) only on errors; no bars of its
    own (each load and save of a model would print one)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def default_out(model: str, pretrained: bool, features: str | None) -> str:
    """eval/NAME for a model directory NAME; eval/RUN-step_N for RUN/checkpoints/step_N (two runs' steps apart)."""
    parent, name = os.path.split(os.path.normpath(model))
    if os.path.basename(parent) == "checkpoints":
        name = f"{os.path.basename(os.path.dirname(parent))}-{name}"
    return os.path.join("eval", name + ("" if pretrained else "-scratch") + (f"-{features}" if features else ""))


def stop_alone() -> None:
    """SIGTERM ends a single process as Ctrl-C does (`stop_on_sigterm`); ranks a launcher started keep the default
    (a rank waiting in a collective would act on it only once the collective returned)."""
    from launchers.rendezvous import RendezvousError, detect

    try:
        found = detect()
    except RendezvousError:  # (main says it)
        return
    if found is None or found.world_size == 1:
        stop_on_sigterm()


def main(argv=None) -> None:
    from launchers.rendezvous import RendezvousError
    from pretrain.checkpoint import CheckpointError
    from pretrain.device import memory_ran_out
    from pretrain.yaml_config import ConfigError

    again = "re-run the same command (what finished is kept)"
    try:
        sys.exit(run(argv))
    except (TaskError, CheckpointError, ConfigError, RendezvousError) as e:  # a config's (compare's --set), a launch's
        print(f"downstream: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM (`stop_alone`): a half-written export or model goes
        print(f"downstream: interrupted; {again}", file=sys.stderr)
        sys.exit(getattr(e, "status", 130))
    except Exception as e:
        refused = refused_write(e, "the results (--out)", again)
        if refused:
            print(f"downstream: error: {refused}", file=sys.stderr)
        elif memory_ran_out(e):
            print(f"downstream: error: {memory_ran_out(e)}; lower --batch-size (or --max-len) or free memory, and "
                  f"{again}", file=sys.stderr)
        else:
            raise
        sys.exit(2)
