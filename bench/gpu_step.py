"""Training throughput on one GPU: ptm next to Hugging Face (eager and compiled) and megatron-core's own models,
BERT-large phase 1 and 2 (seq 128 and 512) and GPT-2 medium (seq 1024), fp16 and bf16.

    python bench/gpu_step.py [--cases bert-large-128 ...] [--precisions bf16 fp16] [--steps 10] [--tiny]

Per case and precision, one row per implementation: samples/s, tokens/s, model TFLOP/s, MFU (model FLOPs from
`pretrain.cost.model_flops_per_sample`, the formula in docs/performance.md, the same for every row: useful
work, not what each implementation happens to compute) and peak memory. ptm runs as `ptm train` does
(`kernels=auto`: eager blocks, the fused LM loss on CUDA; ZeRO-1; LAMB for BERT as in NVIDIA's recipe, AdamW for
GPT-2), and again with compiled blocks (`kernels=compile`).
A row that cannot run (out of memory, a missing library) prints why and the others go on. `--tiny` shrinks
every model to a few layers so the script can be checked on a CPU (tests/test_bench.py does).
"""
from __future__ import annotations

import argparse
import itertools
import sys
import traceback

import torch

from pretrain import cost, hardware
from step_runs import hf_step, mcore_step, ptm_config, ptm_step, seconds

CASES = {  # name: (preset, seq_len, micro batch, optimizer)
    "bert-large-128": ("bert-large", 128, 64, "lamb"),
    "bert-large-512": ("bert-large", 512, 16, "lamb"),
    "gpt2-medium-1024": ("gpt2-medium", 1024, 8, "adamw"),
    "bert-base-128": ("bert-base", 128, 32, "lamb"),
    "gpt3-small-2048": ("gpt3-small", 2048, 4, "adamw"),  # local layers: SDPA under a band mask
    "gpt3-small-2048-dense": ("gpt3-small", 2048, 4, "adamw"),  # the same, every layer dense (`DENSE`)
}
DENSE = ("gpt3-small-2048-dense",)  # cases run with model.attention_layers=[global]
ROWS = ("ptm", "ptm compiled", "ptm whole-compiled", "ptm graphed", "HF eager", "HF compiled", "megatron-core")
TINY = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.ffn_hidden_size=256"]


def config(case: str, precision: str, tiny: bool, kernels: str = "auto", micro: int | None = None,
           extra: tuple = ()):
    preset, seq, default, opt = CASES[case]
    batch = micro or default
    vocab = 50257 if preset.startswith(("gpt2", "gpt3")) else 30522
    seq = min(seq, 64) if tiny else seq
    cfg = ptm_config(preset, [f"precision={precision}", f"model.vocab_size={vocab}", f"data.seq_len={seq}",
                              f"model.max_position_embeddings={max(seq, 512 if vocab == 30522 else 1024)}",
                              f"train.global_batch_size={2 if tiny else batch}", f"train.micro_batch_size={2 if tiny else batch}",
                              f"optimizer.name={opt}", "zero.stage=1", f"kernels={kernels}", *(TINY if tiny else []),
                              *(["model.attention_layers=[global]"] if case in DENSE else []), *extra])
    return cfg, (2 if tiny else batch)


def device(tiny: bool, script: str) -> torch.device:
    """The GPU; on a CPU only --tiny's models (the full-size ones would take hours there)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not tiny:
        sys.exit(f"{script}: no CUDA device here: run it on a GPU machine, or add --tiny to check it on this CPU")
    return torch.device("cpu")


def row(name: str, make, cfg, batch: int, steps: int, device) -> str:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        s = seconds(make(), steps, device)
    except Exception as e:  # noqa: BLE001 - a row that cannot run says why; the others go on
        traceback.print_exc(limit=2)
        return f"{name:<18}  could not run: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    samples = batch / s
    flops = cost.model_flops_per_sample(cfg.model, cfg.data.seq_len, cost.predicted_tokens(cfg)) * samples
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    mfu = hardware.mfu(flops, device_name, cfg.precision)
    memory = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return (f"{name:<18}{samples:>10.1f}{samples * cfg.data.seq_len:>12.0f}{flops / 1e12:>9.1f}"
            f"{'' if mfu is None else f'{100 * mfu:.1f}%':>8}{memory:>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES), metavar="CASE",
                        help=f"model, sequence length and default micro batch (default: all of {', '.join(CASES)})")
    parser.add_argument("--precisions", nargs="*", default=["bf16", "fp16"], choices=["bf16", "fp16", "fp32"],
                        help="bf16, fp16 or fp32 (default: bf16 fp16)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row (median reported)")
    parser.add_argument("--micro", nargs="*", type=int, default=[None], metavar="N",
                        help="micro batch sizes to time each case at (default: the case's own)")
    parser.add_argument("--tiny", action="store_true", help="2-layer models, short sequences: check the script on a CPU")
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS), metavar="ROW",
                        help=f"implementations to time (default: all of {', '.join(ROWS)})")
    args = parser.parse_args()
    dev = device(args.tiny, "gpu_step.py")
    print(f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}, torch {torch.__version__}")
    for case, precision, micro in itertools.product(args.cases, args.precisions, args.micro):
        cfg, batch = config(case, precision, args.tiny, micro=micro)
        compiled, _ = config(case, precision, args.tiny, "compile", micro)
        undropped, _ = config(case, precision, args.tiny, micro=micro, extra=("model.attention_dropout=0",))
        print(f"\n{case} {precision}, micro batch {batch}")
        print(f"{'':<18}{'samples/s':>10}{'tokens/s':>12}{'TFLOP/s':>9}{'MFU':>8}{'mem GiB':>9}")
        makes = {"ptm": lambda: ptm_step(cfg, batch), "ptm compiled": lambda: ptm_step(compiled, batch),
                 "ptm whole-compiled": lambda: ptm_step(cfg, batch, whole=True),
                 "ptm graphed": lambda: ptm_step(undropped, batch, graphed=True),
                 "HF eager": lambda: hf_step(cfg, batch, compiled=False),
                 "HF compiled": lambda: hf_step(cfg, batch, compiled=True),
                 "megatron-core": lambda: mcore_step(cfg, batch)}
        for name in args.rows:
            print(row(name, makes[name], cfg, batch, args.steps, dev))


if __name__ == "__main__":
    main()
