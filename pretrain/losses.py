"""Pretraining losses that do not depend on how the global batch is split.

Every objective is made of terms (masked tokens, predicted tokens, classified sequences, ERNIE 2.0 task
tokens or pairs). A term's loss is the sum of its per-element losses divided by the number of its elements in
the whole global batch, counted over every micro-batch and data-parallel rank before the backward pass
(Megatron's per-token loss, Hugging Face's `num_items_in_batch`). The objective is the sum of its terms, so a
task missing from one rank's micro-batch changes nothing, and any TP x DP x micro-batch split of the same
global batch gives the same gradient.

    objective = objectives.get(cfg.data.objective)          # its terms: pretrain/objectives/
    counts = global_counts([objective.elements(b, tasks) for b in batches], dp_group)   # before any backward
    terms = objective.compute(model, batch, tasks)                                      # per micro-batch
    loss = losses.objective(terms, counts)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pretrain import device as dev
from pretrain import kernels as K
from pretrain.parallel import mcore

PACKED = ("position_ids", "sample_index", "cls_index")  # the fields of an unpadded batch (pretrain/data/packing.py)


@dataclass
class Term:
    """One loss term of a micro-batch: the summed loss of its elements (with grad), how many elements there
    are, how many were predicted right (None: not tracked), its weight in the objective, and other metrics as
    {name: (hits, count)} (e.g. a baseline's accuracy)."""

    loss: torch.Tensor
    count: torch.Tensor
    correct: torch.Tensor | None = None
    weight: float = 1.0
    ratios: dict[str, tuple[float, float]] | None = None


def vocab_parallel_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Global argmax over a vocabulary split across the TP ranks."""
    value, index = logits.max(-1)
    if mcore.tp_size() == 1:
        return index
    index = index + mcore.tp_rank() * logits.shape[-1]
    values = [torch.empty_like(value) for _ in range(mcore.tp_size())]
    indices = [torch.empty_like(index) for _ in range(mcore.tp_size())]
    dist.all_gather(values, value.contiguous(), group=mcore.tp_group())
    dist.all_gather(indices, index.contiguous(), group=mcore.tp_group())
    best = torch.stack(values).argmax(0)
    return torch.stack(indices).gather(0, best[None])[0]


def global_counts(per_batch: list[dict[str, torch.Tensor]], group) -> dict[str, torch.Tensor]:
    """Each term's elements in the whole global batch: summed over this rank's micro-batches, then over the
    data-parallel ranks of `group`."""
    names = list(per_batch[0])
    counts = torch.stack([torch.stack([b[n] for b in per_batch]).sum() for n in names]).double()
    dev.all_reduce(counts, group)
    return dict(zip(names, counts))


def objective(terms: dict[str, Term], counts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weighted sum of the terms, each divided by its global element count (0 for a term with no elements)."""
    return sum(t.weight * t.loss / counts[name].clamp(min=1).to(t.loss.dtype) for name, t in terms.items())


def token_term(logits: torch.Tensor, target: torch.Tensor) -> Term:
    """Masked/causal LM over vocab-parallel logits of the selected tokens."""
    correct = (vocab_parallel_argmax(logits.detach()) == target).sum() if len(target) else target.new_zeros(())
    return Term(K.cross_entropy(logits, target).sum(), target.new_tensor(len(target)), correct)


def class_term(logits: torch.Tensor, target: torch.Tensor) -> Term:
    """A classification head's cross-entropy, in fp32 whatever the model's precision."""
    return Term(F.cross_entropy(logits.float(), target, reduction="sum"), target.new_tensor(len(target)),
                (logits.detach().argmax(-1) == target).sum())


class Tally:
    """Loss sums, element counts and correct predictions per term, added up over micro-batches and then
    over the data-parallel ranks: the metrics are global means, like the loss."""

    def __init__(self):
        self.sums: dict[str, list[float]] = {}
        self.weights: dict[str, float] = {}

    def add(self, terms: dict[str, Term], extra: dict[str, tuple[float, float]] | None = None) -> None:
        """Add a micro-batch's terms, their ratios and `extra` {metric: (hits, count)} (e.g. a baseline accuracy)."""
        ratios = dict(extra or {})
        for name, t in terms.items():
            row = self.sums.setdefault(name, [0.0, 0.0, 0.0 if t.correct is not None else float("nan")])
            row[0] += float(t.loss.detach())
            row[1] += float(t.count)
            row[2] += float(t.correct) if t.correct is not None else 0.0
            self.weights[name] = t.weight
            ratios.update(t.ratios or {})
        for name, (hits, count) in ratios.items():
            row = self.sums.setdefault(name, [float("nan"), 0.0, 0.0])
            row[1] += count
            row[2] += hits

    def metrics(self, group) -> dict[str, float]:
        """`{term}_loss` and `{term}_acc` over everything added on every rank of `group`, the ratios by their
        names, and `loss`, the objective (the weighted sum of the terms' means)."""
        names = sorted(self.sums)
        if not names:
            return {}
        sums = torch.tensor([self.sums[n] for n in names], dtype=torch.float64)
        dev.all_reduce(sums, group)
        out, total = {}, 0.0
        for name, (loss, count, correct) in zip(names, sums.tolist()):
            if count == 0:
                continue
            if loss != loss:  # NaN: a ratio
                out[name] = correct / count
                continue
            out[f"{name}_loss"] = loss / count
            total += self.weights[name] * loss / count
            if correct == correct:
                out[f"{name}_acc"] = correct / count
        out["loss"] = total
        return out
