"""Train and validation sources from the `data` section of the training config."""
from __future__ import annotations

import math

from data_prep.dataset import Corpus
from pretrain.data.bert import OBJECTIVES as BERT_OBJECTIVES, BertDataset
from pretrain.data.blend import BlendedDataset
from pretrain.data.gpt import GPTDataset
from pretrain.data.indexes import split_documents
from pretrain.objectives.masking import Masker


def build_sources(data, seed: int, *, cache_dir: str | None = None, knowledge_level: str = "entity"):
    """(train, valid) sources for `data` (a DataConfig): one per data.path, blended by data.weights when
    there are several; documents are held out by `split_documents`; valid is None when valid_fraction is 0."""
    if data.objective != "clm" and data.objective not in BERT_OBJECTIVES:
        raise ValueError(f"data.objective {data.objective!r} has no sample builder; "
                         f"available: clm, {', '.join(BERT_OBJECTIVES)}")
    corpora = [Corpus(p) for p in data.paths]
    if len({c.manifest["tokenizer"]["sha256"] for c in corpora}) > 1:
        raise ValueError(f"data.path: {', '.join(data.paths)} were encoded with different tokenizers; "
                         "only datasets that share one can be blended")
    splits = [split_documents(len(c), data.valid_fraction, seed) for c in corpora]

    def source(path: str, corpus: Corpus, docs):
        if not len(docs):
            raise ValueError(f"{path}: data.valid_fraction={data.valid_fraction} holds out no document; "
                             "raise it, or set it to 0 to train without validation")
        if data.objective == "clm":
            return GPTDataset(path, data.seq_len, seed=seed, docs=docs, cache_dir=cache_dir)
        masker = Masker(corpus.special_ids, corpus.vocab_size, strategy=data.masking, mask_prob=data.mask_prob,
                        max_predictions=data.max_predictions_per_seq or math.ceil(data.mask_prob * data.seq_len),
                        knowledge_level=knowledge_level)
        return BertDataset(path, data.seq_len, masker, objective=data.objective, short_seq_prob=data.short_seq_prob,
                           seed=seed, docs=docs, cache_dir=cache_dir)

    def part(which: int):
        sources = [source(p, c, s[which]) for p, c, s in zip(data.paths, corpora, splits)]
        return sources[0] if len(sources) == 1 else BlendedDataset(sources, data.weights)

    return part(0), part(1) if data.valid_fraction > 0 else None
