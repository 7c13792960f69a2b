"""`python -m checkpoints_tools` (also `ptm convert`): consolidate, reshard, rollback, to-hf, from-hf, and to-NAME /
from-NAME for each family's own formats (`Family.formats`: ELMo's to-elmo, from-elmo); the families named in --help
are the registry's (pretrain/families/)."""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from ptm.cli import show_defaults, whole
from ptm.files import refused_write


def _shard_size(value: str) -> str | int:
    """A size as transformers' save_pretrained reads it (bytes, or a number and KB/MB/GB/TB), checked up front."""
    if not re.fullmatch(r"\s*(\d+|\d+(\.\d+)?\s*[KMGT]B)\s*", value, re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"{value!r} is not a size such as 2GB, 500MB or 1000000 (bytes)")
    return int(value) if value.strip().isdigit() else value.strip()


def hf_families() -> dict[str, object]:
    """{display name (its help's head, e.g. "GPT-2"): adapter} of every registered family with a Hugging Face class."""
    from pretrain import families

    return {f.help.split(":")[0]: f.adapter for f in families.REGISTRY.values() if f.adapter is not None}


def other_formats() -> dict[str, tuple[str, object]]:
    """{format name: (display name of its family, its `Format`)} of every registered family's other formats."""
    from pretrain import families

    return {fmt.name: (f.help.split(":")[0], fmt) for f in families.REGISTRY.values() for fmt in f.formats}


NEW = "new or empty"
OUT_HELP = {"consolidate": NEW, "reshard": NEW, "from-hf": NEW,
            "to-hf": "new or empty, or an earlier export, which the new one replaces whole"}


def parser() -> argparse.ArgumentParser:
    from pretrain import families

    prog = sys.argv[0] if sys.argv[0].startswith("ptm ") else "python -m checkpoints_tools"
    exported, formats = hf_families(), other_formats()
    ap = argparse.ArgumentParser(prog=prog, description="Consolidate and reshard ptm checkpoints of any layout, roll a "
                                                        "run back to an earlier checkpoint; "
                                                        "convert them to and from Hugging Face format "
                                                        f"({', '.join(exported)})" + "".join(
                                                            f" and {family}'s {fmt.files} (to-{name}, from-{name})"
                                                            for name, (family, fmt) in formats.items()) + ".")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("consolidate", help="any TP x DP x ZeRO checkpoint -> one full fp32 state (tp=1)",
                       description="Join every ZeRO partition and TP shard into whole fp32 tensors (weights and, "
                                   "unless --weights-only, the optimizer moments), in one process, reading the "
                                   "shards memory-mapped. The result is a ptm checkpoint: train can resume from it "
                                   "with any layout, and shards/param-tp00-dp000.safetensors is a plain state dict.")
    r = sub.add_parser("reshard", help="any checkpoint -> the same with another tensor-parallel size",
                       description="Rewrite a checkpoint as --tp tensor-parallel shards (no ZeRO partitioning); "
                                   "training resumes from any layout anyway, this is for tools that expect one.")
    for p in (c, r):
        p.add_argument("checkpoint", help="a checkpoint directory, or a training out_dir (its latest checkpoint)")
        p.add_argument("--out", required=True, help=f"directory to write ({OUT_HELP['reshard']})")
        p.add_argument("--weights-only", action="store_true", help="leave out the optimizer moments and trainer state")
    r.add_argument("--tp", type=whole("a tensor-parallel size (1, 2, 4, ...)"), required=True,
                   help="tensor-parallel size of the output (1, 2, ...)")
    t = sub.add_parser("to-hf", help="ptm checkpoint (or a run's out_dir) -> transformers model directory",
                       description="Write config.json, safetensors weights and the tokenizer, loadable with the "
                                   "family's transformers class and AutoTokenizer: "
                                   + ", ".join(f"{name} ({a.hf_class})" for name, a in exported.items()) + "."
                                   + "".join(f" {f.help.split(':')[0]} has no transformers class: {f.export}."
                                             for f in families.REGISTRY.values() if f.adapter is None))
    t.add_argument("checkpoint", help="a checkpoint directory, or a training out_dir (its latest checkpoint)")
    t.add_argument("--out", required=True, help=f"directory to write ({OUT_HELP['to-hf']})")
    t.add_argument("--max-shard-size", default="2GB", type=_shard_size,
                   help="split weights into safetensors shards of this size (bytes, or KB/MB/GB/TB: powers of 1000)")
    f = sub.add_parser("from-hf", help="transformers model directory -> ptm checkpoint (to continue pretraining)",
                       description="Import the weights and tokenizer of a transformers model whose config.json "
                                   "model_type is " + " | ".join(a.model_type for a in exported.values())
                                   + "; heads missing from base models (e.g. BertModel) are initialised and reported.")
    f.add_argument("hf_dir", help="a transformers model directory (config.json, weights, tokenizer files)")
    f.add_argument("--out", required=True, help=f"checkpoint directory to write ({OUT_HELP['from-hf']})")
    for name, (family, fmt) in formats.items():  # a family's own formats (its `Family.formats`)
        e = sub.add_parser(f"to-{name}", help=f"{family} checkpoint -> {fmt.files}", description=fmt.writes)
        e.add_argument("checkpoint", help="a checkpoint directory, or a training out_dir (its latest checkpoint)")
        e.add_argument("--out", required=True, help="directory to write")
        i = sub.add_parser(f"from-{name}", help=f"{fmt.files} -> ptm checkpoint", description=fmt.reads)
        i.add_argument("source", help=fmt.source)
        i.add_argument("--out", required=True, help="checkpoint directory to write")
    b = sub.add_parser("rollback", help="make a run resume from an earlier checkpoint of its own (a loss spike)",
                       description="Point OUT_DIR's `latest` at its checkpoint of --step, so that the same training "
                                   "command resumes there (add train.skip_steps to leave a spike's batches out). "
                                   "Nothing is deleted: the later checkpoints, the logs' rows past that step and the "
                                   "run's summary.json / failed.json move to OUT_DIR/checkpoints/rolled-back-after-"
                                   "step_N. Run it while the run is stopped.")
    b.add_argument("out_dir", help="the out_dir of a training run")
    b.add_argument("--step", type=whole("a step of the run's checkpoints (1, 2, ...)"), required=True,
                   help="the step of the checkpoint to resume from (one of OUT_DIR/checkpoints/step_N)")
    return show_defaults(ap)


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    from pretrain.checkpoint import CheckpointError  # torch: after --help
    from pretrain.device import memory_ran_out

    try:
        if a.command == "rollback":
            return _rollback(a.out_dir, a.step)
        if os.path.exists(a.out) and not os.path.isdir(a.out):
            raise CheckpointError(f"--out {a.out} is a file; pass a directory to write "
                                  f"({OUT_HELP.get(a.command, NEW)})")
        if a.command in ("consolidate", "reshard"):
            from checkpoints_tools.reshard import reshard

            print(f"wrote {reshard(a.checkpoint, a.out, getattr(a, 'tp', 1), a.weights_only)}")
        elif a.command == "to-hf":
            from checkpoints_tools.hf import to_hf

            print(f"wrote {to_hf(a.checkpoint, a.out, a.max_shard_size)}")
        elif a.command.startswith("to-"):  # a family's own format
            name = a.command.removeprefix("to-")
            export = getattr(importlib.import_module(other_formats()[name][1].module), f"to_{name}")
            print(f"wrote {export(a.checkpoint, a.out)}")
        else:  # from-hf, or from a family's own format
            if a.command == "from-hf":
                from checkpoints_tools.hf import from_hf as read
                source = a.hf_dir
            else:
                name = a.command.removeprefix("from-")
                read = getattr(importlib.import_module(other_formats()[name][1].module), f"from_{name}")
                source = a.source
            out, initialised = read(source, a.out)
            print(f"wrote {out}")
            if initialised:
                print(f"initialised (not in {source}): {', '.join(initialised)}")
    except (CheckpointError, OSError) as e:
        said = refused_write(e, getattr(a, "out", None) or a.out_dir, "re-run the same command") or str(e)
        print("\n".join(f"checkpoints_tools: error: {line}" for line in said.splitlines()), file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: what was written goes (OUT.tmp), an earlier OUT stays
        print(f"checkpoints_tools: interrupted; nothing was written to {a.out}: re-run the same command"
              if a.command != "rollback" else "checkpoints_tools: interrupted; re-run the same command to finish the "
              "rollback", file=sys.stderr)
        sys.exit(getattr(e, "status", 130))
    except Exception as e:
        if memory_ran_out(e) is None:
            raise
        print(f"checkpoints_tools: error: {memory_ran_out(e)}; nothing was written to {a.out}: run it where more "
              "memory is free", file=sys.stderr)
        sys.exit(2)


def _rollback(out_dir: str, step: int) -> None:
    from checkpoints_tools.rollback import rollback

    done = rollback(out_dir, step)
    if done is None:
        print(f"step_{step:08d} is already the checkpoint {out_dir} resumes, and none is later: nothing to roll back")
        return
    aside, later, rows = done
    moved = [", ".join(later) or "no checkpoint", ", ".join(f"{n} row{'s' * (n != 1)} of {log}"
                                                          for log, n in rows.items() if n) or "no log rows"]
    print(f"{out_dir} resumes from step {step} now; moved to {aside}: {'; '.join(moved)}. Re-run its training "
          "command to resume, with train.skip_steps=[[FIRST,LAST]] added to leave the batches of those steps out")
