"""Pretraining objectives, one module each, found by name in `REGISTRY`.

An objective bundles what training on it takes: its config checks, its sample builder, the heads it adds to
the model, and its loss terms (`select` names each term's elements from the labels alone, before any forward
pass; `compute` runs the model). The config, the data factory, the trainer, the engine and `ptm plan` ask the
registry instead of listing names. torch and the data code are imported where they run, so the config and
`ptm plan` load without them.

    objective = get(cfg.data.objective)
    counts = losses.global_counts([objective.elements(b, tasks) for b in batches], dp_group)
    loss = losses.objective(objective.compute(model, batch, tasks), counts)

`tasks` is the current ERNIE 2.0 stage's (`ernie.stages`); the other objectives take () and ignore it.
"""
from __future__ import annotations

import math

AT = "at:"  # the batch fields holding each term's element indices (`Objective.locate`)


class Objective:
    name = ""
    help = ""
    causal = False  # predicts each next token (a causal model) rather than masked tokens (a bidirectional one)
    pairs = False  # samples hold two segments: the model needs segment embeddings
    one_lm_head = True  # every prediction comes from the model's own LM head (fused_lm_loss can replace it)

    def configured(self, cfg) -> "Objective":
        """This objective with the settings of `cfg` it computes with (ELECTRA's loss weight); most have none."""
        return self

    def check(self, cfg, need) -> None:
        """Record, by `need(ok, message)`, each way `cfg` does not fit this objective (message: one line with
        the fix)."""
        m, d = cfg.model, cfg.data
        attention = "causal" if self.causal else "bidirectional"
        need(m.causal == self.causal,
             f"data.objective={self.name} does not fit model.arch={m.arch} (model.causal={m.causal}); {self.name} "
             f"trains a model with {attention} attention: " + ", ".join(
                 o.name for o in REGISTRY.values() if o.causal == m.causal) + f" fit model.arch={m.arch}")
        need(not self.pairs or m.type_vocab_size >= 2,
             f"data.objective={self.name} pairs two segments but model.type_vocab_size={m.type_vocab_size}; "
             f"set model.type_vocab_size=2")
        need(d.pack_documents or self.causal,
             f"data.pack_documents=false applies to data.objective=clm, not {self.name}; remove it")
        need(cfg.fused_lm_loss != "on" or self.one_lm_head,
             f"fused_lm_loss=on replaces the one LM head, and data.objective={self.name} has several heads; "
             "set fused_lm_loss=auto (on where it applies) or off")
        self.check_stages(cfg, need)
        total = sum(s.steps for s in cfg.ernie.stages)
        need(not cfg.ernie.stages or total == cfg.train.steps,
             f"ernie.stages add up to {total} steps but train.steps={cfg.train.steps}; make them equal")

    def check_stages(self, cfg, need) -> None:
        """`ernie.stages` outside ERNIE 2.0: ERNIE 1.0's knowledge-masking stages only."""
        need(not cfg.ernie.stages or cfg.data.masking == "knowledge",
             f"ernie.stages is set but data.objective={self.name} and data.masking={cfg.data.masking}; set "
             "data.objective=ernie (ERNIE 2.0 tasks) or data.masking=knowledge (ERNIE 1.0 stages), or remove it")

    def predicted_tokens(self, data) -> int:
        """Tokens per sequence the LM head runs on (`data`: the config's data section)."""
        return data.max_predictions_per_seq or math.ceil(data.mask_prob * data.seq_len)

    def masker(self, data, corpus, strategy: str, knowledge_level: str):
        """The dynamic masker of `data` (the config's data section) for `corpus`'s vocabulary (and, for MacBERT's
        correction masking, `data.similar_words` in its tokens)."""
        from pretrain.objectives.masking import Masker, SimilarWords

        similar = SimilarWords(data.similar_words, corpus.tokenizer()) \
            if strategy == "correction" and data.similar_words else None
        return Masker(corpus.special_ids, corpus.vocab_size, strategy=strategy, mask_prob=data.mask_prob,
                      max_predictions=self.predicted_tokens(data), knowledge_level=knowledge_level, similar=similar)

    def source(self, data, path: str, corpus, docs, *, seed: int, cache_dir: str | None, knowledge_level: str,
               tasks: dict[str, float] | None, task_data: dict[str, str]):
        """The sample source over documents `docs` of the dataset `corpus` at `path`."""
        raise NotImplementedError

    def add_heads(self, model, cfg) -> None:
        """Heads beyond the model's own (`cfg.model.heads`); none by default."""

    def select(self, batch: dict, tasks=()) -> dict:
        """Each loss term's elements as a boolean mask over the batch (tokens [b, s] or sequences [b]), in a
        fixed order that is the same on every rank."""
        raise NotImplementedError

    def locate(self, batch: dict, tasks=()) -> dict:
        """`batch` (on the host: the data loader's collate calls this) with the flat indices of each term's elements
        (`select`'s True positions) as `AT + name`, so that `compute` picks them on the device without a sync."""
        return {**batch, **{AT + name: mask.flatten().nonzero().squeeze(1)
                            for name, mask in self.select(batch, tasks).items()}}

    def where(self, batch: dict, tasks=()) -> dict:
        """Each term's elements for `losses.pick`: the indices `locate` put in the batch, else `select`'s masks (a
        device sync on a GPU for each mask picked with: the count is data)."""
        located = {k[len(AT):]: v for k, v in batch.items() if k.startswith(AT)}
        return located or self.select(batch, tasks)

    def elements(self, batch: dict, tasks=()) -> dict:
        """The number of elements of each term in a micro-batch, from its labels alone (no forward pass)."""
        return {name: mask.sum() for name, mask in self.select(batch, tasks).items()}

    def compute(self, model, batch: dict, tasks=()) -> dict:
        """The batch's loss terms ({name: losses.Term}, summed, not averaged)."""
        raise NotImplementedError


def _registry() -> dict[str, Objective]:
    from pretrain.objectives.clm import CausalLM
    from pretrain.objectives.electra import Electra
    from pretrain.objectives.ernie import Ernie
    from pretrain.objectives.masked_lm import MASKED_LM

    return {o.name: o for o in (*MASKED_LM, CausalLM(), Ernie(), Electra())}


REGISTRY = _registry()


def get(name: str) -> Objective:
    if name not in REGISTRY:
        raise ValueError(f"data.objective {name!r} is not one of {' | '.join(REGISTRY)}")
    return REGISTRY[name]
