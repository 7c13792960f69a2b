"""ELMo under a small task model, as the ELMo paper uses it (Peters et al. 2018, section 3.3): the biLM frozen, its
layers mixed by a learned scalar mix (pretrain/elmo_vectors.py), the mix fed to a task model trained from scratch.

Each biLM layer is standardised per dimension with its mean and standard deviation over the training texts'
words (`fit_inputs`; the layers are frozen, so these are constants) before the mix: a barely trained or fresh biLM
gives every word nearly the same vector (cosines of 0.9-0.99), and the small differences that remain are what a task
model must read; unstandardised, it does not leave the majority class in a few hundred steps.

The biLM is frozen and without dropout, so each text's layers are computed once per run and kept (`_layers`, up to
`CACHE_BYTES`), as bilm-tf's users dump them once: the epochs and the evaluations after the first read them back.

The task model here is small and the same for every task kind: a one-layer BiLSTM over the ELMo vectors, then
- classification / regression: max-pooled states; a pair's two vectors u, v as [u; v; |u - v|; u * v] (InferSent);
- tagging: a linear layer per word;
- QA: the question's pooled vector joined to every context word, a second BiLSTM, start and end per word
  (a reduced BiDAF: no attention flow).
Texts are cut into words as data_prep cuts them (Latin runs and punctuation; jieba for Chinese); long texts keep
their first quarter and last words (`max_len` words), a QA context its first `max_len` words.
"""
from __future__ import annotations

import torch
from torch import nn

from downstream.encode import IGNORE, best_span

_SEGMENTER = None
CACHE_BYTES = 1 << 30  # the frozen biLM's layers kept per run (a text's layers past this are computed each time)


def words_of(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The words of `text` and their character spans (data_prep.text's word cuts; jieba's for Chinese)."""
    from data_prep import text as T

    global _SEGMENTER
    segmenter = None
    if T.has_cjk(text):
        if _SEGMENTER is None:
            from data_prep.chinese import Segmenter

            _SEGMENTER = Segmenter()
        segmenter = _SEGMENTER
    starts, ends = T.word_spans(text, segmenter)
    spans = list(zip(starts.tolist(), ends.tolist()))
    return [text[a:b] for a, b in spans], spans


class ELMoInputs:
    """Examples -> rows of words for `ELMoTask` (the same row and batch shapes `encode.Encoder` gives)."""

    def __init__(self, max_len: int, head_frac: float = 0.25, max_answer: int = 30):
        self.max_len, self.head_frac, self.max_answer = max_len, head_frac, max_answer

    def _cut(self, words: list[str]) -> list[str]:
        if len(words) <= self.max_len:
            return words
        head = int(self.max_len * self.head_frac)
        return words[:head] + words[len(words) - (self.max_len - head):]

    def texts(self, texts: tuple[str, ...]) -> dict:
        return {"words": [self._cut(words_of(t)[0] or ["<UNK>"]) for t in texts]}

    def words(self, words: list[str], tags: list[str], labels: list[str]) -> dict:
        kept = words[:self.max_len]
        return {"words": [kept], "labels": [labels.index(t) for t in tags[:len(kept)]],
                "word_ids": list(range(len(kept)))}

    def qa(self, question: str, context: str, answers: list[tuple[str, int]]) -> list[dict]:
        words, spans = words_of(context)
        words, spans = words[:self.max_len], spans[:self.max_len]
        start = end = IGNORE
        if answers:
            a, b = answers[0][1], answers[0][1] + len(answers[0][0])
            inside = [i for i, (x, y) in enumerate(spans) if y > a and x < b]
            if inside:
                start, end = inside[0], inside[-1]
        q = self._cut(words_of(question)[0] or ["<UNK>"])
        return [{"words": [q, words or ["<UNK>"]], "start": start, "end": end, "spans": spans}]

    def best_span(self, windows: list[dict], starts, ends, context: str) -> str:
        return best_span(windows, starts, ends, context, self.max_answer)

    def pad(self, rows: list[dict], keys=()) -> dict:
        out = {"words": [r["words"] for r in rows]}
        if "labels" in keys:
            n = max(len(r["labels"]) for r in rows)
            out["labels"] = torch.tensor([r["labels"] + [IGNORE] * (n - len(r["labels"])) for r in rows])
        return out


class ELMoTask(nn.Module):
    """A frozen ELMo (`pretrain.elmo_vectors.ELMoEmbedder`) and the task model described above."""

    def __init__(self, embedder, kind: str, labels: int, pair: bool, hidden: int = 128):
        super().__init__()
        self.elmo, self.kind, self.pair = embedder, kind, pair
        with torch.no_grad():
            layers, _ = embedder.layers([["a"]])
        width = layers[0].shape[-1]
        self.cache: dict[tuple[str, ...], torch.Tensor] = {}  # a text's words -> its layers [layers, words, width]
        self.cached_bytes = 0
        self.register_buffer("center", torch.zeros(len(layers), width))
        self.register_buffer("scale", torch.ones(len(layers), width))
        self.lstm = nn.LSTM(width, hidden, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(0.1)
        if kind == "qa":
            self.lstm2 = nn.LSTM(4 * hidden, hidden, batch_first=True, bidirectional=True)
            self.out = nn.Linear(2 * hidden, 2)
        elif kind == "tagging":
            self.out = nn.Linear(2 * hidden, labels)
        else:
            self.out = nn.Sequential(nn.Linear((8 if pair else 2) * hidden, hidden), nn.ReLU(),
                                     nn.Linear(hidden, labels))

    def train(self, mode: bool = True):
        super().train(mode)
        self.elmo.bilm.eval()  # frozen: no dropout in the biLM
        return self

    @staticmethod
    def _run(lstm: nn.LSTM, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A BiLSTM over the real words only (packed: the backward direction starts at each text's last word)."""
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        lengths = mask.sum(1).clamp(min=1).cpu()
        out, _ = lstm(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]

    @torch.no_grad()
    def _layers(self, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The frozen biLM's layers of `sentences` [layers, batch, words, width] (zero past a text's end) and the mask
        of real words; the texts not seen before are run through the biLM together and kept."""
        keys = [tuple(s) for s in sentences]
        found = {k: self.cache[k] for k in keys if k in self.cache}
        new = [k for k in dict.fromkeys(keys) if k not in found]
        if new:
            layers, mask = self.elmo.layers([list(k) for k in new])
            for k, x, n in zip(new, torch.stack(layers, 1), mask.sum(1).tolist()):
                found[k] = x[:, :n].clone()
                if self.cached_bytes < CACHE_BYTES:
                    self.cache[k] = found[k]
                    self.cached_bytes += found[k].nbytes
        n = max(len(k) for k in keys)
        first = found[keys[0]]
        out = first.new_zeros(first.shape[0], len(keys), n, first.shape[-1])
        for i, k in enumerate(keys):
            out[:, i, :len(k)] = found[k]
        lengths = torch.tensor([len(k) for k in keys], device=out.device)
        return out, torch.arange(n, device=out.device)[None] < lengths[:, None]

    def _encode(self, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        layers, mask = self._layers(sentences)
        layers = (layers - self.center[:, None, None]) / self.scale[:, None, None]
        mixed = self.elmo.mixes[0](list(layers), mask)
        return self._run(self.lstm, self.dropout(mixed), mask), mask

    @torch.no_grad()
    def fit_inputs(self, batches) -> None:
        """Each layer's per-dimension mean and standard deviation over the words of `batches` (model inputs: every
        text of every row), in float64."""
        total, sums, squares = 0, 0.0, 0.0
        for b in batches:
            layers, mask = self._layers([text for row in b["words"] for text in row])
            x = layers[:, mask].double()  # [layers, words, width]
            total, sums, squares = total + x.shape[1], sums + x.sum(1), squares + (x * x).sum(1)
        mean = sums / total
        self.center.copy_(mean)
        self.scale.copy_((squares / total - mean * mean).clamp_min(0).sqrt().clamp_min(1e-6))

    @staticmethod
    def _pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return h.masked_fill(~mask[..., None], float("-inf")).max(1).values

    def forward(self, inputs: dict):
        rows = inputs["words"]
        if self.kind == "tagging":
            h, _ = self._encode([r[0] for r in rows])
            return self.out(self.dropout(h))
        if self.kind == "qa":
            q, qm = self._encode([r[0] for r in rows])
            c, cm = self._encode([r[1] for r in rows])
            joined = torch.cat([c, self._pool(q, qm)[:, None].expand_as(c)], -1)
            h = self._run(self.lstm2, self.dropout(joined), cm)
            start, end = self.out(h).unbind(-1)
            return start.masked_fill(~cm, -1e4), end.masked_fill(~cm, -1e4)
        u = self._pool(*self._encode([r[0] for r in rows]))
        if self.pair:
            v = self._pool(*self._encode([r[1] for r in rows]))
            u = torch.cat([u, v, (u - v).abs(), u * v], -1)
        return self.out(self.dropout(u))


def elmo_model(path: str, kind: str, labels: int, pair: bool, pretrained: bool = True) -> ELMoTask:
    """The ELMo at `path` under a task model; `pretrained=False`: its biLM re-initialised (the baseline)."""
    from pretrain.elmo_vectors import ELMoEmbedder

    embedder = ELMoEmbedder.load(path)
    if not pretrained:  # the same biLM as ptm initialises it before pretraining
        from pretrain.models.char_bilm import ELMo
        from pretrain.parallel import mcore

        embedder = ELMoEmbedder(ELMo(embedder.bilm.cfg, tp=mcore.OneRank()))
    return ELMoTask(embedder, kind, labels, pair)
