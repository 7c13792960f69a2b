"""Chinese word boundaries: jieba's dictionary and its most probable route, cut as jieba-rs cuts without HMM
(rjieba's `cut(text, False)`; tests/test_text.py holds the two equal), in the compiled structure pass: a word-start
mask over a chunk's code points, no Python string per word."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from data_prep import text as T

ENTITY_FREQ = 10**6  # an added entity outweighs any split of it


def dictionary_path() -> Path:
    """jieba's dictionary (dict.txt of the jieba package: word, frequency, tag per line)."""
    spec = importlib.util.find_spec("jieba")
    path = Path(spec.origin).parent / "dict.txt" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ImportError("jieba's dictionary (dict.txt of the jieba package) is missing: pip install jieba, "
                          "or run bash scripts/setup.sh")
    return path


class Segmenter:
    """jieba's words of text, with `words` added to the dictionary (as jieba's add_word, at ENTITY_FREQ)."""

    def __init__(self, words: list[str] = (), path: Path | None = None):
        text = Path(path or dictionary_path()).read_text(encoding="utf-8")
        words = [w for w in words if w]
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        pool = T.code_points(text + "".join(words))
        starts, lens, freqs = T._structure.dictionary_entries(pool[:len(text)])
        self._dict = T._structure.Dictionary(  # the words whole, spaces and all, as add_word takes them
            pool, np.concatenate([starts, len(text) + np.cumsum(lengths) - lengths]), np.concatenate([lens, lengths]),
            np.concatenate([freqs, np.full(len(words), ENTITY_FREQ, dtype=np.int64)]))

    def starts(self, codes: np.ndarray, ideographs_only: bool = True) -> np.ndarray:
        """uint8 per code point, 1 where a word starts. `ideographs_only`: runs of ASCII letters, digits and
        +#&._%- without a CJK ideograph are not cut (only their first character is marked)."""
        return self._dict.starts(codes, ideographs_only)

    def words(self, text: str) -> list[str]:
        """The words, as rjieba's cut(text, False) gives them."""
        bounds = np.flatnonzero(self.starts(T.code_points(text), False)).tolist() + [len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]
