"""Train and validation sources from the `data` section of the training config."""
from __future__ import annotations

from data_prep.dataset import Corpus
from pretrain import objectives
from pretrain.data.blend import BlendedDataset
from pretrain.data.indexes import split_documents


def build_sources(data, seed: int, *, cache_dir: str | None = None, knowledge_level: str = "entity",
                  tasks: dict[str, float] | None = None, task_data: dict[str, str] | None = None):
    """(train, valid) sources for `data` (a DataConfig): one per data.path, blended by data.weights when
    there are several; documents are held out by `split_documents`; valid is None when valid_fraction is 0.
    `tasks` ({task: weight}, the current ERNIE 2.0 stage) and `task_data` ({task: labelled dataset}) are for
    data.objective == "ernie"."""
    objective = objectives.get(data.objective)
    corpora = [Corpus(p) for p in data.paths]
    if len({c.manifest["tokenizer"]["sha256"] for c in corpora}) > 1:
        raise ValueError(f"data.path: {', '.join(data.paths)} were encoded with different tokenizers; "
                         "only datasets that share one can be blended")
    splits = [split_documents(len(c), data.valid_fraction, seed) for c in corpora]

    def source(path: str, corpus: Corpus, docs):
        if not len(docs):
            raise ValueError(f"{path}: data.valid_fraction={data.valid_fraction} holds out no document; "
                             "raise it, or set it to 0 to train without validation")
        return objective.source(data, path, corpus, docs, seed=seed, cache_dir=cache_dir,
                                knowledge_level=knowledge_level, tasks=tasks, task_data=task_data or {})

    def part(which: int):
        try:
            sources = [source(p, c, s[which]) for p, c, s in zip(data.paths, corpora, splits)]
        except ValueError as e:
            hint = "; raise data.valid_fraction" if which else ""
            raise ValueError(f"{('training', 'validation')[which]} split: {e}{hint}") from None
        return sources[0] if len(sources) == 1 else BlendedDataset(sources, data.weights)

    return part(0), part(1) if data.valid_fraction > 0 else None
