"""`python -m data_prep` (also `ptm prep`): build, train-tokenizer, finalize, verify, inspect, words,
sentinels, similar-words, corpus."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

from data_prep import PrepError
from data_prep.text import STRUCTURES, TextOptions
from ptm.cli import show_defaults, whole
from ptm.files import refused_write

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def size_arg(value: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size such as 256MB, 64KiB or 1048576")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _input_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input")
    g.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files, directories or globs; .txt, .jsonl[.gz|.zst], .parquet, .arrow. Directories are "
                        "searched recursively, through links, skipping hidden files; of a Hugging Face save_to_disk "
                        "folder only the data files")
    g.add_argument("--format", choices=["text", "jsonl", "parquet", "arrow"],
                   help="input format for every file (default: from each file's extension)")
    g.add_argument("--text-field", default="text",
                   help="JSONL field or Parquet/Arrow column with the text (a dotted path reaches a nested object's or "
                        "a struct column's field)")
    g.add_argument("--pair-field", help="labelled pairs: the second text (e.g. a title for a query), joined to the "
                                        "first by a blank line; its first token is stored as pair_start")
    g.add_argument("--label-field", help="labelled examples: the field or column with the integer class id")
    g.add_argument("--doc-boundary", choices=["file", "blank-line", "line"], default="blank-line",
                   help="text files: one document per file, per blank-line separated block, or per line")
    g = p.add_argument_group("cleaning")
    g.add_argument("--no-nfkc", dest="nfkc", action="store_false", help="skip Unicode NFKC normalisation")
    g.add_argument("--whitespace", choices=["collapse", "keep"], default="collapse",
                   help="collapse runs of spaces and blank lines (default) or keep the text's whitespace as is")
    g.add_argument("--min-chars", type=whole("a length in characters (0, 1, ...)", 0), default=1,
                   help="drop documents shorter than this after cleaning")
    g.add_argument("--max-chars", type=whole("a length in characters (0: no limit)", 0), default=0,
                   help="drop documents longer than this (0: no limit)")
    g.add_argument("--seed", type=int, default=1234, help="seed for the tokenizer's sentence sample")


def _tokenizer_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tokenizer training (when no --tokenizer is given)")
    g.add_argument("--vocab-size", type=whole("a number of pieces (e.g. 32000)"), default=32000,
                   help="pieces in the trained tokenizer")
    g.add_argument("--model-type", choices=["unigram", "bpe", "byte_bpe"], default="unigram",
                   help="unigram or bpe: a sentencepiece model with BERT's specials [PAD] [UNK] [CLS] [SEP] [MASK] "
                        "(byte fallback); byte_bpe: a byte-level BPE (vocab.json + merges.txt, as GPT-2 and RoBERTa) "
                        "with RoBERTa's specials <s> <pad> </s> <unk> <mask>")
    g.add_argument("--num-unused", type=whole("a count (0, 1, ...)", 0), default=100,
                   help="reserved [unusedN] tokens after the specials (sentencepiece)")
    g.add_argument("--sentinels", type=whole("a count (0, 1, ...; T5: 100)", 0), default=0,
                   help="T5's span-corruption sentinels <extra_id_0..N-1>, appended after the vocabulary (T5: 100)")
    g.add_argument("--tokenizer-sample", type=whole("a count of sentences (1, 2, ...)"), default=1_000_000,
                   help="sentences sampled (uniformly, seeded) from the corpus to train on; bounds time and memory")


def _text_options(a) -> TextOptions:
    return TextOptions(nfkc=a.nfkc, whitespace=a.whitespace, min_chars=a.min_chars, max_chars=a.max_chars,
                       structure=getattr(a, "structure", "full"))


def parser() -> argparse.ArgumentParser:
    prog = sys.argv[0] if sys.argv[0].startswith("ptm ") else "python -m data_prep"
    ap = argparse.ArgumentParser(prog=prog,
                                 description="Turn raw text into sharded, memory-mappable Arrow datasets.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="raw text -> dataset directory (shards, tokenizer, manifest.json)",
                       description="Read, clean, de-duplicate, split into sentences, tokenize and write Arrow "
                                   "IPC shards plus manifest.json. Re-running after a crash resumes.")
    _input_options(b)
    b.add_argument("--out", required=True, help="dataset directory to create")
    g = b.add_argument_group("documents")
    g.add_argument("--no-dedup", dest="dedup", action="store_false", help="keep exact duplicate documents")
    g.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="unreadable records (invalid UTF-8, malformed JSON, missing field): stop with the file "
                        "and line (default), or skip them, counting each in the summary and rejects.txt")
    g.add_argument("--entities", metavar="FILE", help="entity dictionary, one entity per line (ERNIE entity spans)")
    g.add_argument("--structure", choices=STRUCTURES, default="full",
                   help="what to record besides documents and token ids, each level adding to the one before: "
                        "none (GPT-style corpora: each document tokenized whole, the fastest build), sentences "
                        "(BERT sentence pairs, token masking), words (whole-word and span masking), full (ERNIE "
                        "phrase and entity spans; default). Training refuses a dataset that lacks what its "
                        "objective and masking need")
    g = b.add_argument_group("tokenizer")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="reuse a tokenizer: sentencepiece .model, WordPiece vocab.txt, a BPE vocab.json (+merges.txt; "
                        "GPT-2's, RoBERTa's or GPT's), a tokenizer.json, or another dataset's directory. Default: train "
                        "one on this corpus (--model-type)")
    g.add_argument("--max-unk-rate", type=float, default=0.05,
                   help="fail when more than this fraction of tokens is [UNK] in the first 1000 documents")
    _tokenizer_options(b)
    g = b.add_argument_group("output and parallelism")
    g.add_argument("--shard-size", type=size_arg, default=256 << 20, help="maximum shard size (default 256MB)")
    g.add_argument("--workers", type=whole("a count (1, 2, ...)"), default=1, help="tokenizer processes on this node")
    g.add_argument("--num-partitions", type=whole("a count (1, 2, ...)"), default=1,
                   help="split the inputs into this many partitions (one per Slurm array task or node)")
    g.add_argument("--partition", type=whole("a partition (0, 1, ...)", 0),
                   help="build only this partition (0-based); then run `finalize`. Under mpirun each rank "
                        "builds its own partition and rank 0 finalizes")
    g.add_argument("--overwrite", action="store_true", help="replace a finished dataset in --out")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

    t = sub.add_parser("train-tokenizer", help="train a tokenizer (for partitioned builds)",
                       description="Train the tokenizer a partitioned build shares; pass its "
                                   "directory to build --tokenizer.")
    _input_options(t)
    t.add_argument("--out", required=True, help="directory for the tokenizer (spm.model, or vocab.json and merges.txt) "
                                                 "and ptm_tokenizer.json")
    t.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="unreadable records (invalid UTF-8, malformed JSON, missing field): stop with the file "
                        "and line (default), or leave them out of the sample")
    _tokenizer_options(t)

    f = sub.add_parser("finalize", help="check all partitions and write manifest.json",
                       description="After every `build --partition I` finished: de-duplicate across "
                                   "partitions and write manifest.json.")
    f.add_argument("dir", help="dataset directory")

    v = sub.add_parser("verify", help="check schema, hashes and counts; exit 0 only when valid")
    v.add_argument("dir", help="dataset directory")

    i = sub.add_parser("inspect", help="counts, length histogram, decoded samples, top tokens")
    i.add_argument("dir", help="dataset directory")
    i.add_argument("--samples", type=whole("a count (0, 1, ...)", 0), default=1, help="decoded documents to show")
    i.add_argument("--seed", type=int, default=0, help="which documents to sample")
    i.add_argument("--top", type=whole("a count (0, 1, ...)", 0), default=20, help="most frequent tokens to list")

    w = sub.add_parser("words", help="a word-level dataset (ELMo) from a dataset's words, with the vocabulary",
                       description="Each document's words (runs of tokens from one word start to the next, decoded), "
                                   "sentence by sentence as <S> words </S>, with a vocabulary file (<S>, </S>, <UNK>, "
                                   "then the words by descending count) and counts.tsv; built as a dataset.")
    w.add_argument("dir", help="a dataset built with --structure words or full")
    w.add_argument("--out", required=True, help="word dataset directory to create")
    w.add_argument("--min-count", type=whole("a count (1, 2, ...)"), default=1,
                   help="words seen fewer times become <UNK> (default 1)")
    w.add_argument("--workers", type=whole("a count (1, 2, ...)"), default=1, help="build processes")
    w.add_argument("--overwrite", action="store_true", help="replace a finished dataset in --out")
    w.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

    s = sub.add_parser("sentinels", help="a finished dataset with T5's sentinels added (same shards, linked)",
                       description="Add T5's span-corruption sentinels <extra_id_0..N-1> after a finished dataset's "
                                   "vocabulary: the shards are linked, not rebuilt (text never encodes to a sentinel).")
    s.add_argument("dir", help="a finished dataset directory")
    s.add_argument("--out", required=True, help="the new dataset directory")
    s.add_argument("--count", type=whole("a count (1, 2, ...; T5: 100)"), default=100,
                   help="sentinels to add (T5: 100)")
    m = sub.add_parser("similar-words", help="MacBERT's similar-words file (data.similar_words) from word vectors",
                       description="Write each word followed by its --top nearest words by cosine similarity, one "
                                   "word a line: the file data.similar_words (MacBERT's correction masking) reads. "
                                   "A model's words are its tokenizer's pieces that spell a word in one token "
                                   "(special tokens left out), their vectors its input word embeddings.")
    m.add_argument("vectors", help="a word2vec/fastText text vectors file (word v1 v2 ... a line, with or without "
                                   "the `count dim` header), a Hugging Face model directory, or a ptm run or "
                                   "checkpoint")
    m.add_argument("--out", required=True, help="the similar-words file to write")
    m.add_argument("--top", type=whole("a count (1, 2, ...)"), default=5, help="nearest words per word (default 5)")
    m.add_argument("--min-similarity", type=float, metavar="COSINE",
                   help="leave out neighbours less similar than this (-1 to 1; default: keep all --top)")
    m.add_argument("--dataset", metavar="DIR", help="only the words of this ptm dataset's vocabulary (a dataset or "
                                                    "tokenizer directory; those it spells in one token)")
    m.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    c = sub.add_parser("corpus", help="write the embedded default corpus (real English and Chinese text)",
                       description="English: docstrings of Python's standard library. Chinese: Debian's "
                                   "fortunes-zh (installed by scripts/setup.sh).")
    c.add_argument("--out", required=True, help="directory for en.jsonl and zh.jsonl")
    return show_defaults(ap)


def run(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.command == "build":
        from data_prep.build import BuildOptions, build

        opts = BuildOptions(
            inputs=a.inputs, out=a.out, format=a.format, text_field=a.text_field, pair_field=a.pair_field,
            label_field=a.label_field, doc_boundary=a.doc_boundary,
            text=_text_options(a), dedup=a.dedup, on_error=a.on_error, tokenizer=a.tokenizer,
            vocab_size=a.vocab_size, model_type=a.model_type, num_unused=a.num_unused, sentinels=a.sentinels,
            tokenizer_sample=a.tokenizer_sample, entities=a.entities, shard_size=a.shard_size, workers=a.workers,
            num_partitions=a.num_partitions, partition=a.partition, max_unk_rate=a.max_unk_rate, seed=a.seed,
            overwrite=a.overwrite, progress=a.progress)
        t0 = time.time()
        manifest = build(opts)
        if manifest is not None:
            from data_prep.inspect import summary

            built = os.path.getmtime(os.path.join(a.out, "manifest.json")) >= t0  # (not: already built, nothing done)
            print(summary(manifest, time.time() - t0 if built else None))
    elif a.command == "train-tokenizer":
        from data_prep.build import BuildOptions, train_tokenizer
        from data_prep.sources import expand_inputs

        opts = BuildOptions(inputs=a.inputs, out=a.out, format=a.format, text_field=a.text_field,
                            pair_field=a.pair_field, label_field=a.label_field,
                            doc_boundary=a.doc_boundary, text=_text_options(a), vocab_size=a.vocab_size,
                            model_type=a.model_type, num_unused=a.num_unused, sentinels=a.sentinels,
                            tokenizer_sample=a.tokenizer_sample,
                            seed=a.seed, on_error=a.on_error)
        tok = train_tokenizer(expand_inputs(a.inputs, a.format, a.out), opts, a.out)
        print(f"wrote {tok.kind} tokenizer ({tok.vocab_size} pieces) to {a.out}")
    elif a.command == "finalize":
        from data_prep.build import finalize
        from data_prep.inspect import summary

        print(summary(finalize(a.dir), None))
    elif a.command == "verify":
        from data_prep.verify import verify

        problems = verify(a.dir)
        for p in problems:
            print(f"INVALID: {p}")
        if problems:
            return 1
        print(f"{a.dir}: valid")
    elif a.command == "inspect":
        from data_prep.inspect import inspect

        print(inspect(a.dir, samples=a.samples, seed=a.seed, top=a.top))
    elif a.command == "words":
        from data_prep.inspect import summary
        from data_prep.words import build_words

        t0 = time.time()
        print(summary(build_words(a.dir, a.out, a.min_count, a.workers, a.progress, a.overwrite), time.time() - t0))
    elif a.command == "sentinels":
        from data_prep.sentinels import add_sentinels

        m = add_sentinels(a.dir, a.out, a.count)
        print(f"{a.out}: {m['num_documents']} documents, vocabulary {m['vocab_size']} with {a.count} sentinels")
    elif a.command == "similar-words":
        from data_prep.similar import similar_words

        n = similar_words(a.vectors, a.out, a.top, a.min_similarity, a.dataset, a.progress)
        print(f"wrote {a.out}: {n} words with their similar words")
    elif a.command == "corpus":
        from data_prep.corpus import write_default_corpus

        for path, n in write_default_corpus(a.out).items():
            print(f"{path}: {n} documents")
    return 0


def main(argv=None) -> None:
    try:
        sys.exit(run(argv))
    except PrepError as e:
        print(f"data_prep: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a full disk, a quota: a build resumes after its last finished shard
        line = refused_write(e, "the output (--out)", "re-run the same command")
        if line is None:
            raise
        print(f"data_prep: error: {line}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM (`stop_on_sigterm`)
        print("data_prep: interrupted; re-run the same command to resume", file=sys.stderr)
        sys.exit(getattr(e, "status", 130))
