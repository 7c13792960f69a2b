"""A word-level dataset from a token-level one (ELMo's inputs): the dataset's words, its vocabulary with counts.

    python -m data_prep words DATA --out WORDS [--min-count 1]

A word is a run of tokens from one word start to the next (`word_start`: Latin words, and jieba's words for Chinese,
as data_prep recorded them), decoded to text. The vocabulary (`WORDS/tokenizer/vocab.txt`, bilm-tf's format: one
word per line) starts `<S>`, `</S>`, `<UNK>`, then the words by descending count (ties in code-point order), those
seen fewer than `--min-count` times left out (their occurrences become `<UNK>`); `counts.tsv` beside it holds each
word's count. Each document becomes its sentences, each `<S> words </S>` as bilm-tf reads them, the last one's
`</S>` being the end-of-document token that packed windows put after every document. The word dataset is then
built by `data_prep build` with that vocabulary (tokenizer kind `words`): shards, manifest and checks as any other.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import numpy as np

from data_prep import PrepError
from data_prep.dataset import Corpus, structure_of
from data_prep.text import has
from data_prep.tokenizer import META
from ptm.files import write_bytes, write_json

SPECIALS = ("<S>", "</S>", "<UNK>")


def sentences(corpus: Corpus, i: int, words: dict, tok) -> list[list[str]]:
    """Document `i`'s sentences as lists of words (`words`: a cache, token ids' bytes -> word; `tok`: the corpus's
    tokenizer)."""
    ids = corpus.tokens(i)
    starts = np.flatnonzero(corpus.word_start(i)).tolist() + [len(ids)]
    breaks = set(corpus.sentence_starts(i).tolist())
    out: list[list[str]] = []
    for a, b in zip(starts, starts[1:]):
        key = ids[a:b].tobytes()
        word = words.get(key)
        if word is None:
            word = words[key] = "".join(tok.decode(ids[a:b].tolist()).split())
        if a in breaks or not out:
            out.append([])
        if word:
            out[-1].append(word)
    return [s for s in out if s]


def vocabulary(counts: Counter, min_count: int) -> list[str]:
    """`<S>`, `</S>`, `<UNK>`, then the words seen at least `min_count` times by descending count."""
    kept = sorted((w for w, n in counts.items() if n >= min_count and w not in SPECIALS), key=lambda w: (-counts[w], w))
    return [*SPECIALS, *kept]


def build_words(src: str, out: str, min_count: int = 1, workers: int = 1, progress: bool = True,
                overwrite: bool = False) -> dict:
    """Build the word-level dataset of `src` in `out`; returns its manifest."""
    from data_prep.build import MANIFEST, BuildOptions, build
    from data_prep.text import TextOptions

    corpus = Corpus(src)
    if not has(structure_of(corpus.manifest), "words"):
        raise PrepError(f"{src} was built with --structure {structure_of(corpus.manifest)}: it has no word starts; "
                        f"rebuild it with --structure words (or full)")
    if min_count < 1:
        raise PrepError(f"--min-count {min_count} must be at least 1")
    cache, docs, counts, source = {}, [], Counter(), corpus.tokenizer()
    for i in range(len(corpus)):
        doc = sentences(corpus, i, cache, source)
        counts.update(w for s in doc for w in s)
        docs.append(doc)
    counts["<S>"] = counts["</S>"] = sum(len(doc) for doc in docs)  # one of each per sentence
    vocab = vocabulary(counts, min_count)
    known = set(vocab)
    # The words and vocabulary go to a directory of the same name at every run, the build's input: a re-run with the
    # same source and options is the build's no-op (and continues a build cut short), not "other inputs".
    tmp = os.path.abspath(out).rstrip(os.sep) + ".words-input"
    try:
        tok = os.path.join(tmp, "tokenizer")
        os.makedirs(tok, exist_ok=True)  # (--out's parent too, if not made yet, as for `build`)
        write_bytes(os.path.join(tok, "vocab.txt"), "".join(w + "\n" for w in vocab).encode())
        write_bytes(os.path.join(tok, "counts.tsv"),
                    "".join(f"{w}\t{counts.get(w, 0)}\n" for w in vocab).encode())
        write_json(os.path.join(tok, META), {"kind": "words", "files": ["vocab.txt", "counts.tsv"],
                                             "lowercase": False})
        text = os.path.join(tmp, "words.jsonl")
        with open(text, "w", encoding="utf-8") as f:
            for doc in docs:
                if doc:
                    words = " </S> ".join("<S> " + " ".join(w if w in known else "<UNK>" for w in s) for s in doc)
                    f.write(json.dumps({"text": words}, ensure_ascii=False) + "\n")
        opts = BuildOptions(inputs=[text], out=out, tokenizer=tok, workers=workers, progress=progress,
                            overwrite=overwrite, dedup=False, max_unk_rate=1.0,
                            text=TextOptions(nfkc=False, whitespace="keep", min_chars=1, max_chars=0,
                                             structure="none"))
        origin = f"the words of {os.path.abspath(src)} (--min-count {min_count}), staged there and removed after"
        return _name_origin(os.path.join(out, MANIFEST), build(opts), origin)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _name_origin(path: str, manifest: dict, origin: str) -> dict:
    """The manifest with its one source (the staged words, removed after the build) saying where they came from."""
    (source,) = manifest["sources"]
    if source.get("origin") != origin:
        source["origin"] = origin
        write_json(path, manifest)
    return manifest


def word_counts(tokenizer_dir: str) -> np.ndarray:
    """Each vocabulary word's count in the corpus it was built from (`counts.tsv`), in vocabulary order."""
    with open(os.path.join(tokenizer_dir, "counts.tsv"), encoding="utf-8") as f:
        return np.array([int(line.rsplit("\t", 1)[1]) for line in f], dtype=np.int64)
