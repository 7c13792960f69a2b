"""The `ptm` command: `ptm prep|train|plan|report|elmo|convert|launch ...` runs `python -m data_prep|pretrain|...`."""
import importlib.util
import runpy
import sys

COMMANDS = {
    "prep": ("data_prep", "raw text to sharded Arrow datasets, tokenizers"),
    "train": ("pretrain train", "pretrain a model of any family (BERT, GPT-2, T5, XLNet, ELMo, ...)"),
    "plan": ("pretrain plan", "before launch: does a config fit, how fast will it train?"),
    "report": ("pretrain report", "a run's curves as a PNG (loss, learning rate, throughput) and its summary"),
    "elmo": ("pretrain elmo", "ELMo representations of text from a trained ELMo (a scalar mix of its layers)"),
    "convert": ("checkpoints_tools", "consolidate, reshard, Hugging Face and ELMo export/import"),
    "launch": ("launchers", "one rendezvous contract for every launcher"),
}


def usage() -> str:
    lines = ["usage: ptm COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}  (python -m {module})" for name, (module, help_) in COMMANDS.items()]
    lines += ["", "`ptm COMMAND --help` explains each command's options."]
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0)
    if argv[0] == "--version":
        from ptm import __version__
        print(f"ptm {__version__}")
        sys.exit(0)
    if argv[0] not in COMMANDS:
        sys.exit(f"ptm: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}")
    module, *prefix = COMMANDS[argv[0]][0].split()  # "pretrain plan": `python -m pretrain plan ARGS...`
    if importlib.util.find_spec(f"{module}.__main__") is None:
        sys.exit(f"ptm: `ptm {argv[0]}` ({module}) is not part of this version of ptm yet")
    sys.argv = ["ptm", *prefix, *argv[1:]] if prefix else [f"ptm {argv[0]}", *argv[1:]]
    runpy.run_module(f"{module}.__main__", run_name="__main__")
