"""Examples to model inputs with the export's own tokenizer (its special-token template, padding side and pad id).

Long texts keep their head and tail (Sun et al. 2019, "How to Fine-Tune BERT for Text Classification": the first
quarter of the budget from the start, the rest from the end); a pair shortens its longer text first. Tagging labels
each word's first piece (the others are ignored by the loss and the metric); words past the length limit are
predicted O. QA slides windows over the context (`stride` tokens overlapping, SQuAD's recipe) and answers with the
best-scoring span of at most `max_answer` tokens over all windows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100


@dataclass
class Encoder:
    tok: object  # a transformers fast tokenizer
    max_len: int
    head_frac: float = 0.25
    stride: int = 32
    max_answer: int = 30
    takes: tuple = ()  # the inputs the model accepts (empty: all)

    @property
    def backend(self):
        return self.tok.backend_tokenizer

    @property
    def pads_left(self) -> bool:
        """A batch's rows are padded before their tokens (XLNet's: its last token, <cls>, is what it classifies)."""
        return self.tok.padding_side == "left"

    @property
    def pad_id(self) -> int:
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.tok.eos_token_id or 0)

    @property
    def _template(self) -> bool:
        """The tokenizer puts special tokens around a pair (GPT's add none)."""
        post = self.backend.post_processor
        return post is not None and post.num_special_tokens_to_add(True) > 0

    def _sep(self):
        return self.tok.sep_token_id if self.tok.sep_token_id is not None else self.tok.eos_token_id

    def _specials(self, pair: bool) -> int:
        if self._template:
            return self.backend.post_processor.num_special_tokens_to_add(pair)
        return int(pair and self._sep() is not None)

    def _pieces(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """A text's token ids and their character spans, without special tokens or truncation."""
        out = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return out["input_ids"], out["offset_mapping"]

    def _head_tail(self, text: str, offsets: list[tuple[int, int]], n: int) -> str:
        """`text` cut to its first quarter of `n` tokens and its last tokens (offsets: its tokens' characters)."""
        if len(offsets) <= n:
            return text
        keep = max(int(n * self.head_frac), 1)
        head = text[:offsets[keep - 1][1]]
        tail = text[offsets[len(offsets) - (n - keep)][0]:] if n > keep else ""
        if len(self._pieces(head)[0]) > keep or len(self._pieces(tail)[0]) > n - keep:
            # pieces of byte fallback all span their whole run of characters, so cutting at pieces cut nothing (and
            # the text came back twice): cut characters
            head, tail = self._fit(text, keep, True), self._fit(text, n - keep, False)
            tail = tail[max(len(head) + len(tail) - len(text), 0):]
        return head + " " + tail if tail else head

    def _fit(self, text: str, n: int, head: bool) -> str:
        """The longest head (or tail) of `text`'s characters that is at most n tokens."""
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self._pieces(text[:mid] if head else text[len(text) - mid:])[0]) <= n:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo] if head else text[len(text) - lo:]

    def texts(self, texts: tuple[str, ...]) -> dict:
        """One or two texts -> {input_ids, token_type_ids}, head + tail truncated to max_len (the template's special
        tokens around them; without one, as GPT's, a separator token between two texts where the tokenizer has
        one)."""
        encs = [self._pieces(t) for t in texts]
        budget = self.max_len - self._specials(len(texts) == 2)
        lengths = [len(ids) for ids, _ in encs]
        for _ in range(4):  # a text cut and read again can gain a token where head and tail meet: cut again
            while sum(lengths) > budget:  # the longer text gives up tokens first
                longer = lengths.index(max(lengths))
                lengths[longer] -= max(min(sum(lengths) - budget, lengths[longer] - min(lengths)), 1)
            cut = [self._head_tail(t, offsets, n) for t, (_, offsets), n in zip(texts, encs, lengths)]
            ids = [self._pieces(t)[0] for t in cut]
            if sum(map(len, ids)) <= budget:
                break
            budget -= sum(map(len, ids)) - budget
        if not self._template:
            sep = [self._sep()] if len(ids) == 2 and self._sep() is not None else []
            joined = (ids[0] + sep + ids[1] if len(ids) == 2 else ids[0])[:self.max_len] or [self.pad_id]  # (empty
            # texts: one token to read, not none)
            return {"input_ids": joined, "token_type_ids": [0] * len(joined)}
        out = self.tok(*cut, truncation=True, max_length=self.max_len)
        return {"input_ids": out["input_ids"], "token_type_ids": out.get("token_type_ids", [0] * len(out["input_ids"]))}

    def words(self, words: list[str], tags: list[str], labels: list[str]) -> dict:
        """A sentence of words -> inputs with each word's first piece labelled (`labels`: the tag set) and
        `word_ids` (the word whose first piece each position is, -1 elsewhere)."""
        out = self.tok(words, is_split_into_words=True, truncation=True, max_length=self.max_len)
        seen, ids, word_ids = set(), [], []
        for w in out.word_ids():
            first = w is not None and w not in seen
            seen.add(w)
            ids.append(labels.index(tags[w]) if first else IGNORE)
            word_ids.append(w if first else -1)
        return {"input_ids": out["input_ids"], "token_type_ids": out.get("token_type_ids", [0] * len(ids)),
                "labels": ids, "word_ids": word_ids}

    def qa(self, question: str, context: str, answers: list[tuple[str, int]]) -> list[dict]:
        """The windows of one example (transformers' run_qa recipe): inputs, the answer's token positions (those of
        the classification token, as run_qa's: BERT's first, XLNet's last, when it is not inside the window), and each
        position's character span in the context (None outside it)."""
        question_first = self.tok.padding_side == "right"  # XLNet pads left and reads the context first
        question = self._head_tail(question, self._pieces(question)[1], max(self.max_len // 4, 1))  # leaves room
        room = self.max_len - self._specials(True) - len(self._pieces(question)[0])
        pair = (question, context) if question_first else (context, question)
        out = self.tok(*pair, truncation="only_second" if question_first else "only_first", max_length=self.max_len,
                       stride=min(self.stride, max(room // 2, 1) - 1) if room > 2 else 0,
                       return_overflowing_tokens=True, return_offsets_mapping=True)
        ctx_seq = 1 if question_first else 0
        a_start, a_end = (answers[0][1], answers[0][1] + len(answers[0][0])) if answers else (-1, -1)
        windows = []
        for k, ids in enumerate(out["input_ids"]):
            spans = [tuple(off) if s == ctx_seq else None
                     for off, s in zip(out["offset_mapping"][k], out.sequence_ids(k))]
            inside = [i for i, sp in enumerate(spans) if sp is not None]
            s_pos = e_pos = ids.index(self.tok.cls_token_id) if self.tok.cls_token_id in ids else 0
            if inside and spans[inside[0]][0] <= a_start and spans[inside[-1]][1] >= a_end:
                s_pos = next(i for i in inside if spans[i][1] > a_start)
                e_pos = next(i for i in reversed(inside) if spans[i][0] < a_end)
            types = out["token_type_ids"][k] if "token_type_ids" in out else [0] * len(ids)
            windows.append({"input_ids": ids, "token_type_ids": types, "start": s_pos, "end": e_pos, "spans": spans})
        return windows

    def best_span(self, windows: list[dict], starts: list[torch.Tensor], ends: list[torch.Tensor], context: str) -> str:
        return best_span(windows, starts, ends, context, self.max_answer)

    def pad(self, rows: list[dict], keys=("input_ids", "token_type_ids")) -> dict[str, torch.Tensor]:
        """A batch of rows padded to its longest on the tokenizer's side; attention_mask (and `real`, the same for a
        model that reads no mask) marks real tokens."""
        n = max(len(r["input_ids"]) for r in rows)
        left = self.pads_left
        out = {}
        for key in (*keys, "attention_mask", "real"):
            fill = {"input_ids": self.pad_id, "labels": IGNORE}.get(key, 0)
            batch = []
            for r in rows:
                values = [1] * len(r["input_ids"]) if key in ("attention_mask", "real") else list(r[key])
                pad = [fill] * (n - len(values))
                batch.append(pad + values if left else values + pad)
            out[key] = torch.tensor(batch)
        return out


def best_span(windows: list[dict], starts: list[torch.Tensor], ends: list[torch.Tensor], context: str,
              max_answer: int) -> str:
    """The context text of the best start <= end pair (at most `max_answer` units) over an example's windows; a
    window's `spans` are the character spans of its units (None: not in the context)."""
    best, text = float("-inf"), ""
    for w, s, e in zip(windows, starts, ends):
        n = len(w["spans"])
        if n == 0:
            continue
        ok = torch.tensor([sp is not None for sp in w["spans"]], device=s.device)
        s, e = s[:n].float().masked_fill(~ok, float("-inf")), e[:n].float().masked_fill(~ok, float("-inf"))
        band = torch.ones(n, n, dtype=torch.bool, device=s.device).triu().tril(max_answer - 1)
        score = (s[:, None] + e[None, :]).masked_fill(~band, float("-inf"))
        i, j = divmod(int(score.argmax()), n)
        if score[i, j] > best:
            best, text = float(score[i, j]), context[w["spans"][i][0]:w["spans"][j][1]]
    return text
