"""Deterministic training samples over a ptm-arrow corpus, and batches for the trainer.

Every sample is a pure function of (corpus, config, seed, epoch, index): its randomness comes from
`np.random.default_rng([seed, epoch, index])`, the epoch's order from `default_rng([seed, epoch])`.
A run resumed at any sample sees the same samples, and data-parallel rank r of n takes positions
r, r + n, r + 2n, ... of the epoch's order, so no two ranks see the same sample.

    BERT (mlm_nsp, mlm_sop, mlm): [CLS] A [SEP] B [SEP] from stored sentence boundaries, dynamic masking
    GPT-2 (clm): documents concatenated with the end-of-document token, cut into seq_len + 1 windows
"""
from __future__ import annotations

import numpy as np
import torch

from data_prep.dataset import Corpus

_SALT_SPLIT, _SALT_ORDER = 0x5EED, 0x0DE


def split_documents(corpus: Corpus, valid_fraction: float, seed: int, split: str) -> np.ndarray:
    """Indices of the documents in `split` (train | valid): a seeded, per-document coin."""
    valid = np.random.default_rng([seed, _SALT_SPLIT]).random(len(corpus)) < valid_fraction
    if valid_fraction > 0 and not valid.any():
        valid[0] = True  # a tiny corpus still gets a validation document
    return np.flatnonzero(valid if split == "valid" else ~valid)


class GPTSamples:
    """Windows of seq_len + 1 tokens over the documents (in order) joined by the end-of-document token."""

    def __init__(self, corpus: Corpus, docs: np.ndarray, seq_len: int):
        self.corpus, self.docs, self.seq_len = corpus, docs, seq_len
        lengths = corpus.doc_lengths()[docs] + 1  # + eod
        self.ends = np.cumsum(lengths)
        self.eod = corpus.special_ids["eod"]
        self.count = max(int((self.ends[-1] - 1) // seq_len), 0) if len(docs) else 0

    def __len__(self) -> int:
        return self.count

    def __call__(self, index: int, rng: np.random.Generator, position: int = 0) -> dict:
        start = index * self.seq_len
        stop = start + self.seq_len + 1
        first = int(np.searchsorted(self.ends, start, side="right"))
        parts, at = [], start
        for d in range(first, len(self.docs)):
            begin = self.ends[d - 1] if d else 0
            doc = np.append(self.corpus.tokens(int(self.docs[d])), self.eod)
            parts.append(doc[at - begin: stop - begin])
            at = self.ends[d]
            if at >= stop:
                break
        window = np.concatenate(parts).astype(np.int64)
        return {"input_ids": window[:-1], "labels": window[1:]}


class BertSamples:
    """Sentence-pair samples: each document's sentences are grouped into chunks of about seq_len tokens
    (shorter with probability short_seq_prob); a chunk is split into A and B at a random sentence.
    mlm_nsp: B is replaced by sentences of a random other document with probability 1/2 (label 1);
    mlm_sop: A and B are swapped with probability 1/2 (label 1); mlm: A alone, no sentence label."""

    def __init__(self, corpus: Corpus, docs: np.ndarray, cfg, seed: int):
        self.corpus, self.cfg = corpus, cfg
        self.special = corpus.special_ids
        self.max_tokens = cfg.seq_len - 3
        rng = np.random.default_rng([seed, 0xB347])
        chunks = []
        for d in docs.tolist():
            starts = corpus.sentence_starts(d)
            bounds = np.append(starts, len(corpus.tokens(d)))
            target = self.max_tokens if rng.random() >= cfg.short_seq_prob else int(rng.integers(2, self.max_tokens))
            first = 0
            for s in range(1, len(starts) + 1):
                if bounds[s] - bounds[first] >= target or s == len(starts):
                    chunks.append((d, first, s))
                    first = s
        self.chunks = np.asarray(chunks, dtype=np.int64).reshape(-1, 3)
        self.docs = docs

    def __len__(self) -> int:
        return len(self.chunks)

    def _segment(self, doc: int, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and masking-unit starts of sentences [first, last) of a document."""
        lo, hi = sentence_range(self.corpus, doc, first, last)
        return self.corpus.tokens(doc)[lo:hi].astype(np.int64), unit_starts(self.corpus, doc, self.cfg.masking)[lo:hi]

    def __call__(self, index: int, rng: np.random.Generator, position: int = 0) -> dict:
        doc, first, last = (int(x) for x in self.chunks[index])
        objective, label = self.cfg.objective, 0
        if objective == "mlm":
            a, b = self._segment(doc, first, last), None
        else:
            split = int(rng.integers(first + 1, last)) if last - first > 1 else last
            a, b = self._segment(doc, first, split), self._segment(doc, split, last)
            if objective == "mlm_nsp" and (len(b[0]) == 0 or rng.random() < 0.5):
                other = doc
                while other == doc and len(self.docs) > 1:
                    other = int(self.docs[rng.integers(len(self.docs))])
                n = len(self.corpus.sentence_starts(other))
                b, label = self._segment(other, int(rng.integers(n)), n), 1
            elif objective == "mlm_sop" and len(b[0]) and rng.random() < 0.5:
                a, b, label = b, a, 1
        budget = self.max_tokens + (1 if b is None else 0)
        a, b = _truncate(a, b if b is not None else (np.zeros(0, np.int64), np.zeros(0, np.uint8)), budget, rng)
        return _bert_layout(a, b, label, self.special, self.cfg, self.corpus.vocab_size, rng)


def sentence_range(corpus: Corpus, doc: int, first: int, last: int) -> tuple[int, int]:
    """Token range [lo, hi) of sentences [first, last) of a document."""
    starts, n = corpus.sentence_starts(doc), len(corpus.tokens(doc))
    return (int(starts[first]) if first < len(starts) else n), (int(starts[last]) if last < len(starts) else n)


def unit_starts(corpus: Corpus, doc: int, masking: str) -> np.ndarray:
    """1 where a masking unit begins: every token (token), words (whole_word, span), or words with phrase
    and entity spans made single units (knowledge: ERNIE 1.0's phrase- and entity-level masking)."""
    if masking == "token":
        return np.ones(len(corpus.tokens(doc)), dtype=np.uint8)
    starts = corpus.word_start(doc).copy()
    if masking == "knowledge":
        for a, b in np.concatenate([corpus.phrase_spans(doc), corpus.entity_spans(doc)]).tolist():
            starts[a + 1:b] = 0
    return starts


def _truncate(a, b, budget: int, rng):
    """BERT's truncate_seq_pair: drop a token from the front or the back (at random) of the longer segment
    until both fit. Segments are (tokens, word starts)."""
    (ta, sa), (tb, sb) = a, b
    la, lb, fa, fb = 0, 0, len(ta), len(tb)  # kept ranges [la, fa) and [lb, fb)
    while (fa - la) + (fb - lb) > budget:
        front = rng.random() < 0.5
        if fa - la > fb - lb:
            la, fa = (la + 1, fa) if front else (la, fa - 1)
        else:
            lb, fb = (lb + 1, fb) if front else (lb, fb - 1)
    return (ta[la:fa], sa[la:fa]), (tb[lb:fb], sb[lb:fb])


def _bert_layout(a, b, label, special, cfg, vocab_size, rng) -> dict:
    """[CLS] A [SEP] (B [SEP]) padded to seq_len, segment ids, attention mask, masked tokens and labels."""
    (ta, sa), (tb, sb) = a, b
    seq, na, nb = cfg.seq_len, len(ta), len(tb)
    n = na + 2 + (nb + 1 if nb else 0)
    ids = np.full(seq, special["pad"], dtype=np.int64)
    ids[0], ids[1:1 + na], ids[1 + na] = special["cls"], ta, special["sep"]
    types = np.zeros(seq, dtype=np.int64)
    maskable = np.zeros(seq, dtype=bool)
    word_start = np.zeros(seq, dtype=bool)
    maskable[1:1 + na], word_start[1:1 + na] = True, sa.astype(bool)
    word_start[1] = True  # a truncated segment may start inside a word
    if nb:
        ids[2 + na:2 + na + nb], ids[2 + na + nb] = tb, special["sep"]
        types[2 + na:n] = 1
        maskable[2 + na:2 + na + nb], word_start[2 + na:2 + na + nb] = True, sb.astype(bool)
        word_start[2 + na] = True
    ids_out, labels = mask_tokens(ids, maskable, word_start, cfg, vocab_size, special["mask"], rng)
    out = {"input_ids": ids_out, "token_type_ids": types, "attention_mask": (np.arange(seq) < n).astype(np.int64),
           "labels": labels}
    if cfg.objective in ("mlm_nsp", "mlm_sop"):
        out["next_sentence_label"] = np.int64(label)
    return out


def mask_tokens(ids, maskable, word_start, cfg, vocab_size, mask_id, rng):
    """BERT's dynamic masking: mask_prob of the maskable tokens, chosen a whole unit at a time (units begin
    where `word_start` is set: tokens, words or knowledge spans), at most max_predictions_per_seq; each
    chosen token -> [MASK] 80%, random token 10%, unchanged 10%."""
    positions = np.flatnonzero(maskable)
    limit = cfg.max_predictions_per_seq or int(np.ceil(cfg.mask_prob * cfg.seq_len))
    budget = min(limit, max(1, int(round(len(positions) * cfg.mask_prob))))
    group = np.cumsum(word_start[positions] | (np.arange(len(positions)) == 0))  # unit of each position
    chosen = []
    for g in rng.permutation(np.unique(group)):
        members = positions[group == g]
        if len(chosen) + len(members) > budget:
            continue
        chosen.extend(members.tolist())
        if len(chosen) >= budget:
            break
    chosen = np.sort(np.asarray(chosen, dtype=np.int64))
    labels = np.full(len(ids), -100, dtype=np.int64)
    labels[chosen] = ids[chosen]
    out = ids.copy()
    draw = rng.random(len(chosen))
    out[chosen[draw < 0.8]] = mask_id
    random_tokens = chosen[(draw >= 0.8) & (draw < 0.9)]
    out[random_tokens] = rng.integers(0, vocab_size, len(random_tokens))
    return out, labels


class Samples(torch.utils.data.Dataset):
    """Position k of a rank's stream -> the sample it trains on (epochs follow one another)."""

    def __init__(self, builder, seed: int, dp_rank: int, dp: int):
        self.builder, self.seed, self.dp_rank, self.dp = builder, seed, dp_rank, dp
        self.per_epoch = len(builder) // dp
        if self.per_epoch == 0:
            raise ValueError(f"the dataset gives {len(builder)} samples, fewer than {dp} data-parallel ranks")

    def __len__(self) -> int:
        return 1 << 62  # an endless stream; the trainer decides when to stop

    def __getitem__(self, k: int) -> dict:
        epoch, position = divmod(k, self.per_epoch)
        order = _order(len(self.builder), self.seed, epoch)
        index = int(order[position * self.dp + self.dp_rank])
        sample = self.builder(index, np.random.default_rng([self.seed, epoch, index]), k * self.dp + self.dp_rank)
        return {key: torch.as_tensor(v) for key, v in sample.items()}


_ORDERS: dict = {}


def _order(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _ORDERS:
        _ORDERS.clear()
        _ORDERS[key] = np.random.default_rng([seed, _SALT_ORDER, epoch]).permutation(n)
    return _ORDERS[key]


class _From(torch.utils.data.Sampler):
    def __init__(self, start: int):
        self.start = start

    def __iter__(self):
        k = self.start
        while True:
            yield k
            k += 1


def batches(cfg, corpora: list[Corpus], split: str, micro_batch: int, dp_rank: int, dp: int, start: int,
            workers: int, eval_step: int | None = None):
    """Endless micro-batches for this rank, starting at position `start` of its stream (`eval_step`: the
    training step an evaluation stream stands for, which picks ERNIE's stage)."""
    corpus = corpora[0]
    docs = split_documents(corpus, cfg.data.valid_fraction, cfg.seed, split)
    if cfg.data.objective == "clm":
        builder = GPTSamples(corpus, docs, cfg.data.seq_len)
    elif cfg.data.objective == "ernie":
        from pretrain.data.ernie import ErnieSamples

        builder = ErnieSamples(corpus, docs, cfg, eval_step)
    else:
        builder = BertSamples(corpus, docs, cfg.data, cfg.seed)
    data = Samples(builder, cfg.seed + (1 if split == "valid" else 0), dp_rank, dp)
    # its own generator: creating a loader must not draw from the global RNG that dropout uses (exact resume)
    loader = torch.utils.data.DataLoader(data, batch_size=micro_batch, sampler=_From(start), num_workers=workers,
                                         pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
                                         generator=torch.Generator().manual_seed(cfg.seed))
    return iter(loader)
