"""SpanBERT (Joshi et al. 2020): masked LM on single segments masked in spans (`data.masking=span`: runs of whole
words, geometric lengths), plus the span boundary objective (SBO): each masked token of a span is predicted again from
the two tokens just outside the span and its place inside it.

    mlm_sbo  [CLS] segment [SEP] (whole sentences packed up to seq_len, no NSP); terms `mlm` and `sbo`

The SBO head (SpanBERT's `BertPairTargetPredictionHead`): [h_left; h_right; p_i] (h: the last layer's hidden states
at the boundary tokens, p_i: a learned embedding of the token's place in its span, `sbo.position_size` wide) ->
Linear -> GeLU -> LayerNorm -> Linear -> GeLU -> LayerNorm, then the tied word embeddings plus a bias of its own
(vocab-parallel, as the MLM head's). A span is a maximal run of masked tokens (adjacent spans merge, as SpanBERT's
do); a span whose boundary would be its sample's first or last token ([CLS], [SEP]) is learned by masked LM alone,
and so are a span's tokens past its first `sbo.max_targets` (SpanBERT's `max_pair_targets`). The loss is the MLM
mean plus `sbo.weight` x the SBO mean, each over the global batch. The Hugging Face export (BertForMaskedLM) keeps the
MLM head; the SBO head, used only in pretraining, stays in ptm's checkpoint (SpanBERT's released weights drop it too).
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain.objectives.base import Section
from pretrain.objectives.masked_lm import MaskedLM
from pretrain.schema import opt

ORDER = 160
IGNORE = -100


@dataclass
class SBOConfig:
    max_targets: int = opt(15, "the first this many tokens of each span get the SBO term (rows of the place "
                               "embedding; SpanBERT's max_pair_targets)", range="> 0")
    position_size: int = opt(200, "width of the embedding of a token's place in its span (SpanBERT: 200)", range="> 0")
    weight: float = opt(1.0, "the SBO mean's weight beside the MLM mean in the loss", range=">= 0")


def boundaries(labels, segments, max_targets: int):
    """For tokens [b, s] with `labels` (IGNORE where not masked) and `segments` (the sample each token belongs to, 0
    for padding): (sbo, left, right, place), [b, s] each: whether the token gets the SBO term, the positions of its
    span's left and right boundary tokens (the nearest unmasked ones), and its place in the span (0: first). Tensor
    operations only: the same on the host and on the device, without a sync."""
    import torch

    b, s = labels.shape
    masked = labels != IGNORE
    at = torch.arange(s, device=labels.device).expand(b, s)
    left = torch.where(masked, -1, at).cummax(1).values
    right = torch.where(masked, s, at).flip(1).cummin(1).values.flip(1)
    before = segments.gather(1, (left - 1).clamp(0, s - 1))  # the sample of the token before the left boundary
    after = segments.gather(1, (right + 1).clamp(0, s - 1))
    inside = (left >= 1) & (before == segments) & (right + 1 < s) & (after == segments)
    place = at - left - 1
    return masked & inside & (place < max_targets), left, right, place


def _segments(batch):
    """The sample of each token: packed rows' `sample_index`, else the padding mask (one sample per row)."""
    import torch

    if "sample_index" in batch:
        return batch["sample_index"]
    mask = batch.get("attention_mask")
    return mask.long() if mask is not None else torch.ones_like(batch["labels"])


def sbo_head(cfg):
    """The SBO head of `cfg` (its bias: this TP rank's share of the padded vocabulary), initialised as SpanBERT's:
    weights N(0, model.init_std), biases 0."""
    import torch
    from megatron.core import tensor_parallel as mtp
    from torch import nn

    from pretrain import kernels as K
    from pretrain.models.layers import mask_padding, tied_logits

    m, o = cfg.model, cfg.sbo
    h = m.hidden_size

    class SpanBoundaryHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.place = nn.Embedding(o.max_targets, o.position_size)
            self.fc1 = nn.Linear(2 * h + o.position_size, h)
            self.norm1 = nn.LayerNorm(h, eps=m.layer_norm_eps)
            self.fc2 = nn.Linear(h, h)
            self.norm2 = nn.LayerNorm(h, eps=m.layer_norm_eps)
            self.bias = nn.Parameter(torch.zeros(m.padded_vocab // cfg.parallel.tp))
            mtp.set_tensor_model_parallel_attributes(self.bias, is_parallel=True, dim=0, stride=1)
            self.activation = m.activation
            for layer in (self.place, self.fc1, self.fc2):
                nn.init.normal_(layer.weight, std=m.init_std)
            nn.init.zeros_(self.fc1.bias)
            nn.init.zeros_(self.fc2.bias)

        def forward(self, left, right, place, word, tp, padding):
            """Vocab-parallel logits of the tokens whose boundary states are `left`, `right` and places `place`, through
            the tied word embeddings `word` over TP group `tp` (`padding`: this rank's padding rows, masked)."""
            x = torch.cat([left, right, self.place(place).to(left.dtype)], -1)
            x = self.norm1(K.bias_act(self.fc1(x), None, self.activation))
            x = self.norm2(K.bias_act(self.fc2(x), None, self.activation))
            return mask_padding(tied_logits(x, word, tp) + self.bias, padding)

        def reads(self, model):
            """The word embeddings, which its forward reads (ZeRO-3 gathers them for it: pretrain/engine.py)."""
            yield self, model.embeddings.word.weight

    return SpanBoundaryHead()


class SpanBoundary(MaskedLM):
    name = "mlm_sbo"
    section = Section("sbo", SBOConfig)
    headline = ("mlm_loss", "mlm_acc", "sbo_acc")
    one_lm_head = False  # the SBO head predicts too: the fused LM loss would replace the MLM head's alone

    def __init__(self):
        super().__init__(self.name, "masked LM + span boundary objective on single segments (SpanBERT)", "none")

    def heads(self, cfg, frozen: bool = True) -> dict:
        return {"sbo": sbo_head(cfg)}

    def head_parameters(self, cfg) -> int:
        """Per TP rank: the place embedding, two Linear + LayerNorm, this rank's share of the vocabulary bias."""
        h, o = cfg.model.hidden_size, cfg.sbo
        return (o.max_targets * o.position_size + (2 * h + o.position_size) * h + h + h * h + h + 4 * h
                + cfg.model.padded_vocab // cfg.parallel.tp)

    def select(self, batch, phase=None):
        sbo = boundaries(batch["labels"], _segments(batch), self.cfg.sbo.max_targets)[0]
        return {**super().select(batch, phase), "sbo": sbo}

    def compute(self, model, batch, phase=None, fused=False):
        import torch

        from pretrain import losses

        terms, out = self.masked_terms(model, batch, fused, with_hidden=True)
        at = self.where(batch)["sbo"]
        _, left, right, place = boundaries(batch["labels"], _segments(batch), self.cfg.sbo.max_targets)
        row = torch.arange(left.shape[0], device=left.device)[:, None] * left.shape[1]
        states = out["hidden"].flatten(0, 1)
        logits = model.sbo(states[losses.pick(left + row, at, 2)], states[losses.pick(right + row, at, 2)],
                           losses.pick(place, at, 2), model.embeddings.word, model.tp, model.vocab_padding)
        term = losses.token_term(logits, losses.pick(batch["labels"], at, 2))
        terms["sbo"] = losses.Term(term.loss, term.count, term.correct, weight=self.cfg.sbo.weight)
        return terms

    def baselines(self, batch, terms, most_frequent):
        """Always answering the most frequent token, on the masked tokens and on those with the SBO term."""
        out = super().baselines(batch, terms, most_frequent)
        if "sbo" in terms and terms["sbo"].correct is not None:
            from pretrain import losses

            picked = losses.pick(batch["labels"], self.where(batch)["sbo"], 2)
            out["sbo_unigram_acc"] = ((picked == most_frequent).sum(), terms["sbo"].count)
        return out


OBJECTIVES = (SpanBoundary(),)
