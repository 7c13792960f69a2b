"""Train and validation sources of a training config: its datasets, split into held-out documents, sampled by its
objective (`Objective.source`)."""
from __future__ import annotations

from data_prep.dataset import Corpus
from pretrain import objectives
from pretrain.data.blend import BlendedDataset
from pretrain.data.indexes import split_documents


def open_corpora(paths: list[str]) -> list[Corpus]:
    """The datasets of `data.path`, which must share one tokenizer (the one check of it)."""
    corpora = [Corpus(p) for p in paths]
    if len({c.manifest["tokenizer"]["sha256"] for c in corpora}) > 1:
        raise ValueError(f"data.path: {', '.join(paths)} were encoded with different tokenizers; only datasets that "
                         "share one can be blended: build them with one --tokenizer")
    return corpora


def build_sources(cfg, phase=None, *, corpora: list[Corpus] | None = None, cache_dir: str | None = None):
    """(train, valid) sources of a training config at its objective's `phase` (`Objective.phase(step)`: ERNIE 2.0's
    stage decides the tasks, a knowledge-masking stage the level): one per data.path, blended by data.weights when
    there are several; documents are held out by `split_documents`; valid is None when valid_fraction is 0."""
    data, seed = cfg.data, cfg.seed
    objective = objectives.get(data.objective).configured(cfg)
    corpora = corpora or open_corpora(data.paths)
    for path, corpus in zip(data.paths, corpora):
        if objective.reads == "tokens" and corpus.manifest["tokenizer"]["kind"] == "words":
            raise ValueError(f"{path} holds words (`python -m data_prep words`); data.objective={data.objective} "
                             "reads tokens: set data.path to a dataset of `python -m data_prep build`")
    splits = [split_documents(len(c), data.valid_fraction, seed) for c in corpora]

    def source(path: str, corpus: Corpus, docs):
        if not len(docs):
            raise ValueError(f"{path}: data.valid_fraction={data.valid_fraction} holds out no document; "
                             "raise it, or set it to 0 to train without validation")
        return objective.source(path, corpus, docs, phase, cache_dir)

    def part(which: int):
        try:
            sources = [source(p, c, s[which]) for p, c, s in zip(data.paths, corpora, splits)]
        except ValueError as e:
            hint = "; raise data.valid_fraction" if which and "valid_fraction" not in str(e) else ""
            raise ValueError(f"{('training', 'validation')[which]} split: {e}{hint}") from None
        return sources[0] if len(sources) == 1 else BlendedDataset(sources, data.weights)

    return part(0), part(1) if data.valid_fraction > 0 else None
