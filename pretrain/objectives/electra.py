"""ELECTRA (Clark et al. 2020): a generator (a narrow masked LM sharing the model's embeddings) fills the masked
positions with tokens sampled from its softmax, and the model, the discriminator, tells for every token whether it
was replaced (samples: pretrain/data/bert.py's full sentences, as `mlm`). Terms: `mlm`, the generator's masked LM,
and `rtd`, the discriminator's binary cross-entropy over every non-padding token, weighted by `electra.rtd_weight`.

Sampling is argmax(logits + gumbel noise), the noise a hash of (the sample's masked tokens, position, vocabulary id):
the same sample draws the same token under any TP x DP x micro-batch layout, with no random state to carry.
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain.objectives.base import M32, Section, hash32
from pretrain.objectives.masked_lm import Masked
from pretrain.schema import opt

ORDER = 40
def gumbel_noise(input_ids, positions, vocab_ids):
    """Gumbel(0, 1) noise [n, len(vocab_ids)] for the n `positions` of `input_ids` [b, s] (a boolean mask, or the flat
    indices of its True elements: no device sync): a function of each row's tokens, the position and the vocabulary
    id alone."""
    import torch

    b, s = input_ids.shape
    where = torch.arange(s, device=input_ids.device).expand(b, s)
    row = hash32((hash32((input_ids + (where << 20)) & M32).sum(1)) & M32)  # [b]: the sample's tokens
    flat = positions.flatten().nonzero().squeeze(1) if positions.dtype == torch.bool else positions
    rows, cols = flat // s, flat % s
    key = hash32(row[rows] ^ hash32(cols + 0x9E3779B9 & M32))  # [n]
    bits = hash32(key[:, None] ^ hash32(vocab_ids.long()[None, :] + 0x7F4A7C15))  # [n, v]
    u = ((bits >> 8).float() + 0.5) / float(1 << 24)  # in (0, 1), exact in fp32
    return -torch.log(-torch.log(u))


def sampler(input_ids, positions):
    """The token ids sampled from vocab-parallel generator logits [n, V / tp] at `positions` of `input_ids`."""
    import torch

    from pretrain.losses import vocab_parallel_argmax
    from pretrain.parallel import mcore

    def sample(logits):
        first = mcore.tp_rank() * logits.shape[-1]
        vocab = torch.arange(first, first + logits.shape[-1], device=logits.device)
        return vocab_parallel_argmax(logits.float() + gumbel_noise(input_ids, positions, vocab))

    return sample


def auc_pairs(scores, labels):
    """(pairs ranked right, pairs) as device tensors: Mann-Whitney counts of (replaced, original) token pairs whose
    replaced token scores higher, ties counting half; their ratio is the ROC AUC. Every token is searched among the
    original tokens' sorted scores (the replaced ones moved past them as +inf), so no shape depends on the labels
    (no device sync); the scores are finite."""
    import torch

    negative = scores.masked_fill(labels, float("inf")).sort().values
    below = torch.searchsorted(negative, scores, side="left")
    tied = torch.searchsorted(negative, scores, side="right") - below
    positives = labels.sum()
    return ((2 * below + tied) * labels).sum().double() / 2, positives * (len(labels) - positives)


@dataclass
class ElectraConfig:
    rtd_weight: float = opt(50.0, "the weight of the discriminator's replaced-token-detection loss against the "
                                  "generator's masked-LM loss (the paper's lambda)", range=">= 0")


class Electra(Masked):
    name = "electra"
    help = "replaced-token detection with a jointly trained generator (ELECTRA)"
    one_lm_head = False
    pair_task = "none"  # RoBERTa's full sentences
    section = Section("electra", ElectraConfig)
    headline = ("rtd_auc", "mlm_acc")
    weight = ElectraConfig().rtd_weight  # configured() takes the config's

    def configured(self, cfg) -> "Electra":
        bound = super().configured(cfg)
        bound.weight = cfg.electra.rtd_weight
        return bound

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need("rtd" in cfg.model.heads, f"data.objective=electra trains the rtd head but model.heads={cfg.model.heads}; "
                                       f"set model.arch=electra (or model.heads=[rtd])")
        need(not cfg.data.unpadded, "data.unpadded=true is not supported with data.objective=electra (its sampling "
                                    "noise is keyed by padded rows); remove data.unpadded")

    def select(self, batch, phase=None):
        return {"mlm": batch["labels"] != -100, "rtd": batch["attention_mask"].bool()}

    def compute(self, model, batch, phase=None, fused=False):
        import torch
        import torch.nn.functional as F

        from pretrain import losses

        where = self.where(batch)
        masked, tokens = where["mlm"], where["rtd"]
        ids, target = batch["input_ids"], losses.pick(batch["labels"], masked, 2)
        out = model(ids, batch["attention_mask"], batch["token_type_ids"], positions=masked,
                    sample=sampler(ids, masked))
        original = torch.where(batch["labels"] != -100, batch["labels"], ids)
        replaced = losses.pick(out["input_ids"] != original, tokens, 2)
        scores = losses.pick(out["rtd_logits"], tokens, 2).float()
        loss = F.binary_cross_entropy_with_logits(scores, replaced.float(), reduction="sum")
        count = replaced.new_full((), len(replaced), dtype=torch.long)
        with torch.no_grad():
            ratios = {"rtd_auc": auc_pairs(scores, replaced),  # the all-original guess: the baseline accuracy
                      "rtd_original_acc": ((~replaced).sum(), count)}
        return {"mlm": losses.token_term(out["generator_logits"], target),
                "rtd": losses.Term(loss, count, ((scores > 0) == replaced).sum(), self.weight, ratios)}


OBJECTIVES = (Electra(),)
