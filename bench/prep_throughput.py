"""Throughput and peak memory of `python -m data_prep build` next to two peers: a Hugging Face `datasets`
reference and a Megatron-style pipeline.

Run: `make bench`, or `.venv/bin/python bench/prep_throughput.py [--mb 16 --mb2 48 --lang both]`
(needs the `bench` extra: datasets, psutil); `--pipelines ptm ptm-none --repeat 10` measures ptm's scaling and its
distance to the floor alone, many rounds in the time one round of the peers takes. ptm runs twice per size and
worker count: the full build (`--structure full`, what BERT/ERNIE need) and `--structure none` (documents and token
ids: a GPT corpus). Each corpus size is built by repeating the embedded corpus
(`python -m data_prep corpus`), every copy made distinct so de-duplication keeps it. One sentencepiece
model is trained up front (untimed) and used by every timed run. Every pipeline runs as a subprocess;
its peak memory is the largest sum of RSS over the process and its children, polled every 0.05 s
(shared copy-on-write pages of forked workers count once per process, so this over-estimates).
"""
import argparse
import importlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1e6
HEADER = """\
ptm: `python -m data_prep build`: read JSONL, NFKC + whitespace cleaning, exact de-duplication (hashing),
     sentence splitting, word boundaries, phrase spans, sentencepiece tokenization, Arrow shards + manifest.
     ptm-none: `--structure none`: read, clean, de-duplicate, tokenize each document whole, shards.
ref: Hugging Face datasets: load_dataset("json") (JSON -> Arrow cache), .map(batched=True) with
     SentencePieceProcessor.encode on "text" (tokenization only), save_to_disk (Arrow).
megatron: Megatron's preprocess_data.py pattern: a multiprocessing pool (json.loads + encode per document,
     imap chunks of 32) feeding megatron-core's IndexedDatasetBuilder (.bin/.idx), no sentence splitting.
Same corpus and sentencepiece model for both. MB = 10^6 bytes; corpus MB and MB/s count the UTF-8 text
fields. tokens: each pipeline's own count (ptm's cleaning and de-duplication give fewer; sentence-split
tokenization differs from whole-document tokenization). RSS: peak of the summed RSS of
the process tree. x ref: pipeline / ref at equal workers (MB/s: higher is faster; RSS: lower is leaner).
sentencepiece threads: ref's batched encode uses every core in each process (its default); ptm divides the
cores among its workers; megatron encodes one document at a time in each worker.
floor / floor-none: not a pipeline but a lower bound on any ptm build: the pieces it cannot skip, each timed
     alone in one process on the same corpus (json.loads per line, NFKC + whitespace clean-up, sentencepiece
     on every sentence (floor) or every whole document (floor-none) with all cores); 1 worker: parse + clean
     + encode wall time; w workers: their CPU time / min(w, cores), no start-up, no structure, no writing,
     no cyclic garbage collection and freed memory kept by malloc (as in ptm's build).
     Its "x ref" is the most any ptm build could reach on this machine."""


def make_corpus(src: Path, lang: str, mb: float, path: Path) -> int:
    """Write repetitions of the embedded corpus to `path` until its text reaches `mb`; return text bytes."""
    files = {"en": ["en.jsonl"], "zh": ["zh.jsonl"], "both": ["en.jsonl", "zh.jsonl"]}[lang]
    docs = [json.loads(line) for f in files for line in (src / f).read_text(encoding="utf-8").splitlines()]
    total = 0
    with path.open("w", encoding="utf-8") as out:
        for i in itertools.count():
            d = docs[i % len(docs)]
            copy = i // len(docs)
            text = d["text"] + (f" (copy {copy})" if copy else "")
            out.write(json.dumps({"text": text, "source": d["source"]}, ensure_ascii=False) + "\n")
            total += len(text.encode("utf-8"))
            if total >= mb * MB:
                return total


def measure(cmd: list[str], log: Path, env: dict) -> tuple[float, float]:
    """Run `cmd`, output to `log`; return (wall seconds, peak summed RSS of its process tree in bytes)."""
    import psutil

    peak = 0
    with log.open("w") as out:
        t0 = time.perf_counter()
        proc = psutil.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            rss = 0
            try:
                for p in [proc, *proc.children(recursive=True)]:
                    rss += p.memory_info().rss
            except psutil.Error:  # a process ended between listing and reading
                pass
            peak = max(peak, rss)
            time.sleep(0.05)
        wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{log.read_text()}")
    return wall, peak


def reference(corpus: str, model: str, num_proc: int, out: str) -> None:
    """The reference pipeline (runs in a child process); writes its token count to out/num_tokens."""
    import datasets
    import pyarrow.compute as pc
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    ds = datasets.load_dataset("json", data_files=corpus, split="train")
    ds = ds.map(lambda batch: {"input_ids": sp.encode(batch["text"])}, batched=True,
                num_proc=num_proc, remove_columns=ds.column_names)
    ds.save_to_disk(out)
    tokens = pc.sum(pc.list_value_length(ds.data.column("input_ids"))).as_py()
    Path(out, "num_tokens").write_text(str(tokens))


def floor(corpus: str, model: str, workers: int, out: str) -> None:
    """Time the unavoidable pieces of a ptm build alone (runs in a child process); writes out/floor.json. Without
    cyclic garbage collection and with freed memory kept (keep_freed_memory), as ptm builds run."""
    import gc
    import resource

    import sentencepiece

    from data_prep import text as T

    from data_prep.build import keep_freed_memory

    sp, cores = sentencepiece.SentencePieceProcessor(model_file=model), os.cpu_count() or 1
    gc.disable()
    keep_freed_memory()  # as every ptm build process does

    def timed(fn):
        """fn's result, its wall and its CPU time."""
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        result = fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        return result, time.perf_counter() - t0, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime

    def encode(texts):
        for i in range(0, len(texts), 1000):
            sp.encode(texts[i:i + 1000], out_type="numpy", num_threads=cores)

    with open(corpus, "rb") as f:
        lines = f.read().splitlines()
    texts, parse, _ = timed(lambda: [json.loads(line)["text"] for line in lines])
    docs, clean, _ = timed(lambda: [T.normalize(t, T.TextOptions()) for t in texts])
    sentences = [s.lstrip() for d in docs for s in T.split_sentences(d)]
    result = {}
    for name, pieces in (("floor", sentences), ("floor-none", docs)):
        _, wall, cpu = timed(lambda: encode(pieces))
        result[name] = parse + clean + wall if workers == 1 else (parse + clean + cpu) / min(workers, cores)
    Path(out, "floor.json").write_text(json.dumps(result))


_SP = None


def _megatron_init(model: str) -> None:
    import sentencepiece

    global _SP
    _SP = sentencepiece.SentencePieceProcessor(model_file=model)


def _megatron_encode(line: str):
    text = json.loads(line)["text"]
    ids = _SP.encode(text)
    return ids, len(text.encode("utf-8"))


def megatron(corpus: str, model: str, num_proc: int, out: str) -> None:
    """Megatron-LM's tools/preprocess_data.py, reduced to its data path (runs in a child process): Pool(num_proc)
    with a per-worker tokenizer, pool.imap(encode, lines, 32), megatron-core's IndexedDatasetBuilder."""
    import multiprocessing

    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder, get_bin_path, get_idx_path

    _megatron_init(model)
    prefix = os.path.join(out, "corpus_text_document")
    os.makedirs(out, exist_ok=True)
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=DType.optimal_dtype(_SP.get_piece_size()))
    tokens = 0
    with open(corpus, encoding="utf-8") as fin, multiprocessing.Pool(num_proc, _megatron_init, (model,)) as pool:
        for ids, _ in pool.imap(_megatron_encode, fin, 32):
            builder.add_document(np.asarray(ids), [len(ids)])
            tokens += len(ids)
    builder.finalize(get_idx_path(prefix))
    Path(out, "num_tokens").write_text(str(tokens))


def run_pipeline(name: str, w: int, corpus: Path, model: str, shard_size: str, tmp: Path,
                 env: dict) -> tuple[float, float, int]:
    """One timed run of a pipeline on `corpus` with w workers, its output and caches removed after:
    (wall seconds, peak RSS in bytes, tokens written)."""
    out = tmp / f"{name}-{corpus.stem}-{w}"
    if name.startswith("ptm"):
        cmd = [sys.executable, "-m", "data_prep", "build", str(corpus), "--out", str(out), "--tokenizer", model,
               "--workers", str(w), "--shard-size", shard_size, "--no-progress", "--overwrite",
               "--structure", "none" if name == "ptm-none" else "full"]
    else:
        cmd = [sys.executable, __file__, f"--{'reference' if name == 'ref' else name}", str(corpus), model, str(w),
               str(out)]
    secs, rss = measure(cmd, tmp / f"{out.name}.log", env)
    tokens = (json.loads((out / "manifest.json").read_text())["num_tokens"] if name.startswith("ptm")
              else int((out / "num_tokens").read_text()))
    for d in (out, tmp / "hf" / "datasets"):  # no cache reuse between runs
        shutil.rmtree(d, ignore_errors=True)
    return secs, rss, tokens


PIPELINES = ("ref", "megatron", "ptm", "ptm-none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=16, help="first corpus size, MB of text (default 16)")
    ap.add_argument("--mb2", type=float, default=48,
                    help="second, larger corpus size, MB of text, to show memory staying flat (default 48; 0: skip)")
    ap.add_argument("--lang", choices=["en", "zh", "both"], default="both",
                    help="repeat the English, the Chinese or both parts of the embedded corpus (default both)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                    help="worker counts: ptm --workers and the reference's num_proc (default 1 2)")
    ap.add_argument("--vocab-size", type=int, default=8000,
                    help="pieces in the shared sentencepiece model (default 8000)")
    ap.add_argument("--shard-size", default="8MB",
                    help="ptm --shard-size (default 8MB): ptm buffers one shard, so with shards smaller than "
                         "the corpus its peak memory should not grow with the corpus")
    ap.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=list(PIPELINES),
                    help="the pipelines to run beside the floor (default all; ptm and ptm-none alone measure "
                         "ptm's scaling and its distance to the floor in a fraction of the time)")
    ap.add_argument("--reference", nargs=4, metavar=("CORPUS", "MODEL", "NUM_PROC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--megatron", nargs=4, metavar=("CORPUS", "MODEL", "NUM_PROC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--floor", nargs=4, metavar=("CORPUS", "MODEL", "WORKERS", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds: each runs every pipeline and the floor once, in turn, and each row keeps its "
                         "fastest round (default 1; docs/performance.md's figures use 3 or more: this machine's "
                         "speed drifts by 20%% and more between minutes, so rows are compared from rounds that "
                         "shared its slow and fast phases)")
    a = ap.parse_args()
    if a.reference:
        return reference(a.reference[0], a.reference[1], int(a.reference[2]), a.reference[3])
    if a.megatron:
        return megatron(a.megatron[0], a.megatron[1], int(a.megatron[2]), a.megatron[3])
    if a.floor:
        return floor(a.floor[0], a.floor[1], int(a.floor[2]), a.floor[3])
    for module in ["psutil", *(["datasets"] if "ref" in a.pipelines else [])]:  # the `bench` extra's
        try:
            importlib.import_module(module)
        except ImportError:
            sys.exit(f"prep_throughput.py: {module} is not installed (pip install 'ptm[bench]')"
                     + ("; or leave ref out of --pipelines" if module == "datasets" else ""))

    with tempfile.TemporaryDirectory(prefix="ptm-bench-") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp / "hf"),
                   HF_DATASETS_CACHE=str(tmp / "hf" / "datasets"))
        py = [sys.executable]
        subprocess.run(py + ["-m", "data_prep", "corpus", "--out", str(tmp / "src")], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        print(f"training the shared {a.vocab_size}-piece sentencepiece model (untimed)", file=sys.stderr)
        measure(py + ["-m", "data_prep", "build", str(tmp / "src"), "--out", str(tmp / "tok"), "--vocab-size",
                      str(a.vocab_size), "--no-progress", "--overwrite"], tmp / "tok.log", env)
        model = str(tmp / "tok" / "tokenizer" / "spm.model")

        rows, paired = [], []
        for mb in [m for m in (a.mb, a.mb2) if m > 0]:
            corpus = tmp / f"corpus{mb:g}.jsonl"
            text_mb = make_corpus(tmp / "src", a.lang, mb, corpus) / MB
            runs, floors = {}, {}  # (pipeline, workers): [(seconds, peak RSS, tokens)]; (floor row, workers): [s]
            for _ in range(a.repeat):  # rounds: a slow phase of the machine falls on every pipeline, not on one
                for w in a.workers:
                    for name in a.pipelines:
                        print(f"{name} workers={w} corpus={text_mb:.1f} MB ...", file=sys.stderr)
                        run = run_pipeline(name, w, corpus, model, a.shard_size, tmp, env)
                        runs.setdefault((name, w), []).append(run)
                    out = tmp / f"floor-{mb:g}-{w}"
                    out.mkdir(exist_ok=True)
                    subprocess.run(py + [__file__, "--floor", str(corpus), model, str(w), str(out)], check=True,
                                   env=env)
                    for name, secs in json.loads((out / "floor.json").read_text()).items():
                        floors.setdefault((name, w), []).append(secs)
            for w in a.workers:
                for name in a.pipelines:
                    secs, rss, tokens = min(runs[name, w])
                    rows.append(dict(name=name, w=w, mb=text_mb, secs=secs, mbs=text_mb / secs, tps=tokens / secs,
                                     rss=rss / MB))
                for name in ("floor", "floor-none"):
                    secs = min(floors[name, w])
                    rows.append(dict(name=name, w=w, mb=text_mb, secs=secs, mbs=text_mb / secs, tps=None, rss=None))
                for name, bound in (("ptm", "floor"), ("ptm-none", "floor-none")):
                    if name not in a.pipelines:
                        continue
                    paired.append(f"{text_mb:.1f} MB, {w} worker{'s' * (w > 1)}, {name} / {bound}: "
                                  + per_round([f / r[0] for f, r in zip(floors[bound, w], runs[name, w])]))
            for w in a.workers[1:] if "ptm" in a.pipelines else []:
                paired.append(f"{text_mb:.1f} MB, ptm, {w} workers / {a.workers[0]}: "
                              + per_round([r1[0] / r[0] for r1, r in zip(runs["ptm", a.workers[0]], runs["ptm", w])]))
            corpus.unlink()

    print(HEADER + "\n")
    cols = f"{'pipeline':<9}{'workers':>8}{'corpus MB':>11}{'s':>9}{'MB/s':>8}{'tokens/s':>11}{'peak RSS MB':>13}"
    print(cols + (f"{'x ref MB/s':>12}{'x ref RSS':>11}" if "ref" in a.pipelines else ""))
    for r in rows:
        ref = next((x for x in rows if x["name"] == "ref" and x["w"] == r["w"] and x["mb"] == r["mb"]), None)
        if r["rss"] is None:  # a floor row
            print(f"{r['name']:<11}{r['w']:>6}{r['mb']:>11.1f}{r['secs']:>9.1f}{r['mbs']:>8.2f}{'-':>11}{'-':>13}"
                  + (f"{r['mbs'] / ref['mbs']:>12.2f}{'-':>11}" if ref else ""))
            continue
        ratio = f"{r['mbs'] / ref['mbs']:>12.2f}{r['rss'] / ref['rss']:>11.2f}" if ref and r["name"] != "ref" else ""
        print(f"{r['name']:<9}{r['w']:>8}{r['mb']:>11.1f}{r['secs']:>9.1f}{r['mbs']:>8.2f}{r['tps']:>11,.0f}"
              f"{r['rss']:>13.0f}{ratio}")
    print("\nMB/s ratios within each round (a round runs every row once, one after another), round by round:")
    print("\n".join(paired))


def per_round(ratios: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in ratios) + f" (median {statistics.median(ratios):.2f})"


if __name__ == "__main__":
    main()
