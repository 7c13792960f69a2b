"""`python -m checkpoints_tools` (also `ptm convert`): to-hf, from-hf."""
from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    prog = sys.argv[0] if sys.argv[0].startswith("ptm ") else "python -m checkpoints_tools"
    ap = argparse.ArgumentParser(prog=prog, description="Convert ptm checkpoints to and from Hugging Face format.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser("to-hf", help="ptm checkpoint (or a run's out_dir) -> transformers model directory",
                       description="Write config.json, safetensors weights and the tokenizer, loadable with "
                                   "BertForPreTraining / GPT2LMHeadModel / ErnieForPreTraining and AutoTokenizer.")
    t.add_argument("checkpoint", help="a checkpoint directory, or a training out_dir (its latest checkpoint)")
    t.add_argument("--out", required=True, help="directory to write")
    t.add_argument("--max-shard-size", default="2GB", help="split weights into safetensors shards of this size")
    f = sub.add_parser("from-hf", help="transformers model directory -> ptm checkpoint (to continue pretraining)",
                       description="Import BERT, GPT-2 or ERNIE weights and tokenizer; heads missing from base "
                                   "models (BertModel, GPT2Model, ErnieModel) are initialised and reported.")
    f.add_argument("hf_dir", help="a transformers model directory (config.json, weights, tokenizer files)")
    f.add_argument("--out", required=True, help="checkpoint directory to write")
    return ap


def main(argv=None) -> None:
    from pretrain.checkpoint import CheckpointError

    a = parser().parse_args(argv)
    try:
        if a.command == "to-hf":
            from checkpoints_tools.hf import to_hf

            print(f"wrote {to_hf(a.checkpoint, a.out, a.max_shard_size)}")
        else:
            from checkpoints_tools.hf import from_hf

            out, initialised = from_hf(a.hf_dir, a.out)
            print(f"wrote {out}")
            if initialised:
                print(f"initialised (not in {a.hf_dir}): {', '.join(initialised)}")
    except (CheckpointError, OSError) as e:
        print(f"checkpoints_tools: error: {e}", file=sys.stderr)
        sys.exit(2)
