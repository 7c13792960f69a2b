"""ptm's BERT training step against Hugging Face's on the same CPU, same threads, same batch, side by side.

    python bench/cpu_step.py [--steps 10] [--threads N] [--hidden 256 --layers 4 --seq 128 --batch 16]
                             [--short-seq-prob 0.1] [--only ROW ...]

One process, fp32, dropout 0.1, BERT's 30522-token vocabulary, a fraction --short-seq-prob of the samples shorter
than --seq (bench/step_runs.py has the batch and each step).
Rows: Hugging Face `BertForPreTraining` + torch.optim.AdamW, eager and `torch.compile`d; ptm with
`kernels=eager`, `kernels=compile`, and eager with `data.unpadded=true`. Prints the median step time (the first
steps, which compile, left out) and each row's ratio to eager Hugging Face.
"""
from __future__ import annotations

import argparse
import sys

import torch

from step_runs import hf_step, ptm_config, ptm_step, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row (median reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (heads: hidden / 64, MLP: 4 x hidden)")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers")
    parser.add_argument("--seq", type=int, default=128, help="sequence length (9 or more)")
    parser.add_argument("--batch", type=int, default=16, help="samples per step (one micro-batch)")
    parser.add_argument("--short-seq-prob", type=float, default=0.1, help="fraction of samples shorter than --seq")
    parser.add_argument("--only", nargs="*", help="run only these rows (names as printed)")
    args = parser.parse_args()
    for bad, why in ((args.steps < 1, f"--steps {args.steps}: give 1 or more"),
                     (args.hidden < 64, f"--hidden {args.hidden}: give 64 or more (heads of 64)"),
                     (args.seq < 9, f"--seq {args.seq}: give 9 or more (a short sample has 8 tokens or more)")):
        if bad:
            sys.exit(f"cpu_step.py: {why}")
    if args.threads:
        torch.set_num_threads(args.threads)

    def cfg(kernels: str):
        return ptm_config("bert-base", [
            "precision=fp32", "model.vocab_size=30522", f"model.hidden_size={args.hidden}",
            f"model.num_layers={args.layers}", f"model.num_heads={args.hidden // 64}",
            f"model.ffn_hidden_size={4 * args.hidden}", f"model.max_position_embeddings={args.seq}",
            f"data.seq_len={args.seq}", f"train.global_batch_size={args.batch}", f"train.micro_batch_size={args.batch}",
            f"data.short_seq_prob={args.short_seq_prob}", "optimizer.name=adamw", "zero.stage=0", f"kernels={kernels}"])

    rows = {"HF eager": lambda: hf_step(cfg("eager"), args.batch, compiled=False),
            "HF compiled": lambda: hf_step(cfg("eager"), args.batch, compiled=True),
            "ptm eager": lambda: ptm_step(cfg("eager"), args.batch),
            "ptm compiled": lambda: ptm_step(cfg("compile"), args.batch),
            "ptm unpadded": lambda: ptm_step(cfg("eager"), args.batch, unpadded=True)}
    unknown = [name for name in args.only or () if name not in rows]
    if unknown:
        sys.exit(f"cpu_step.py: --only {', '.join(map(repr, unknown))}: no such row; rows: {', '.join(rows)}")
    print(f"BERT hidden {args.hidden}, {args.layers} layers, seq {args.seq}, batch {args.batch}, fp32, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    results = {name: seconds(make(), args.steps, "cpu") for name, make in rows.items()
               if not args.only or name in args.only}
    base = results.get("HF eager")
    print(f"{'row':<16}{'ms/step':>10}{'vs HF eager':>14}")
    for name, s in results.items():
        print(f"{name:<16}{s * 1e3:>10.1f}" + (f"{s / base:>13.2f}x" if base else ""))


if __name__ == "__main__":
    main()
