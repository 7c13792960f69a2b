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

import math
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


def _log_softmax(x: torch.Tensor, group) -> torch.Tensor:
    """log softmax over a vocabulary split across TP group `group` (maxima and sums all-reduced)."""
    top = x.max(-1, keepdim=True).values
    if group.size() > 1:
        dist.all_reduce(top, dist.ReduceOp.MAX, group=group)
    total = (x - top).exp().sum(-1, keepdim=True)
    if group.size() > 1:
        dist.all_reduce(total, group=group)
    return x - top - total.log()


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student, teacher, temperature, group):
        log_q = _log_softmax(student.detach().float() / temperature, group)
        p = _log_softmax(teacher.detach().float() / temperature, group).exp()
        loss = -(p * log_q).sum(-1)
        if group.size() > 1:
            dist.all_reduce(loss, group=group)
        ctx.save_for_backward(log_q.exp() - p)
        ctx.temperature, ctx.dtype = temperature, student.dtype
        return loss * temperature ** 2

    @staticmethod
    def backward(ctx, grad):
        (diff,) = ctx.saved_tensors
        return (diff * (grad[:, None] * ctx.temperature)).to(ctx.dtype), None, None, None


def soft_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, temperature: float, group=None) -> torch.Tensor:
    """Distillation's soft targets per row: -sum_v softmax(teacher / T)_v log softmax(student / T)_v * T^2, in fp32,
    over vocab-parallel logits [n, V / tp] (the masked padding rows count nothing). Its gradient, T * (softmax(student
    / T) - softmax(teacher / T)), is each rank's own: no collective in the backward pass (autograd through the
    all-reduced normaliser would give each rank only its own slice's share of it)."""
    return _SoftCrossEntropy.apply(student, teacher, temperature, group or mcore.tp_group())


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


def pick(x: torch.Tensor, where: torch.Tensor, dims: int) -> torch.Tensor:
    """The elements of `x` at `where` over its first `dims` dimensions: flat indices (found on the host by
    `Objective.locate`: no device sync) or a boolean mask of those dimensions (a sync on a GPU: the count is data)."""
    return x.flatten(0, dims - 1)[where.flatten()]


def token_term(logits: torch.Tensor, target: torch.Tensor) -> Term:
    """Masked/causal LM over vocab-parallel logits of the selected tokens."""
    correct = (vocab_parallel_argmax(logits.detach()) == target).sum() if len(target) else target.new_zeros(())
    return Term(K.cross_entropy(logits, target).sum(), target.new_full((), len(target)), correct)


def fused_term(fused: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> Term:
    """Masked/causal LM of the fused LM head (`kernels.linear_cross_entropy`: summed loss, correct predictions) over
    the `target` tokens."""
    loss, correct = fused
    return Term(loss, target.new_full((), len(target)), correct)


def perplexity(metrics: dict, loss: str = "lm_loss", name: str = "ppl") -> dict:
    """{name: exp(the mean `loss`)} of an evaluation's metrics that hold it (capped at e^50), else {}."""
    return {name: math.exp(min(metrics[loss], 50))} if loss in metrics else {}


def class_term(logits: torch.Tensor, target: torch.Tensor) -> Term:
    """A classification head's cross-entropy, in fp32 whatever the model's precision."""
    return Term(F.cross_entropy(logits.float(), target, reduction="sum"), target.new_full((), len(target)),
                (logits.detach().argmax(-1) == target).sum())


class Tally:
    """Loss sums, element counts and correct predictions per term, added up over micro-batches on the device (adding
    never waits for it) and then over the data-parallel ranks: the metrics are global means, like the loss.

        sums = tally.sums(group)                        # all-reduced on the device
        metrics = tally.read(sums.flatten().tolist())   # the one transfer to the host (`metrics` does both)
    """

    def __init__(self):
        self.rows: dict[str, torch.Tensor] = {}  # name -> float64 [loss, count, correct] on the device
        self.kinds: dict[str, str] = {}  # name -> "loss" | "loss+acc" | "ratio" (count, hits)
        self.weights: dict[str, float] = {}

    def add(self, terms: dict[str, Term], extra: dict[str, tuple] | None = None) -> None:
        """Add a micro-batch's terms, their ratios and `extra` {metric: (hits, count)} (e.g. a baseline accuracy),
        as device tensors."""
        ratios = dict(extra or {})
        for name, t in terms.items():
            correct = t.correct if t.correct is not None else t.count
            self._add(name, "loss" if t.correct is None else "loss+acc", t.loss.detach(), t.count, correct)
            self.weights[name] = t.weight
            ratios.update(t.ratios or {})
        for name, (hits, count) in ratios.items():
            self._add(name, "ratio", count, count, hits)

    def _add(self, name: str, kind: str, *values: torch.Tensor) -> None:
        row = torch.stack([v.double() for v in values])
        self.rows[name] = self.rows[name] + row if name in self.rows else row
        self.kinds[name] = kind

    def sums(self, group) -> torch.Tensor:
        """The rows in name order ([names, 3], float64 on the device), summed over the ranks of `group`."""
        names = sorted(self.rows)
        sums = torch.stack([self.rows[n] for n in names]) if names else torch.zeros(0, 3, dtype=torch.float64)
        return dev.all_reduce(sums, group)

    def read(self, sums: list[float]) -> dict[str, float]:
        """`{term}_loss` and `{term}_acc` from `sums(...)`, flattened, on the host, the ratios by their names, and
        `loss`, the objective (the weighted sum of the terms' means)."""
        out, total = {}, 0.0
        for i, name in enumerate(sorted(self.rows)):
            loss, count, correct = sums[3 * i:3 * i + 3]
            kind = self.kinds[name]
            if count == 0:
                continue
            if kind == "ratio":
                out[name] = correct / count
                continue
            out[f"{name}_loss"] = loss / count
            total += self.weights[name] * loss / count
            if kind == "loss+acc":
                out[f"{name}_acc"] = correct / count
        if self.rows:
            out["loss"] = total
        return out

    def metrics(self, group) -> dict[str, float]:
        """`read` of `sums`: one all-reduce and one transfer to the host."""
        return self.read(self.sums(group).flatten().tolist())
