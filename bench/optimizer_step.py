"""The optimizer step alone on a BERT-base-sized parameter set (110M parameters in 158 tensors: BERT-base's, its
q, k and v fused as ptm holds them), side by side: ptm's LAMB and AdamW multi-tensor (`foreach=True`, the default
on CUDA) and one parameter at a time (`foreach=False`, the default on CPU, and ptm's only path before), ptm's AdamW
on torch's fused kernel (its default wherever torch has one), and torch.optim.AdamW (per tensor, foreach, fused).

    python bench/optimizer_step.py [--steps 5] [--device cpu|cuda] [--threads N]

Prints the median step time of each and its ratio to torch.optim.AdamW(foreach=True). Gradients are random
and fixed; the first step (moment allocation) is left out.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from pretrain.optim import AdamW, Lamb, param_groups


def bert_base_shapes(layers: int = 12, h: int = 768, f: int = 3072, vocab: int = 30592) -> list[tuple[int, ...]]:
    """BERT-base's parameter shapes as ptm builds them (vocabulary padded to a multiple of 128)."""
    shapes = [(vocab, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(layers):
        shapes += [(3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (f, h), (f,), (h, f), (h,), (h,), (h,)]
    return shapes + [(h, h), (h,), (h,), (h,), (vocab,), (h, h), (h,), (2, h), (2,)]


def make(kind: str, params: list[torch.nn.Parameter]):
    groups = param_groups(torch.nn.ParameterList(params), 0.01)
    return {
        "ptm LAMB multi-tensor": lambda: Lamb(groups, lr=1e-3, foreach=True),
        "ptm LAMB per parameter": lambda: Lamb(groups, lr=1e-3, foreach=False),
        "ptm AdamW fused": lambda: AdamW(groups, lr=1e-3, fused=True),
        "ptm AdamW multi-tensor": lambda: AdamW(groups, lr=1e-3, foreach=True, fused=False),
        "ptm AdamW per parameter": lambda: AdamW(groups, lr=1e-3, foreach=False, fused=False),
        "torch AdamW per tensor": lambda: torch.optim.AdamW(groups, lr=1e-3, foreach=False),
        "torch AdamW foreach": lambda: torch.optim.AdamW(groups, lr=1e-3, foreach=True),
        "torch AdamW fused": lambda: torch.optim.AdamW(groups, lr=1e-3, fused=True),
    }[kind]()


KINDS = ["ptm LAMB multi-tensor", "ptm LAMB per parameter", "ptm AdamW fused", "ptm AdamW multi-tensor", "ptm AdamW per parameter",
         "torch AdamW per tensor", "torch AdamW foreach", "torch AdamW fused"]


def seconds_per_step(kind: str, shapes, steps: int, device: str) -> float:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).mul_(0.02).to(device)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    opt = make(kind, params)
    times = []
    for _ in range(steps + 1):
        sync(device)
        start = time.perf_counter()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per optimizer (median reported)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the parameters live (default: cuda where there is one)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.steps < 1:
        sys.exit(f"optimizer_step.py: --steps {args.steps}: give 1 or more")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("optimizer_step.py: --device cuda: no CUDA device here: leave --device out, or give cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = bert_base_shapes()
    n = sum(torch.Size(s).numel() for s in shapes)
    print(f"{len(shapes)} tensors, {n / 1e6:.1f}M parameters, {args.device}, {torch.get_num_threads()} threads")
    results = {kind: seconds_per_step(kind, shapes, args.steps, args.device) for kind in KINDS}
    base = results["torch AdamW foreach"]
    print(f"{'optimizer':<26}{'ms/step':>10}{'vs torch foreach':>18}")
    for kind, s in results.items():
        print(f"{kind:<26}{s * 1e3:>10.1f}{s / base:>17.2f}x")


if __name__ == "__main__":
    main()
