"""`python -m checkpoints_tools` (also `ptm convert`): consolidate, reshard, to-hf, from-hf, to-elmo, from-elmo; the
families named in --help are the registry's (pretrain/families/)."""
from __future__ import annotations

import argparse
import os
import sys


def hf_families() -> dict[str, object]:
    """{display name (its help's head, e.g. "GPT-2"): adapter} of every registered family with a Hugging Face class."""
    from pretrain import families

    return {f.help.split(":")[0]: f.adapter for f in families.REGISTRY.values() if f.adapter is not None}


def parser() -> argparse.ArgumentParser:
    prog = sys.argv[0] if sys.argv[0].startswith("ptm ") else "python -m checkpoints_tools"
    exported = hf_families()
    ap = argparse.ArgumentParser(prog=prog, description="Consolidate and reshard ptm checkpoints of any layout; "
                                                        "convert them to and from Hugging Face format "
                                                        f"({', '.join(exported)}) and ELMo's bilm-tf files (to-elmo, "
                                                        "from-elmo).")
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
        p.add_argument("--out", required=True, help="directory to write (must not hold a checkpoint)")
        p.add_argument("--weights-only", action="store_true", help="leave out the optimizer moments and trainer state")
    r.add_argument("--tp", type=int, required=True, help="tensor-parallel size of the output")
    t = sub.add_parser("to-hf", help="ptm checkpoint (or a run's out_dir) -> transformers model directory",
                       description="Write config.json, safetensors weights and the tokenizer, loadable with the "
                                   "family's transformers class and AutoTokenizer: "
                                   + ", ".join(f"{name} ({a.hf_class})" for name, a in exported.items())
                                   + ". ELMo has no transformers class: use to-elmo.")
    t.add_argument("checkpoint", help="a checkpoint directory, or a training out_dir (its latest checkpoint)")
    t.add_argument("--out", required=True, help="directory to write")
    t.add_argument("--max-shard-size", default="2GB", help="split weights into safetensors shards of this size")
    f = sub.add_parser("from-hf", help="transformers model directory -> ptm checkpoint (to continue pretraining)",
                       description="Import the weights and tokenizer of a transformers model whose config.json "
                                   "model_type is " + " | ".join(a.model_type for a in exported.values())
                                   + "; heads missing from base models (e.g. BertModel) are initialised and reported.")
    f.add_argument("hf_dir", help="a transformers model directory (config.json, weights, tokenizer files)")
    f.add_argument("--out", required=True, help="checkpoint directory to write")
    e = sub.add_parser("to-elmo", help="ELMo checkpoint -> bilm-tf's options.json + weights.hdf5 + vocab.txt",
                       description="Write the files AllenNLP's Elmo reads (and the shared softmax, which it ignores).")
    e.add_argument("checkpoint", help="a checkpoint directory, or a training out_dir (its latest checkpoint)")
    e.add_argument("--out", required=True, help="directory to write")
    i = sub.add_parser("from-elmo", help="options.json + weights.hdf5 + vocab.txt -> ptm checkpoint",
                       description="Import bilm-tf's ELMo files (ptm's export, or a published model: its softmax, "
                                   "not in the published files, is initialised and reported).")
    i.add_argument("elmo_dir", help="a directory with options.json, weights.hdf5 and vocab.txt")
    i.add_argument("--out", required=True, help="checkpoint directory to write")
    return ap


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    from pretrain.checkpoint import CheckpointError  # torch: after --help

    try:
        if os.path.exists(a.out) and not os.path.isdir(a.out):
            raise CheckpointError(f"--out {a.out} is a file; pass a directory to write (new, or one this command "
                                  "wrote)")
        if a.command in ("consolidate", "reshard"):
            from checkpoints_tools.reshard import reshard

            print(f"wrote {reshard(a.checkpoint, a.out, getattr(a, 'tp', 1), a.weights_only)}")
        elif a.command == "to-hf":
            from checkpoints_tools.hf import to_hf

            print(f"wrote {to_hf(a.checkpoint, a.out, a.max_shard_size)}")
        elif a.command == "to-elmo":
            from checkpoints_tools.bilm_tf import to_elmo

            print(f"wrote {to_elmo(a.checkpoint, a.out)}")
        else:
            if a.command == "from-elmo":
                from checkpoints_tools.bilm_tf import from_elmo as read
            else:
                from checkpoints_tools.hf import from_hf as read
            source = a.elmo_dir if a.command == "from-elmo" else a.hf_dir
            out, initialised = read(source, a.out)
            print(f"wrote {out}")
            if initialised:
                print(f"initialised (not in {source}): {', '.join(initialised)}")
    except (CheckpointError, OSError) as e:
        print("\n".join(f"checkpoints_tools: error: {line}" for line in str(e).splitlines()), file=sys.stderr)
        sys.exit(2)
