"""ELMo's samples: packed windows of a word dataset (`data_prep words`: each sentence `<S> words </S>`) with each
word's character ids, as bilm-tf and AllenNLP encode them.

A word's ids: begin-of-word, its UTF-8 bytes (the first 48), end-of-word, then padding to 50, each id + 1 (AllenNLP's
offset: 0 is a padding word); `<S>` and `</S>` are begin- and end-of-sentence characters between the word marks.
Sample: `words` (seq_len + 1 word ids: the forward LM predicts words 1.., the backward LM words ..-2) and `chars`
(their character ids [seq_len + 1, 50]).
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from pretrain.data.gpt import GPTDataset

MAX_CHARS = 50
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260  # before the + 1
SENTENCE_MARKS = {"<S>": BOS_CHAR, "</S>": EOS_CHAR}


def char_ids(word: str) -> np.ndarray:
    """The 50 character ids of `word` (+ 1: bilm-tf's and AllenNLP's model inputs)."""
    out = np.full(MAX_CHARS, PAD_CHAR, dtype=np.int64)
    body = [SENTENCE_MARKS[word]] if word in SENTENCE_MARKS else list(word.encode("utf-8", "ignore")[:MAX_CHARS - 2])
    out[0], out[1:len(body) + 1], out[len(body) + 1] = BOW_CHAR, body, EOW_CHAR
    return out + 1


def char_table(words: list[str]) -> np.ndarray:
    """The character ids of every word of a vocabulary, [len(words), 50] int16."""
    return np.stack([char_ids(w) for w in words]).astype(np.int16) if words else np.zeros((0, MAX_CHARS), np.int16)


class ELMoWindows(GPTDataset):
    """Packed windows of seq_len + 1 words (pretrain/data/gpt.py) with their character ids."""

    @cached_property
    def chars(self) -> np.ndarray:
        tok = self.corpus.tokenizer()
        return char_table([tok.piece(i) for i in range(tok.vocab_size)])

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        out = super().sample(epoch, index)
        words = np.concatenate([out.pop("input_ids"), out.pop("labels")[-1:]])
        return {"words": words, "chars": self.chars[words].astype(np.int64), **out}
