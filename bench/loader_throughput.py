"""Samples per second of the BERT loader (seq 128, NSP pairs, dynamic whole-word masking) with 0, 1 and 2
worker processes, next to the 2,000 samples/s that one GPU consumes.

Run: `.venv/bin/python bench/loader_throughput.py [--data DS] [--samples 20000]`. Without --data it builds the
embedded corpus into a temporary dataset first (`python -m data_prep corpus`, then `python -m data_prep build
--vocab-size 8000`, about 5 s). The index maps are built before the timed runs (their time is printed);
each run is timed from its first batch, so worker start-up is left out (and printed).
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data_prep import PrepError
from data_prep.dataset import Corpus
from pretrain.data.bert import BertDataset
from pretrain.data.loader import make_loader
from pretrain.data.masking import Masker

GPU_SAMPLES_PER_S = 2000


def build_dataset(tmp: Path) -> str:
    py = [sys.executable, "-m", "data_prep"]
    subprocess.run(py + ["corpus", "--out", str(tmp / "corpus")], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(py + ["build", str(tmp / "corpus"), "--out", str(tmp / "ds"), "--vocab-size", "8000",
                         "--no-progress"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return str(tmp / "ds")


def run(source, workers: int, samples: int, batch: int) -> tuple[float, float]:
    """(seconds to the first batch, samples/s after it)."""
    start = time.perf_counter()
    loader = iter(make_loader(source, batch, total_samples=samples, num_workers=workers))
    next(loader)
    first = time.perf_counter()
    n = sum(len(b["input_ids"]) for b in loader)
    return first - start, n / (time.perf_counter() - first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="a dataset built by `python -m data_prep build` (default: build one)")
    ap.add_argument("--samples", type=int, default=20000, help="samples per run (default 20000)")
    ap.add_argument("--batch", type=int, default=32, help="micro-batch size (default 32)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="worker counts (default 0 1 2)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptm-bench-") as tmp:
        path = a.data or build_dataset(Path(tmp))
        corpus = Corpus(path)
        masker = Masker(corpus.special_ids, corpus.vocab_size, strategy="whole_word", max_predictions=20)
        start = time.perf_counter()
        source = BertDataset(path, 128, masker, pair_task="nsp", seed=1234, cache_dir=tmp)
        source.prepare(0)
        print(f"dataset: {len(corpus):,} documents, {corpus.manifest['num_tokens']:,} tokens -> "
              f"{len(source):,} samples per epoch; index maps in {time.perf_counter() - start:.2f} s")
        print("BERT seq 128, mlm_nsp, whole-word masking, micro-batch", a.batch)
        print(f"{'workers':>7} | {'start s':>7} | {'samples/s':>9} | {'GPU needs/s':>11} | {'loader / GPU':>12}")
        for w in a.workers:
            startup, rate = run(source, w, a.samples, a.batch)
            ratio = rate / GPU_SAMPLES_PER_S
            print(f"{w:>7} | {startup:>7.2f} | {rate:>9,.0f} | {GPU_SAMPLES_PER_S:>11,} | {ratio:>12.2f}")


if __name__ == "__main__":
    try:
        main()
    except PrepError as e:  # --data is not a dataset
        sys.exit(f"loader_throughput.py: {e}")
