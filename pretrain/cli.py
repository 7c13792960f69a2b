"""`python -m pretrain` (also `ptm train`, `ptm plan`): train from a YAML config with dotted overrides, or plan
its memory per GPU before launch."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import sys
import textwrap
import traceback


def parser() -> argparse.ArgumentParser:
    from pretrain import plan
    from pretrain.config import describe
    from pretrain.schema import help_width
    from ptm.cli import show_defaults

    prog = sys.argv[0] if sys.argv[0].split(" ")[0] == "ptm" else "python -m pretrain"
    width = help_width()  # (the key table is preformatted text: argparse does not wrap it)
    ap = argparse.ArgumentParser(prog=prog, description="Pretrain a model of any family of configs/ (BERT, GPT-2, "
                                                        "GPT-3, ERNIE, RoBERTa, ALBERT, ELECTRA, NEZHA, UniLM, "
                                                        "SpanBERT, T5, BART, MASS, XLNet, ELMo, DistilBERT, TinyBERT, "
                                                        "...).")
    ap.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher adds it
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser(
        "train", help="train (or resume) a model from a YAML config",
        description=textwrap.fill("Train from a config; re-running the same command resumes from the latest "
                                  "checkpoint in out_dir. Config keys (set them in the YAML file or with --set "
                                  "KEY=VALUE):", width) + "\n\n" + describe(width),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", required=True,
                   help="YAML file, or a preset name from configs/ (bert-tiny, bert-base, gpt2, ernie-base, ...)")
    t.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                   help="override config keys, e.g. --set train.steps=100 optimizer.name=lamb")
    p = sub.add_parser("plan", help="before launch: memory per GPU (does it fit?) and, with --gpu, predicted speed",
                       description=plan.DESCRIPTION)
    plan.add_arguments(p)
    r = sub.add_parser("report", help="a run's loss, accuracy, learning-rate and throughput curves as a PNG, and its "
                                      "summary",
                       description="Plot RUN_DIR/metrics.jsonl and valid.jsonl (training and validation: the total "
                                   "loss, each loss term and accuracy the objective logs; learning rate, tokens/s, "
                                   "gradient norm; a line at each change of stage) into one PNG; print summary.json "
                                   "and, where the run failed, failed.json.")
    r.add_argument("run_dir", help="a training out_dir")
    r.add_argument("--out", help="PNG to write (default: RUN_DIR/report.png)")
    for command in family_commands().values():  # a family's own (ELMo's `elmo`)
        c = sub.add_parser(command.name, help=command.help, description=command.description)
        for flags, options in command.arguments:
            c.add_argument(*flags, **options)
    return show_defaults(ap)


def family_commands() -> dict:
    """{name: `families.base.Command`} of every registered family's commands."""
    from pretrain import families

    return {c.name: c for f in families.REGISTRY.values() for c in f.commands}


def _lost_contact(e: RuntimeError, dist_error: type) -> bool:
    """A failed collective or rendezvous: a rank died, stalled past parallel.timeout_s, or cannot be reached
    (torch raises DistError; gloo reports timeouts and closed peers as RuntimeErrors of its own)."""
    return isinstance(e, dist_error) or any(k in str(e) for k in ("gloo", "NCCL", "c10d", "Connection closed by peer"))


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    if a.command == "plan":  # before the training imports (torch): a plan takes a fraction of a second
        from pretrain.plan import run

        sys.exit(run(a))
    if a.command == "report":
        from pretrain.report import ReportError, report
        from pretrain.runlog import FAILED

        try:
            print(f"wrote {report(a.run_dir, a.out)}")
        except (FileNotFoundError, ReportError) as e:
            print(f"pretrain: error: {e}", file=sys.stderr)
            sys.exit(2)
        for name in ("summary.json", FAILED):  # (both: a finished run that failed when trained further)
            path = os.path.join(a.run_dir, name)
            if os.path.isfile(path):
                print(open(path).read())
        return
    if a.command in family_commands():
        from pretrain.checkpoint import CheckpointError

        module, function = family_commands()[a.command].run.split(":")
        try:
            print(getattr(importlib.import_module(module), function)(a))
        except CheckpointError as e:
            print("\n".join(f"pretrain: error: {line}" for line in str(e).splitlines()), file=sys.stderr)
            sys.exit(2)
        return
    from pretrain import signals

    signals.watch()  # (`python -m pretrain train` has blocked them at its first line: pretrain/__main__.py)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's retry warnings carry C++ stacks; errors stay
    import torch

    from data_prep import PrepError
    from launchers.rendezvous import RendezvousError
    from launchers.rendezvous import rank as _rank
    from pretrain.checkpoint import CheckpointError
    from pretrain.config import ConfigError, load
    from pretrain.data.loader import worker_death
    from pretrain.device import DeviceError, out_of_memory
    from pretrain import heartbeat, runlog
    from pretrain.runlog import failed
    from pretrain.train import Stopped, train
    from ptm.files import refused_write

    try:
        summary = train(load(a.config, a.overrides))
        signals.ignore()
    except DeviceError as e:  # this rank's own problem: every rank says it, naming itself
        said = f"pretrain: error: rank {_rank()} on {socket.gethostname()}: {e}"
        print(said, file=sys.stderr)
        signals.note_end(2, said)
        failed(said, 2, e)
        sys.exit(2)
    except (ConfigError, CheckpointError, PrepError, RendezvousError) as e:  # the same on every rank: said once
        said = "\n".join(f"pretrain: error: {line}" for line in str(e).splitlines()) if _rank() == 0 else None
        if said:
            print(said, file=sys.stderr)
        signals.note_end(2, said)  # (srun kills the ranks still ending when one exits, and reports that kill: 143)
        failed(said, 2, e)
        sys.exit(2)
    except FloatingPointError as e:
        if _rank() == 0:
            print(said := f"pretrain: error: {e}", file=sys.stderr)
            failed(said, 3, e)
        sys.exit(3)
    except KeyboardInterrupt as e:  # Ctrl-C: the loader's workers have ended (`Trainer.fit`); no traceback, one line
        if _rank() == 0:
            said = "pretrain: interrupted (SIGINT); re-run the same command to resume from the last checkpoint"
            signals.end_line(said, 130)
            failed(said, 130, e)
        else:
            signals.note_end(130)
        sys.exit(130)
    except Stopped as e:  # (rank 0 said why before the ranks' last collective)
        if _rank() == 0:
            failed(e.line, e.code, e)
        signals.ignore()
        signals.pause("exit")  # (tests: a rank slower to end)
        sys.exit(e.code)
    except Exception as e:
        if signals.received:  # a peer or a child that died of the stop signal before it was blocked, or any failure
            signals.ignore()
            line, code = signals.stopped_during(heartbeat.first_line(e))
            if _rank() == 0:  # (the rank that says it notes it: the script says it otherwise)
                signals.end_line(line, code)
                failed(line, code, e)
            sys.exit(code)
        own = (worker_death(e) or out_of_memory(e, signals.trained_steps)  # this rank's problem: it says it
               or refused_write(e, runlog.started or "out_dir", "re-run to resume from the last checkpoint"))
        if own is not None:
            said = f"pretrain: error: rank {_rank()} on {socket.gethostname()}: {own}"
            print(said, file=sys.stderr)
            signals.note_end(2, said)
            failed(said, 2, e)
            sys.exit(2)
        if not isinstance(e, RuntimeError) or not _lost_contact(e, torch.distributed.DistError):
            failed(traceback.format_exception_only(e)[0].splitlines()[0], 1, e)  # (the traceback's last line)
            raise
        said = heartbeat.lost_contact(_rank(), f"{heartbeat.first_line(e)}; the launcher's log names the rank that "
                                               "failed")
        print(said, file=sys.stderr)
        failed(said, heartbeat.LOST_CONTACT, e)
        sys.exit(heartbeat.LOST_CONTACT)
    if _rank() == 0:
        print(json.dumps(summary, indent=2))
