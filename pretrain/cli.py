"""`python -m pretrain` (also `ptm train`, `ptm plan`): train from a YAML config with dotted overrides, or plan
its memory per GPU before launch."""
from __future__ import annotations

import argparse
import json
import os
import sys


def parser() -> argparse.ArgumentParser:
    from pretrain import plan
    from pretrain.config import describe

    prog = sys.argv[0] if sys.argv[0].split(" ")[0] == "ptm" else "python -m pretrain"
    ap = argparse.ArgumentParser(prog=prog, description="Pretrain BERT, GPT-2 and ERNIE models.")
    ap.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher adds it
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser(
        "train", help="train (or resume) a model from a YAML config",
        description="Train from a config; re-running the same command resumes from the latest checkpoint in "
                    "out_dir. Config keys (set them in the YAML file or with --set KEY=VALUE):\n\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", required=True,
                   help="YAML file, or a preset name from configs/ (bert-tiny, bert-base, gpt2, ernie-base, ...)")
    t.add_argument("--set", dest="overrides", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                   help="override config keys, e.g. --set train.steps=100 optimizer.name=lamb")
    p = sub.add_parser("plan", help="memory per GPU before launch: does a config fit, largest micro batch",
                       description=plan.DESCRIPTION)
    plan.add_arguments(p)
    return ap


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    if a.command == "plan":  # before the training imports (torch): a plan takes a fraction of a second
        from pretrain.plan import run

        sys.exit(run(a))
    from data_prep import PrepError
    from launchers.rendezvous import RendezvousError
    from pretrain.checkpoint import CheckpointError
    from pretrain.config import ConfigError, load
    from pretrain.device import DeviceError

    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", 0))))
    try:
        cfg = load(a.config, a.overrides)
        from pretrain.train import train

        summary = train(cfg)
    except DeviceError as e:  # this rank's own problem: every rank says it, naming itself
        import socket

        print(f"pretrain: error: rank {rank} on {socket.gethostname()}: {e}", file=sys.stderr)
        sys.exit(2)
    except (ConfigError, CheckpointError, PrepError, RendezvousError) as e:  # the same on every rank: said once
        if rank == 0:
            print("\n".join(f"pretrain: error: {line}" for line in str(e).splitlines()), file=sys.stderr)
        sys.exit(2)
    except FloatingPointError as e:
        if rank == 0:
            print(f"pretrain: error: {e}", file=sys.stderr)
        sys.exit(3)
    if rank == 0:
        print(json.dumps(summary, indent=2))
