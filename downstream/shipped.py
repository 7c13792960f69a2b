"""Downstream tasks built from the embedded corpus (`data_prep corpus`: the standard library's docstrings and
Debian's fortunes-zh), with labels known by construction, written as task directories in the common formats:

| task     | kind                  | format    | what is predicted                                              |
|----------|-----------------------|-----------|----------------------------------------------------------------|
| source   | classification        | TSV       | which standard-library package a docstring comes from (4)      |
| next     | classification (pair) | JSONL     | whether sentence B follows sentence A in its document          |
| order    | classification (pair) | TSV       | whether two consecutive sentences are in their order           |
| position | regression            | TSV       | where in its document a sentence stands (0 first .. 1 last)    |
| code     | tagging               | CoNLL     | code names (`get_payload`, `os.path`, `f()`) and quoted spans   |
| follow   | QA                    | SQuAD     | the sentence that follows the question's sentence in a passage |

`source` carries a cloze pattern and verbaliser for zero-shot MLM scoring. For causal models, `text/dev.txt` holds
the dev documents (one per line, for perplexity) and `text/last_word.txt` dev sentences that end in a word (for
last-word accuracy). A document goes to train or dev as a whole (by a hash of its name), so no sentence is seen in
both. These documents are part of the embedded corpus a demo pretrains on: the scores compare models, they are not
held out from pretraining.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re

import yaml

from downstream import TaskError
from ptm.files import write_text

SOURCES = {"tkinter": "widget", "email": "mail", "asyncio": "loop", "xml": "parser"}  # class -> cloze word
SPECS = {
    "source": {"kind": "classification", "train": "train.tsv", "dev": "dev.tsv", "text": ["sentence"],
               "label": "label", "metrics": ["accuracy", "macro_f1", "mcc"],
               "cloze": {"pattern": "{text} It is about {mask}.", "verbalizer": SOURCES}},
    "next": {"kind": "classification", "train": "train.jsonl", "dev": "dev.jsonl", "text": ["sentence1", "sentence2"],
             "label": "label", "labels": ["no", "yes"], "metrics": ["accuracy", "f1", "mcc"]},
    "order": {"kind": "classification", "train": "train.tsv", "dev": "dev.tsv", "text": ["sentence1", "sentence2"],
              "label": "label", "labels": ["swapped", "kept"], "metrics": ["accuracy", "f1", "mcc"]},
    "position": {"kind": "regression", "train": "train.tsv", "dev": "dev.tsv", "text": ["sentence"],
                 "label": "score", "metrics": ["spearman", "pearson"]},
    "code": {"kind": "tagging", "train": "train.txt", "dev": "dev.txt"},
    "follow": {"kind": "qa", "train": "train.json", "dev": "dev.json"},
}
_CODE = re.compile(r"^[A-Za-z_][\w.]*(\(\))?$")
_SPACE = re.compile(r"\s+")
_CJK_CHAR = re.compile(r"[\u4e00-\u9fff]")


def _documents(corpus: str) -> list[tuple[str, str, str]]:
    """(name, language, text) of every document of a `data_prep corpus` directory."""
    out = []
    for lang in ("en", "zh"):
        if not os.path.isfile(os.path.join(corpus, f"{lang}.jsonl")):
            raise TaskError(f"--corpus {corpus} has no {lang}.jsonl: not a `ptm prep corpus` directory; write one with "
                            "`ptm prep corpus --out DIR`, or leave --corpus out")
        with open(os.path.join(corpus, f"{lang}.jsonl"), encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                out.append((d["source"], lang, d["text"]))
    return out


def _dev(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 5 == 0


def _sentences(text: str) -> list[str]:
    from data_prep.text import split_sentences

    out = [_SPACE.sub(" ", s).strip() for para in text.split("\n\n") for s in split_sentences(para)]
    return [s for s in out if len(s) >= 12]


def _tags(sentence: str) -> tuple[list[str], list[str]]:
    """Whitespace words of a sentence and their tags: B-CODE for a code name (an identifier with `_`, a dotted
    name or a call), B-/I-QUOTE over a span in quotes or backticks."""
    words, tags, quoted = [], [], False
    for raw in sentence.split():
        word = raw.strip(",;:")
        if not word:
            continue
        opens = word[0] in "'`\"" and len(word) > 1
        closes = word[-1] in "'`\"" and (len(word) > 1 or quoted)
        core = word.strip("'`\".")
        if opens and not quoted:
            tags.append("B-QUOTE")
            quoted = not closes
        elif quoted:
            tags.append("I-QUOTE")
            quoted = not closes
        elif _CODE.match(core) and ("_" in core or "." in core.strip(".") or core.endswith("()")):
            tags.append("B-CODE")
        else:
            tags.append("O")
        words.append(word)
    if quoted:  # an unclosed quote: not a span
        tags = ["O" if t.endswith("QUOTE") else t for t in tags]
    return words, tags


def build(corpus: str, seed: int = 0, max_train: int = 2000, max_dev: int = 400) -> dict[str, dict]:
    """{task: {"train": rows, "dev": rows}} from the corpus."""
    rng = random.Random(seed)
    docs = _documents(corpus)
    out = {name: {"train": [], "dev": []} for name in SPECS}
    out["text"] = {"train": [], "dev": []}
    split_sents = {"train": [], "dev": []}  # (language, sentences of a document)
    for name, lang, text in docs:
        split = "dev" if _dev(name) else "train"
        top = name.split(".")[0]
        if lang == "en" and top in SOURCES:
            passage = _SPACE.sub(" ", text[:400]).strip()
            out["source"][split].append({"sentence": passage, "label": top})
        if lang == "zh" and not name.startswith("fortunes-zh/chinese"):
            continue  # poems: lines, not sentences
        sents = _sentences(text)
        if split == "dev" and lang == "en":
            out["text"]["dev"].append(_SPACE.sub(" ", text).strip())
        if len(sents) >= 2:
            split_sents[split].append((lang, name, text, sents))
    for split, documents in split_sents.items():
        pool = {lang: [s for lg, _, _, ss in documents if lg == lang for s in ss] for lang in ("en", "zh")}
        for lang, name, text, sents in documents:
            n = len(sents)
            for i in range(n - 1):
                a, b = sents[i], sents[i + 1]
                if rng.random() < 0.5:
                    out["next"][split].append({"sentence1": a, "sentence2": b, "label": "yes"})
                else:
                    other = rng.choice(pool[lang])
                    if other not in (a, b):
                        out["next"][split].append({"sentence1": a, "sentence2": other, "label": "no"})
                keep = rng.random() < 0.5
                out["order"][split].append({"sentence1": a if keep else b, "sentence2": b if keep else a,
                                            "label": "kept" if keep else "swapped"})
            if n >= 3:
                for i, s in enumerate(sents):
                    out["position"][split].append({"sentence": s, "score": f"{i / (n - 1):.4f}"})
            if lang == "en":
                for s in sents:
                    words, tags = _tags(s)
                    if any(t != "O" for t in tags) or rng.random() < 0.3:
                        out["code"][split].append((words, tags))
            if n >= 3:
                context = " ".join(sents[:6])
                k = rng.randrange(0, min(n, 6) - 1)
                start = context.index(sents[k + 1], context.index(sents[k]) + len(sents[k]))
                out["follow"][split].append({"id": f"{name}#{k}", "question": sents[k], "context": context,
                                             "answers": [{"text": sents[k + 1], "answer_start": start}]})
    for name in out:
        for split, cap in (("train", max_train), ("dev", max_dev)):
            rows = out[name][split]
            rng.shuffle(rows)
            out[name][split] = rows[:cap]
    return out


def write(out_dir: str, corpus: str | None = None, seed: int = 0, max_train: int = 2000, max_dev: int = 400) -> dict:
    """Write every shipped task into OUT_DIR/NAME/ (task.yaml and its files); `corpus`: a `data_prep corpus`
    directory (default: written first into OUT_DIR/corpus). Returns {task: (train, dev) example counts}."""
    if corpus is None:
        from data_prep.corpus import write_default_corpus

        corpus = os.path.join(out_dir, "corpus")
        if not os.path.isfile(os.path.join(corpus, "zh.jsonl")):
            write_default_corpus(corpus)
    rows = build(corpus, seed, max_train, max_dev)
    counts = {}
    text = os.path.join(out_dir, "text")
    os.makedirs(text, exist_ok=True)
    write_text(os.path.join(text, "dev.txt"), "".join(f"{t}\n" for t in rows["text"]["dev"]))
    last = [s for task in ("order",) for r in rows[task]["dev"] for s in (r["sentence1"],)
            if re.search(r"[A-Za-z]{3,}[.!?]$", s) and not _CJK_CHAR.search(s)]
    write_text(os.path.join(text, "last_word.txt"), "".join(f"{s}\n" for s in last))
    counts["text"] = (len(rows["text"]["dev"]), len(last))
    for name, spec in SPECS.items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        for split in ("train", "dev"):
            write_text(os.path.join(d, spec[split]), _format(spec, rows[name][split]))
        write_text(os.path.join(d, "task.yaml"), yaml.safe_dump({"name": name, **spec}, allow_unicode=True,
                                                                sort_keys=False))
        counts[name] = (len(rows[name]["train"]), len(rows[name]["dev"]))
    return counts


def _format(spec: dict, rows: list) -> str:
    kind, path = spec["kind"], spec["train"]
    if kind == "tagging":
        return "\n\n".join("\n".join(f"{w}\t{t}" for w, t in zip(words, tags)) for words, tags in rows) + "\n"
    if kind == "qa":
        paragraphs = [{"context": r["context"], "qas": [{k: r[k] for k in ("id", "question", "answers")}]}
                      for r in rows]
        return json.dumps({"version": "ptm-shipped", "data": [{"title": "corpus", "paragraphs": paragraphs}]},
                          ensure_ascii=False)
    if path.endswith(".jsonl"):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    columns = [*spec["text"], spec["label"]]
    lines = ["\t".join(columns)] + ["\t".join(str(r[c]).replace("\t", " ") for c in columns) for r in rows]
    return "\n".join(lines) + "\n"
