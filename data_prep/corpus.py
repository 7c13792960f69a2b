"""The embedded default corpus: real, offline text that every ptm machine has after set-up.

English: the docstrings of Python's standard library (parsed with `ast`, nothing is imported).
Chinese: Debian's fortunes-zh (modern prose, Tang and Song poems), installed by scripts/setup.sh.
Nothing is copied into the repository; the text is read from the machine at run time.
"""
from __future__ import annotations

import ast
import json
import os
import re
import sysconfig

from data_prep import PrepError

FORTUNES_ZH = "/usr/share/games/fortunes"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _is_prose(text: str) -> bool:
    """Mostly letters and spaces: leaves out docstrings that are tables, diagrams or code listings."""
    return sum(c.isalpha() or c.isspace() for c in text) >= 0.75 * len(text)


def stdlib_docstrings(min_chars: int = 200):
    """(qualified name, docstring) for modules, classes and functions of the standard library."""
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "site-packages", "idle_test",
                                                              "__pycache__", "lib2to3"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            try:
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= min_chars and _is_prose(doc):
                        yield f"{module}.{getattr(node, 'name', '')}".rstrip("."), doc


def fortunes_zh():
    """(source, text) for each fortune of Debian's fortunes-zh."""
    files = ("chinese", "tang300", "song100")
    if not all(os.path.isfile(os.path.join(FORTUNES_ZH, f)) for f in files):
        raise PrepError(f"the Chinese default corpus needs Debian's fortunes-zh in {FORTUNES_ZH}: "
                        "apt-get install fortunes-zh (scripts/setup.sh does this)")
    for f in files:
        with open(os.path.join(FORTUNES_ZH, f), encoding="utf-8") as fh:
            for i, block in enumerate(fh.read().split("\n%\n")):
                text = _ANSI.sub("", block).strip()
                if text and _is_prose(text):
                    yield f"fortunes-zh/{f}#{i}", text


def write_default_corpus(out: str) -> dict[str, int]:
    """Write OUT/en.jsonl and OUT/zh.jsonl ({"text", "source"} per line); returns documents per file."""
    os.makedirs(out, exist_ok=True)
    counts = {}
    for name, docs in (("en.jsonl", stdlib_docstrings()), ("zh.jsonl", fortunes_zh())):
        path = os.path.join(out, name)
        tmp = f"{path}.tmp{os.getpid()}"
        n = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for source, text in docs:
                f.write(json.dumps({"text": text, "source": source}, ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
        counts[path] = n
    return counts
