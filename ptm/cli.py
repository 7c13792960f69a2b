"""The `ptm` command: `ptm prep|train|plan|report|convert|launch ...` (and the families' commands, e.g. `ptm elmo`) runs
`python -m data_prep|pretrain|...`."""
import argparse
import importlib.util
import math
import os
import runpy
import signal
import sys

CORE = {
    "prep": ("data_prep", "raw text to sharded Arrow datasets, tokenizers"),
    "train": ("pretrain train", "pretrain a model of any family (BERT, GPT-2, T5, XLNet, ELMo, ...)"),
    "plan": ("pretrain plan", "before launch: does a config fit, how fast will it train?"),
    "report": ("pretrain report", "a run's curves as a PNG (losses, learning rate, throughput) and its summary"),
    "eval": ("downstream eval", "fine-tune and score a run or export on tasks (GLUE/CLUE TSV, CoNLL, SQuAD); "
                                "zero-shot cloze, perplexity"),
    "compare": ("downstream compare", "families on one corpus at an equal budget, each beside its unpretrained twin"),
    "tasks": ("downstream tasks", "write the downstream tasks built from the embedded corpus"),
}
TOOLS = {
    "convert": ("checkpoints_tools", "consolidate, reshard, Hugging Face export/import and the families' own formats "
                                     "(ELMo's bilm-tf files)"),
    "launch": ("launchers", "one rendezvous contract for every launcher"),
}


def whole(what: str, least: int = 1):
    """An argparse type: a whole number, `least` or more; its error says the value "is not {what}"."""
    def parse(value: str) -> int:
        if not value.strip().isdecimal() or int(value) < least:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return int(value)
    return parse


def positive(what: str):
    """An argparse type: a finite number above 0; its error says the value "is not {what}"."""
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not 0 < number < math.inf:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return number
    return parse


def says_default(action: argparse.Action) -> bool:
    """An option whose default is worth saying in its help: a value (not None, not empty; not a flag's own
    True/False) that the help does not already name."""
    default = action.default
    return bool(action.option_strings and action.nargs != 0 and action.help not in (None, argparse.SUPPRESS)
                and default not in (None, argparse.SUPPRESS) and default not in ("", [], ())
                and "default" not in action.help)


def show_defaults(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`ap` with its default in the help of each option of it and its subcommands that `says_default`, the way the
    options that say theirs by hand do: "(default X)" after the help, or "; default X" in the parentheses that end
    it (`--nproc ... (torchrun; default 1)`); returns it."""
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # (an alias maps to the same parser)
                show_defaults(sub)
        elif says_default(action):
            if action.help.endswith(")"):
                action.help = action.help[:-1] + "; default %(default)s)"
            else:
                action.help += " (default %(default)s)"
    return ap


def commands() -> dict[str, tuple[str, str]]:
    """{name: (module and arguments, help)}: ptm's own, then those the families add (`Family.commands`, run by
    `python -m pretrain NAME`: ELMo's `elmo`)."""
    from pretrain import families

    added = {c.name: (f"pretrain {c.name}", c.help) for f in families.REGISTRY.values() for c in f.commands}
    return {**CORE, **added, **TOOLS}


def usage() -> str:
    lines = ["usage: ptm COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}  (python -m {module})" for name, (module, help_) in commands().items()]
    lines += ["", "`ptm COMMAND --help` explains each command's options; `ptm --version` prints ptm's version."]
    return "\n".join(lines)


def run(main) -> None:
    """A command's `main`, as `python -m PACKAGE` runs it: a reader that stops reading its output (`ptm report RUN |
    head`) ends it quietly with status 141, as SIGPIPE ends a shell tool, not with a BrokenPipeError traceback."""
    try:
        main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush would fail again)
        sys.exit(141)


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, scancel) raised where the process is, as Ctrl-C's KeyboardInterrupt is (`stop_on_sigterm`)."""
    status = 128 + signal.SIGTERM


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread: `finally` blocks remove partial outputs, and a
    command ends in its line for an interruption (with status `Terminated.status`), not killed where it stood."""
    def stop(signum, frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, stop)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0)
    if argv[0] == "--version":
        from ptm import __version__
        print(f"ptm {__version__}")
        sys.exit(0)
    known = commands()
    if argv[0] not in known:
        print(f"ptm: error: unknown command {argv[0]!r}; choose one of {', '.join(known)}", file=sys.stderr)
        sys.exit(2)
    module, *prefix = known[argv[0]][0].split()  # "pretrain plan": `python -m pretrain plan ARGS...`
    if importlib.util.find_spec(f"{module}.__main__") is None:
        sys.exit(f"ptm: `ptm {argv[0]}` ({module}) is not part of this version of ptm yet")
    sys.argv = ["ptm", *prefix, *argv[1:]] if prefix else [f"ptm {argv[0]}", *argv[1:]]
    runpy.run_module(f"{module}.__main__", run_name="__main__")
