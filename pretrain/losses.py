"""Pretraining losses that do not depend on how the global batch is split.

Every objective is made of terms (masked tokens, predicted tokens, classified sequences, ERNIE 2.0 task
tokens or pairs). A term's loss is the sum of its per-element losses divided by the number of its elements in
the whole global batch, counted over every micro-batch and data-parallel rank before the backward pass
(Megatron's per-token loss, Hugging Face's `num_items_in_batch`). The objective is the sum of its terms, so a
task missing from one rank's micro-batch changes nothing, and any TP x DP x micro-batch split of the same
global batch gives the same gradient.

    counts = global_counts([elements(b, arch, tasks) for b in batches], dp_group)   # before any backward
    terms = compute(model, batch, arch, tasks)                                     # per micro-batch
    loss = objective(terms, counts)
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
    are, and how many were predicted right (None: not tracked)."""

    loss: torch.Tensor
    count: torch.Tensor
    correct: torch.Tensor | None = None


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


def _selections(batch: dict, arch: str, tasks=()) -> dict[str, torch.Tensor]:
    """Each term's elements as a boolean mask over the batch (tokens [b, s] or sequences [b]), in a fixed
    order that is the same on every rank; `tasks`: the ERNIE 2.0 stage's."""
    if "task" in batch:
        from pretrain.data.ernie import TASKS
        from pretrain.models.ernie_heads import SEQUENCE_TASKS, TOKEN_TASKS

        out = {"mlm": batch["labels"] != -100} if "knowledge_masking" in tasks else {}
        token_task = batch["token_task"] if "token_task" in batch else batch["task"][:, None]  # packed or padded
        for name in TOKEN_TASKS:
            if name in tasks:
                out[name] = (token_task == TASKS.index(name)) & (batch["token_labels"] != -100)
        for name in [*SEQUENCE_TASKS, "discourse_relation", "ir_relevance"]:
            if name in tasks:
                out[name] = batch["task"] == TASKS.index(name)
        return out
    if arch == "gpt2":
        return {"lm": batch["labels"] != -100}
    out = {"mlm": batch["labels"] != -100}
    if "next_sentence_label" in batch:
        out["nsp"] = batch["next_sentence_label"] != -100
    return out


def elements(batch: dict, arch: str, tasks=()) -> dict[str, torch.Tensor]:
    """The number of elements of each term in a micro-batch, from its labels alone (no forward pass)."""
    return {name: mask.sum() for name, mask in _selections(batch, arch, tasks).items()}


def global_counts(per_batch: list[dict[str, torch.Tensor]], group) -> dict[str, torch.Tensor]:
    """Each term's elements in the whole global batch: summed over this rank's micro-batches, then over the
    data-parallel ranks of `group`."""
    names = list(per_batch[0])
    counts = torch.stack([torch.stack([b[n] for b in per_batch]).sum() for n in names]).double()
    dev.all_reduce(counts, group)
    return dict(zip(names, counts))


def objective(terms: dict[str, Term], counts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sum of the terms, each divided by its global element count (0 for a term with no elements)."""
    return sum(t.loss / counts[name].clamp(min=1).to(t.loss.dtype) for name, t in terms.items())


def compute(model, batch: dict, arch: str, tasks=()) -> dict[str, Term]:
    """The batch's loss terms (summed, not averaged); `tasks`: the ERNIE 2.0 stage's. When training with the
    engine's `fused_lm_loss`, the LM head returns its loss (and correct count) instead of logits."""
    select = _selections(batch, arch, tasks)
    if "task" in batch:
        return _ernie(model, batch, select)
    fused = getattr(model, "fused_lm_loss", False) and torch.is_grad_enabled()
    if arch == "gpt2":
        if fused:
            loss, _ = model(batch["input_ids"], labels=batch["labels"])["lm_loss"]
            return {"lm": Term(loss, select["lm"].sum())}
        logits = model(batch["input_ids"])["logits"]
        return {"lm": Term(K.cross_entropy(logits, batch["labels"]).sum(), select["lm"].sum())}
    masked = select["mlm"]
    target = batch["labels"][masked]
    out = model(batch["input_ids"], batch.get("attention_mask"), batch["token_type_ids"], batch.get("task_type_ids"),
                positions=masked, labels=target if fused else None, **{k: batch[k] for k in PACKED if k in batch})
    if fused:
        terms = {"mlm": Term(out["lm_loss"][0], target.new_tensor(len(target)), out["lm_loss"][1])}
    else:
        terms = {"mlm": _token_term(out["logits"], target)}
    if "nsp" in select:
        terms["nsp"] = _class_term(out["nsp_logits"], batch["next_sentence_label"])
    return terms


def _token_term(logits: torch.Tensor, target: torch.Tensor) -> Term:
    """Masked/causal LM over vocab-parallel logits of the selected tokens."""
    correct = (vocab_parallel_argmax(logits.detach()) == target).sum() if len(target) else target.new_zeros(())
    return Term(K.cross_entropy(logits, target).sum(), target.new_tensor(len(target)), correct)


def _class_term(logits: torch.Tensor, target: torch.Tensor) -> Term:
    """A classification head's cross-entropy, in fp32 whatever the model's precision."""
    return Term(F.cross_entropy(logits.float(), target, reduction="sum"), target.new_tensor(len(target)),
                (logits.detach().argmax(-1) == target).sum())


def _ernie(model, batch: dict, select: dict[str, torch.Tensor]) -> dict[str, Term]:
    """ERNIE 2.0: one term per task of the stage. Every head of the stage runs on every rank, on no rows when
    the batch has none of its samples, so that ranks make the same ZeRO-3 gathers and gradient reductions
    whatever their data."""
    h = model(batch["input_ids"], batch.get("attention_mask"), batch["token_type_ids"], batch["task_type_ids"],
              hidden=True, position_ids=batch.get("position_ids"), sample_index=batch.get("sample_index"))["hidden"]
    terms = {}
    if "mlm" in select:
        masked = select["mlm"]
        terms["mlm"] = _token_term(model.lm_logits(h[masked]), batch["labels"][masked])
    for name, head in model.tasks.token.items():
        if name in select:
            rows = select[name]
            terms[name] = _class_term(head(h[rows]), batch["token_labels"][rows])
    pooled = model.pooled(h, batch.get("cls_index"))
    for name, head in model.tasks.sequence.items():
        if name in select:
            rows = select[name]
            terms[name] = _class_term(head(pooled[rows]), batch["seq_label"][rows])
    return terms


class Tally:
    """Loss sums, element counts and correct predictions per term, added up over micro-batches and then
    over the data-parallel ranks: the metrics are global means, like the loss."""

    def __init__(self):
        self.sums: dict[str, list[float]] = {}

    def add(self, terms: dict[str, Term], extra: dict[str, tuple[float, float]] | None = None) -> None:
        """Add a micro-batch's terms, and `extra` {name: (hits, count)} ratios (e.g. a baseline accuracy)."""
        for name, t in terms.items():
            row = self.sums.setdefault(name, [0.0, 0.0, 0.0 if t.correct is not None else float("nan")])
            row[0] += float(t.loss.detach())
            row[1] += float(t.count)
            row[2] += float(t.correct) if t.correct is not None else 0.0
        for name, (hits, count) in (extra or {}).items():
            row = self.sums.setdefault(name, [float("nan"), 0.0, 0.0])
            row[1] += count
            row[2] += hits

    def metrics(self, group) -> dict[str, float]:
        """`{term}_loss` and `{term}_acc` over everything added on every rank of `group`, and `loss`, the
        objective (the sum of the terms' means)."""
        names = sorted(self.sums)
        if not names:
            return {}
        sums = torch.tensor([self.sums[n] for n in names], dtype=torch.float64)
        dev.all_reduce(sums, group)
        out, total = {}, 0.0
        for name, (loss, count, correct) in zip(names, sums.tolist()):
            if count == 0:
                continue
            if loss == loss:  # not NaN: a loss term
                out[f"{name}_loss"] = loss / count
                total += loss / count
            if correct == correct:
                out[f"{name}_acc"] = correct / count
        out["loss"] = total
        return out
