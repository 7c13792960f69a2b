"""Masked LM on a bidirectional model, alone or with a sentence-pair task (samples: pretrain/data/bert.py).

    mlm_nsp  BERT: [CLS] A [SEP] B [SEP]; B follows A or comes from another document (next sentence prediction)
    mlm_sop  ALBERT: B always follows A, and half the pairs are swapped (sentence order prediction)
    mlm      RoBERTa FULL-SENTENCES: whole sentences packed up to seq_len, no pair task

Terms: `mlm` over the masked tokens, `nsp` or `sop` over the sequences (both on the model's nsp head).

`Masked` is the base of every objective that masks tokens with `data.masking`: its masker, and ERNIE 1.0's
knowledge-masking stages (`ernie.stages` with `data.masking=knowledge`) as its phases.
"""
from __future__ import annotations

import functools

from pretrain.objectives.base import Objective

ORDER = 10


class Masked(Objective):
    """An objective whose samples are masked by `data.masking` (pretrain/data/masking.py)."""

    strategy = None  # the masking strategy it always uses; None: data.masking
    pair_task = "none"  # BERT-style samples (pretrain/data/bert.py): nsp | sop | next | none

    @property
    def keys_read(self) -> tuple[str, ...]:
        """The masker's keys (the strategy's where the objective has none of its own) and, where samples are pairs of
        runs of sentences, BERT's short_seq_prob (packed sentences fill seq_len)."""
        return (("data.mask_prob", "data.max_predictions_per_seq")
                + (() if self.strategy else ("data.masking", "data.similar_words"))
                + (("data.short_seq_prob",) if self.pair_task != "none" else ()))

    @property
    def fixed(self) -> dict:
        """data.masking, unread where the objective masks its own way: its strategy (saying it changes nothing)."""
        return {"data.masking": self.strategy} if self.strategy else {}

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.bert import BertDataset

        d = self.cfg.data
        return BertDataset(path, d.seq_len, self.masker(corpus, phase), pair_task=self.pair_task,
                           short_seq_prob=d.short_seq_prob, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir)

    def phases(self) -> list:
        """ERNIE 1.0's knowledge-masking stages (each with its knowledge_level), with data.masking=knowledge."""
        knowledge = (self.strategy or self.cfg.data.masking) == "knowledge"
        return self.cfg.ernie.stages if knowledge else []

    def phase_index(self, step: int) -> int:
        return self.cfg.ernie.stage_index(step) if self.phases() else 0

    def phase(self, step: int):
        return self.cfg.ernie.stage_at(step) if self.phases() else None

    def describe(self, phase) -> str:
        return f"{phase.knowledge_level}-level masking"

    def masker(self, corpus, phase=None):
        """The dynamic masker of the config's data section for `corpus`'s vocabulary (and, for MacBERT's
        correction masking, `data.similar_words` in its tokens), at `phase`'s knowledge level."""
        from pretrain.data.masking import Masker, SimilarWords

        data = self.cfg.data
        strategy = self.strategy or data.masking
        similar = SimilarWords(data.similar_words, corpus.tokenizer()) \
            if strategy == "correction" and data.similar_words else None
        if strategy == "correction":
            _say_similar(data.similar_words, len(similar or ()))
        return Masker(corpus.special_ids, corpus.vocab_size, strategy=strategy, mask_prob=data.mask_prob,
                      max_predictions=self.predicted_tokens(data), similar=similar,
                      knowledge_level=phase.knowledge_level if phase is not None else "entity", where=corpus.path)

    def baselines(self, batch, terms, most_frequent):
        """Always answering the most frequent token, on the masked tokens."""
        if "mlm" not in terms or terms["mlm"].correct is None:
            return {}
        return {"mlm_unigram_acc": ((batch["labels"] == most_frequent).sum(), terms["mlm"].count)}


@functools.cache
def _say_similar(path: str, words: int) -> None:
    """Once per run: what MacBERT's correction masking replaces chosen words with (a missing or unfitting
    similar-words file leaves random words alone, which is not MacBERT)."""
    from pretrain.runlog import log

    if words:
        log(f"data.masking=correction: similar words for {words:,} words (as the dataset's tokens spell them) "
            f"from {path}")
    else:
        log("data.masking=correction: " + (f"no word of data.similar_words={path} has a similar word of as many tokens"
                                           if path else "data.similar_words is not set") +
            "; every chosen word becomes a random word (give a file of words and their similar words)")


class MaskedLM(Masked):
    def __init__(self, name: str, help_: str, pair_task: str):
        self.name, self.help, self.pair_task, self.pairs = name, help_, pair_task, pair_task != "none"

    @property
    def headline(self) -> tuple[str, ...]:
        return ("mlm_loss", "mlm_acc") + ((f"{self.pair_task}_acc",) if self.pairs else ())

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need("mlm" in cfg.model.heads, f"data.objective={self.name} trains the model's mlm head but model.heads="
                                       f"{cfg.model.heads}; use a model with an mlm head (arch bert, roberta, albert)")
        need(not self.pairs or "nsp" in cfg.model.heads,
             f"data.objective={self.name} trains the model's nsp head but model.heads={cfg.model.heads}; add nsp to it")

    def select(self, batch, phase=None):
        out = {"mlm": batch["labels"] != -100}
        if "next_sentence_label" in batch:  # the term named by its task: nsp_acc, sop_acc
            out[self.pair_task] = batch["next_sentence_label"] != -100
        return out

    def compute(self, model, batch, phase=None, fused=False):
        return self.masked_terms(model, batch, fused)[0]

    def masked_terms(self, model, batch, fused=False, **asked) -> tuple[dict, dict]:
        """The `mlm` (and `nsp` or `sop`) terms, and the model's outputs (`asked`: more, e.g. `with_hidden`). The MLM
        head runs on the masked tokens alone; with the engine's `fused_lm_loss` (training only) it returns its loss
        and correct count instead of logits."""
        from pretrain import losses

        where = self.where(batch)
        masked = where["mlm"]
        target = losses.pick(batch["labels"], masked, 2)
        out = model(batch["input_ids"], batch.get("attention_mask"), batch["token_type_ids"], batch.get("task_type_ids"),
                    positions=masked, labels=target if fused else None,
                    **{k: batch[k] for k in losses.PACKED if k in batch}, **asked)
        if fused:
            terms = {"mlm": losses.fused_term(out["lm_loss"], target)}
        else:
            terms = {"mlm": losses.token_term(out["logits"], target)}
        if self.pair_task in where:
            terms[self.pair_task] = losses.class_term(out["nsp_logits"], batch["next_sentence_label"])
        return terms, out


OBJECTIVES = (
    MaskedLM("mlm_nsp", "masked LM + next sentence prediction (BERT)", pair_task="nsp"),
    MaskedLM("mlm_sop", "masked LM + sentence order prediction (ALBERT)", pair_task="sop"),
    MaskedLM("mlm", "masked LM on full sentences packed up to seq_len (RoBERTa)", pair_task="none"),
)
