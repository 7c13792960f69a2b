"""ELMo's bidirectional LM (bilm-tf): on packed windows of words (pretrain/data/char_words.py), the forward LSTMs predict
each next word and the backward LSTMs each previous one, through the one softmax they share (a full softmax, not
bilm-tf's sampled one). Terms `fwd` and `bwd`, each per predicted word, weighted 1/2 (bilm-tf's mean of the two);
beside each its unigram baseline: the loss of predicting every word by its training-set frequency
(`data_prep words`' counts.tsv)."""
from __future__ import annotations

from pretrain.objectives.base import Objective

ORDER = 130


class BiLM(Objective):
    name = "bilm"
    reads = "words"
    help = "ELMo's forward and backward LMs over words, one shared softmax (model.arch=elmo)"
    causal = False
    headline = ("fwd_loss", "bwd_loss")
    _unigram = None

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need(bool(cfg.model.char_filters) or cfg.model.arch == "elmo",  # (ELMo's own check names its filters)
             f"data.objective=bilm trains ELMo's biLM; model.arch={cfg.model.arch} has no character CNN: set "
             "model.arch=elmo")
        need(not cfg.data.unpadded, "data.unpadded=true packs BERT and ERNIE samples, not ELMo's; remove it")

    def predicted_tokens(self, data) -> int:
        return 2 * data.seq_len

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.char_words import ELMoWindows

        if corpus.manifest["tokenizer"]["kind"] != "words":
            raise ValueError(f"{path} holds {corpus.manifest['tokenizer']['kind']} tokens; data.objective=bilm "
                             f"reads words: build them with `python -m data_prep words {path} --out WORDS`")
        return ELMoWindows(path, self.cfg.data.seq_len, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir)

    def select(self, batch, phase=None):
        words = batch["words"][:, 1:]
        return {"fwd": words >= 0, "bwd": words >= 0}

    def locate(self, batch, phase=None):
        return batch

    def unigram(self, device):
        """-log p(word) by the training counts (add-one), per vocabulary word, on `device`."""
        if self._unigram is None or self._unigram.device != device:
            import os

            import torch

            from data_prep.words import word_counts

            counts = torch.as_tensor(word_counts(os.path.join(self.cfg.data.paths[0], "tokenizer")),
                                     dtype=torch.float64) + 1
            self._unigram = (counts.sum().log() - counts.log()).to(device)
        return self._unigram

    def compute(self, model, batch, phase=None, fused=False):
        """The shared softmax on each stack's top, dropped out as bilm-tf does; with the engine's `fused_lm_loss`
        (TP=1) the fused linear cross-entropy, the logits never whole."""
        from pretrain.losses import fused_term, token_term

        words = batch["words"]
        out = model(batch["chars"])
        unigram = self.unigram(words.device)
        terms = {}
        for name, h, target in (("fwd", out["forward"][:, :-1], words[:, 1:]),
                                ("bwd", out["backward"][:, 1:], words[:, :-1])):
            h, target = model.dropout(h).flatten(0, 1), target.flatten()
            if fused:
                term = fused_term(model.softmax(h, target), target)
            else:
                term = token_term(model.softmax(h), target)
            term.weight, term.ratios = 0.5, {f"{name}_unigram_loss": (unigram[target].sum(), term.count)}
            terms[name] = term
        return terms

    def evaluation(self, metrics):
        from pretrain.losses import perplexity

        return {**perplexity(metrics, "fwd_loss", "fwd_ppl"), **perplexity(metrics, "bwd_loss", "bwd_ppl")}


OBJECTIVES = (BiLM(),)
