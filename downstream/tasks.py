"""Downstream tasks as files in the common formats, read into examples with one-line errors naming the file, the
line and the fix.

A task is a directory with a `task.yaml` (or a known name and a directory: `sst2=~/glue/SST-2`, `KNOWN`):

    name: next                    # what results call it
    kind: classification          # classification | regression | tagging | qa
    train: train.tsv              # GLUE/CLUE-style TSV (a header row, or `columns:`) or JSONL; CoNLL; SQuAD JSON
    dev: dev.tsv
    text: [sentence1, sentence2]  # one field, or two for a pair (classification, regression)
    label: label                  # the field with the class name or the score
    labels: [no, yes]             # optional: the classes in order (default: the training labels, sorted; tags:
                                  #   train's and dev's)
    metrics: [accuracy, f1, mcc]  # the first is the one seeds and learning rates are chosen by
    cloze: {pattern: "{text} It is about {mask}.", verbalizer: {email: mail, asyncio: loop}}  # zero-shot (MLM)

CoNLL files (kind tagging) hold a token and its tag per line (`token_column`, `tag_column`: default 0 and -1),
sentences separated by blank lines, `-DOCSTART-` lines skipped; tags are BIO (O, B-X, I-X; E-/S- too). SQuAD JSON
(kind qa) is {"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text",
"answer_start"}]}]}]}]} (v1.1; a v2 question without answers is skipped and counted).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field

import yaml

from downstream import TaskError

KINDS = ("classification", "regression", "tagging", "qa")
DEFAULT_METRICS = {"classification": ["accuracy", "f1", "mcc"], "regression": ["pearson", "spearman"],
                   "tagging": ["f1", "precision", "recall"], "qa": ["f1", "exact_match"]}
SPEC_KEYS = {"name", "kind", "train", "dev", "format", "text", "label", "labels", "metrics", "cloze", "header",
             "columns", "token_column", "tag_column"}

# Layouts of public benchmarks' files, so `--task NAME=DIR` reads them as their authors ship them.
_PAIR = {"kind": "classification", "train": "train.tsv", "dev": "dev.tsv", "label": "label", "labels": ["0", "1"]}
_NLI = ["contradiction", "entailment", "neutral"]
_RTE = ["entailment", "not_entailment"]
KNOWN = {
    "cola": {**_PAIR, "header": False, "columns": ["source", "label", "mark", "sentence"], "text": ["sentence"],
             "metrics": ["mcc", "accuracy"]},
    "sst2": {**_PAIR, "text": ["sentence"], "metrics": ["accuracy"]},
    "mrpc": {**_PAIR, "text": ["#1 String", "#2 String"], "label": "Quality", "metrics": ["f1", "accuracy"]},
    "qqp": {**_PAIR, "text": ["question1", "question2"], "label": "is_duplicate", "metrics": ["f1", "accuracy"]},
    "stsb": {**_PAIR, "kind": "regression", "text": ["sentence1", "sentence2"], "label": "score", "labels": []},
    "mnli": {**_PAIR, "dev": "dev_matched.tsv", "text": ["sentence1", "sentence2"], "label": "gold_label",
             "labels": _NLI, "metrics": ["accuracy"]},
    "qnli": {**_PAIR, "text": ["question", "sentence"], "labels": _RTE, "metrics": ["accuracy"]},
    "rte": {**_PAIR, "text": ["sentence1", "sentence2"], "labels": _RTE, "metrics": ["accuracy"]},
    "wnli": {**_PAIR, "text": ["sentence1", "sentence2"], "metrics": ["accuracy"]},
    "afqmc": {**_PAIR, "train": "train.json", "dev": "dev.json", "format": "jsonl", "text": ["sentence1", "sentence2"],
              "metrics": ["accuracy"]},
    "tnews": {**_PAIR, "train": "train.json", "dev": "dev.json", "format": "jsonl", "text": ["sentence"],
              "labels": [], "metrics": ["accuracy"]},
    "iflytek": {**_PAIR, "train": "train.json", "dev": "dev.json", "format": "jsonl", "text": ["sentence"],
                "labels": [], "metrics": ["accuracy"]},
    "ocnli": {**_PAIR, "train": "train.50k.json", "dev": "dev.json", "format": "jsonl",
              "text": ["sentence1", "sentence2"], "labels": _NLI, "metrics": ["accuracy"]},
    "conll2003": {"kind": "tagging", "train": "train.txt", "dev": "valid.txt",
                  "labels": ["O"] + [f"{b}-{t}" for t in ("PER", "ORG", "LOC", "MISC") for b in "BI"]},
    "squad": {"kind": "qa", "train": "train-v1.1.json", "dev": "dev-v1.1.json"},
    "cmrc2018": {"kind": "qa", "train": "cmrc2018_train.json", "dev": "cmrc2018_dev.json"},
}


@dataclass
class Example:
    """One example: `texts` and `label` (a class name or a score) for classification and regression, `words` and
    `tags` for tagging, `question`, `context` and `answers` ((text, character start) each) for QA."""
    texts: tuple[str, ...] = ()
    label: str | float | None = None
    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    question: str = ""
    context: str = ""
    answers: list[tuple[str, int]] = field(default_factory=list)
    id: str = ""
    line: int = 0  # where it is in its file (classification, regression; tagging: its first line)


@dataclass
class Task:
    name: str
    kind: str
    train: list[Example]
    dev: list[Example]
    labels: list[str]  # classes (classification) or tags (tagging), in order; empty otherwise
    metrics: list[str]
    cloze: dict | None = None
    skipped: dict = field(default_factory=dict)  # SQuAD v2 questions without answers, of {train, dev}

    @property
    def pair(self) -> bool:
        return any(len(e.texts) == 2 for e in self.train[:1])


def load(arg: str) -> Task:
    """A task from `DIR` (holding task.yaml) or `NAME=DIR` (a `KNOWN` layout, task.yaml in DIR overriding it)."""
    name, _, directory = arg.partition("=")
    if name not in KNOWN and (os.path.isdir(os.path.expanduser(arg)) or os.sep in name):
        name, directory = "", arg  # a directory, whose path may hold "=" (runs/lr=1e-4/next)
    directory = os.path.expanduser(directory)
    spec_file = os.path.join(directory, "task.yaml")
    spec = dict(KNOWN[name]) if name in KNOWN else {}
    if name and name not in KNOWN:
        raise TaskError(f"--task {arg}: {name!r} is not a known task ({', '.join(KNOWN)}); pass a directory with a "
                        "task.yaml, or KNOWN=DIR")
    if not os.path.isdir(directory):
        raise TaskError(f"--task {arg}: {directory} is not a directory; pass a directory holding task.yaml and the "
                        "task's files (or KNOWN=DIR)")
    if os.path.isfile(spec_file):
        with open(spec_file, encoding="utf-8") as f:
            try:
                own = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                raise TaskError(f"{spec_file}: not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
        if not isinstance(own, dict):
            raise TaskError(f"{spec_file}: holds {type(own).__name__}, not a mapping of task keys; see "
                            "docs/downstream.md")
        spec.update(own)
    elif not spec:
        raise TaskError(f"--task {arg}: {spec_file} does not exist; write one (kind, train, dev, text, label) or "
                        f"pass a known task as NAME=DIR ({', '.join(KNOWN)})")
    where = spec_file if os.path.isfile(spec_file) else f"the {name} layout (a {spec_file} would override it)"
    return from_spec(spec, directory, name or os.path.basename(os.path.normpath(directory)), where)


def load_all(args: list[str]) -> list[Task]:
    """The tasks of --task arguments, each named once (results are kept by name)."""
    tasks, named = [load(arg) for arg in args], {}
    for arg, task in zip(args, tasks):
        if task.name in named:
            raise TaskError(f"--task {named[task.name]} and --task {arg} are both named {task.name!r} (results are "
                            "kept by name); give one of them another `name:` in its task.yaml")
        named[task.name] = arg
    return tasks


def from_spec(spec: dict, directory: str, default_name: str, where: str) -> Task:
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise TaskError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; the keys are "
                        f"{', '.join(sorted(SPEC_KEYS))}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise TaskError(f"{where}: kind={kind!r}; set kind to one of {' | '.join(KINDS)}")
    for key in ("train", "dev"):
        if not spec.get(key):
            raise TaskError(f"{where}: no `{key}` file; name the {key} file (relative to {directory})")
    files = {key: os.path.join(directory, spec[key]) for key in ("train", "dev")}
    for key, path in files.items():
        if not os.path.isfile(path):
            raise TaskError(f"{path}: the task's {key} file does not exist; fix `{key}:` in {where} or add the file")
    read = {"classification": _read_labelled, "regression": _read_labelled, "tagging": _read_conll,
            "qa": _read_squad}[kind]
    train, skipped = read(files["train"], spec, kind)
    dev, skipped_dev = read(files["dev"], spec, kind)
    if spec.get("labels") is not None and not isinstance(spec["labels"], list):
        raise TaskError(f"{where}: labels={spec['labels']!r} is not a list; write labels: [a, b, ...]")
    for key, rows in (("train", train), ("dev", dev)):
        if not rows:
            raise TaskError(f"{files[key]}: no examples; the {key} file is empty")
    if any(isinstance(x, bool) for x in spec.get("labels") or []):
        raise TaskError(f"{where}: labels {spec['labels']} holds true/false: YAML reads unquoted yes, no, true, false "
                        "(and on, off) as booleans; quote them (labels: [\"no\", \"yes\"])")
    labels = [_class(x) for x in spec.get("labels", [])]
    if kind in ("classification", "tagging"):
        seen = sorted({e.label for e in train} if kind == "classification"  # (tags: dev's too, a rare type's I-)
                      else {t for e in train + dev for t in e.tags}, key=_natural)
        labels = labels or seen
        for key, rows in (("train", train), ("dev", dev)):
            for i, e in enumerate(rows):
                for value in ([e.label] if kind == "classification" else e.tags):
                    if value not in labels:
                        at = f"{files[key]}:{e.line}: the example" if e.line else f"{files[key]}: example {i + 1}"
                        raise TaskError(f"{at} has label {value!r}, which is not among {labels[:10]}; list it in "
                                        f"`labels:` of {where} or fix the example")
    if kind == "classification" and len(labels) < 2:
        raise TaskError(f"{where}: one class ({', '.join(labels)}) among the train file's labels: a classifier needs "
                        "two at least; add examples of another class, or list the classes in `labels:`")
    metrics = spec.get("metrics") or DEFAULT_METRICS[kind]
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    from downstream import metrics as M

    bad = [m for m in metrics if m not in M.FOR_KIND[kind]]
    if bad:
        raise TaskError(f"{where}: metric(s) {', '.join(bad)} do not apply to {kind}; choose from "
                        f"{', '.join(M.FOR_KIND[kind])}")
    cloze = spec.get("cloze")
    if cloze is not None:
        _check_cloze(cloze, labels, kind, where)
    return Task(spec.get("name", default_name), kind, train, dev, labels, metrics, cloze,
                {"train": skipped, "dev": skipped_dev} if skipped or skipped_dev else {})


def digest(task: Task) -> str:
    """What identifies a task's examples and labels, wherever its files are: a re-run on changed files runs again."""
    data = [task.kind, task.labels, task.metrics, task.cloze, [asdict(e) for e in task.train + task.dev]]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _natural(x: str):
    try:
        return 0, float(x), ""
    except ValueError:
        return 1, 0.0, x


def _check_cloze(cloze, labels: list[str], kind: str, where: str) -> None:
    if kind != "classification":
        raise TaskError(f"{where}: `cloze` applies to classification tasks, not {kind}; remove it")
    if not isinstance(cloze, dict) or "{mask}" not in str(cloze.get("pattern", "")):
        raise TaskError(f"{where}: `cloze` needs a pattern with {{mask}} and {{text}} (or {{text_a}}, {{text_b}}) "
                        "and a verbalizer {label: word}")
    try:
        str(cloze["pattern"]).format(text="", text_a="", text_b="", mask="")
    except (KeyError, IndexError, ValueError) as e:
        raise TaskError(f"{where}: cloze.pattern {cloze['pattern']!r} names a field other than {{text}}, {{text_a}}, "
                        f"{{text_b}}, {{mask}} ({type(e).__name__}: {e}); use those (write {{{{ }}}} for a brace)") \
            from None
    verbalizer = {str(k): str(v) for k, v in (cloze.get("verbalizer") or {}).items()}
    missing = [lab for lab in labels if lab not in verbalizer]
    if missing:
        raise TaskError(f"{where}: cloze.verbalizer has no word for label(s) {', '.join(missing)}; give every label "
                        "a word")
    cloze["verbalizer"] = verbalizer


def _format(path: str, spec: dict) -> str:
    fmt = spec.get("format") or ("jsonl" if path.endswith((".jsonl", ".json")) else "tsv")
    if fmt not in ("tsv", "jsonl"):
        raise TaskError(f"{path}: format={fmt!r} for a classification or regression task; use tsv or jsonl")
    return fmt


def _rows(path: str, spec: dict):
    """(line number, {field: value}) of a TSV (header row, or `columns:`) or JSONL file."""
    fmt = _format(path, spec)
    lines = text_of(path).split("\n")
    if fmt == "jsonl":
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}:{n}: not a JSON object ({e.msg}); write one JSON object per line") from None
            if not isinstance(row, dict):
                raise TaskError(f"{path}:{n}: a JSON {type(row).__name__}, not an object; write one object per line")
            yield n, row
        return
    header = spec.get("columns")
    start = 0
    if header is None and spec.get("header", True):
        header, start = lines[0].rstrip("\r").split("\t"), 1
    elif header is not None and lines[0].rstrip("\r").split("\t") == list(header):
        start = 1  # (a header row as well as `columns:`: not an example)
    if not header:
        raise TaskError(f"{path}: a TSV without a header row; add one, or list the columns in `columns:`")
    twice = sorted({c for c in header if list(header).count(c) > 1})
    if twice:
        raise TaskError(f"{path}:1: the columns name {', '.join(twice)} twice; give each column a name of its own")
    for n, line in enumerate(lines[start:], start + 1):
        line = line.rstrip("\r")
        if not line:
            continue
        values = line.split("\t")
        if len(values) != len(header):
            raise TaskError(f"{path}:{n}: {len(values)} tab-separated fields where the header has {len(header)} "
                            f"({', '.join(header)}); fix the line (tabs inside a text are not allowed)")
        yield n, dict(zip(header, values))


def _read_labelled(path: str, spec: dict, kind: str) -> tuple[list[Example], int]:
    text, label = spec.get("text"), spec.get("label", "label")
    text = [text] if isinstance(text, str) else text
    if not isinstance(text, list) or not all(isinstance(t, str) for t in text):
        raise TaskError(f"{path}: text={spec.get('text')!r} in task.yaml; name the field(s) holding the text, e.g. "
                        "text: sentence or text: [sentence1, sentence2]")
    if not text or len(text) > 2:
        raise TaskError(f"{path}: `text` names {len(text or [])} fields; name one (single texts) or two (pairs) in "
                        "task.yaml")
    out = []
    for n, row in _rows(path, spec):
        for key in (*text, label):
            if key not in row:
                raise TaskError(f"{path}:{n}: no field {key!r} (it has {', '.join(map(str, row))}); fix the line or "
                                "name the right fields in task.yaml (`text`, `label`)")
        value = row[label]
        if kind == "regression":
            try:
                value = float(value)
            except (TypeError, ValueError):
                value = math.nan
            if not math.isfinite(value):
                raise TaskError(f"{path}:{n}: {label}={row[label]!r} is not a finite number; a regression task's "
                                "label is a score") from None
        elif value is None:
            raise TaskError(f"{path}:{n}: {label} is null; give every example its label")
        else:
            value = _class(value)
        empty = [k for k in text if row[k] is None]
        if empty:
            raise TaskError(f"{path}:{n}: {empty[0]} is null; give every example its text")
        out.append(Example(texts=tuple(str(row[k]) for k in text), label=value, line=n))
    return out, 0


def _class(value) -> str:
    """A class label's name: JSON's 1 and 1.0 are one class ("1")."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _read_conll(path: str, spec: dict, kind: str) -> tuple[list[Example], int]:
    tok_col, tag_col = spec.get("token_column", 0), spec.get("tag_column", -1)
    for key, col in (("token_column", tok_col), ("tag_column", tag_col)):
        if not isinstance(col, int) or isinstance(col, bool):
            raise TaskError(f"{path}: {key}={col!r} in task.yaml; give the column's number (0: the first, -1: the "
                            "last)")
    out, words, tags = [], [], []
    first = 1
    for n, line in enumerate(text_of(path).split("\n"), 1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                out.append(Example(words=words, tags=tags, line=first))
            words, tags, first = [], [], n + 1
            continue
        if len(parts) < 2:
            raise TaskError(f"{path}:{n}: one column ({line.strip()!r}); a CoNLL line is a token and its tag "
                            "separated by whitespace, sentences by a blank line")
        if max(tok_col, tag_col) >= len(parts) or min(tok_col, tag_col) < -len(parts):
            raise TaskError(f"{path}:{n}: {len(parts)} columns, no token_column={tok_col} and tag_column="
                            f"{tag_col}; fix the line or the columns in task.yaml")
        tag = parts[tag_col]
        if tag != "O" and tag[:2] not in ("B-", "I-", "E-", "S-"):
            raise TaskError(f"{path}:{n}: tag {tag!r} is not BIO (O, B-TYPE, I-TYPE); fix the tag or "
                            "`tag_column` in task.yaml")
        words.append(parts[tok_col])
        tags.append(tag)
    if words:
        out.append(Example(words=words, tags=tags, line=first))
    return out, 0


def _read_squad(path: str, spec: dict, kind: str) -> tuple[list[Example], int]:
    raw = text_of(path)
    shape = (f"{path}: not SQuAD's shape; a SQuAD file is {{\"data\": [{{\"paragraphs\": [{{\"context\": ..., "
             "\"qas\": [{\"id\": ..., \"question\": ..., \"answers\": [{\"text\": ..., \"answer_start\": ...}]}]}]}]}")
    try:
        data = json.loads(raw)["data"]
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); fix the file") from None
    except (KeyError, TypeError):
        raise TaskError(shape) from None
    listed = lambda x, key: isinstance(x, dict) and isinstance(x.get(key, []), list)  # noqa: E731
    if not isinstance(data, list) or not all(listed(a, "paragraphs") and all(listed(p, "qas") for p in a.get(
            "paragraphs", [])) for a in data):
        raise TaskError(shape)
    out, skipped = [], 0
    for article in data:
        for para in article.get("paragraphs", []):
            context = para.get("context")
            for qa in para.get("qas", []):
                qid = str(qa.get("id", "")) if isinstance(qa, dict) else ""
                where = f"{path}:{_line_of(raw, qid)}"
                if not isinstance(context, str) or not isinstance(qa, dict) or not isinstance(qa.get("question"), str):
                    raise TaskError(f"{where}: question {qid!r} lacks a context or a question; each paragraph has "
                                    "\"context\" and each of its \"qas\" a \"question\"")
                if not isinstance(qa.get("answers"), list) or not all(isinstance(a, dict) for a in qa["answers"]):
                    raise TaskError(f"{where}: question {qid!r} has no \"answers\" list of {{\"text\", "
                                    "\"answer_start\"}; give it one (SQuAD v2's unanswerable questions: \"answers\": [])")
                answers = [(a.get("text"), a.get("answer_start", -1)) for a in qa["answers"]]
                if not answers:
                    skipped += 1  # SQuAD v2's unanswerable questions
                    continue
                for text, start in answers:
                    if not isinstance(text, str) or not text.strip():
                        raise TaskError(f"{where}: question {qid!r}: answer text {text!r} is not a text; give each "
                                        "answer its words")
                    if not isinstance(start, int) or isinstance(start, bool):
                        raise TaskError(f"{where}: question {qid!r}: answer_start={start!r} is not a whole number; "
                                        "give the answer's character offset in its context")
                    if context[start:start + len(text)] != text:
                        raise TaskError(f"{where}: question {qid!r}: answer {text!r} is not at answer_start={start} "
                                        f"of its context; fix answer_start (the character offset of the answer)")
                out.append(Example(question=qa["question"], context=context, answers=answers, id=qid))
    return out, skipped


def text_of(path: str) -> str:
    """A task file's text (UTF-8, a byte-order mark dropped), or one line saying it is not UTF-8."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except UnicodeDecodeError as e:
        with open(path, "rb") as f:
            line = f.read()[:e.start].count(b"\n") + 1
        raise TaskError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x}); save the file as UTF-8") \
            from None


def _line_of(raw: str, needle: str) -> int:
    at = raw.find(json.dumps(needle)) if needle else -1
    return raw.count("\n", 0, at) + 1 if at >= 0 else 1
