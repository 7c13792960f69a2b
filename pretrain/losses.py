"""Pretraining losses and metrics for a batch: masked LM + NSP/SOP (BERT, ERNIE), causal LM (GPT-2)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pretrain import kernels as K
from pretrain.parallel import mcore


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


def compute(model, batch: dict, arch: str, tasks=()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The batch's total loss and detached metrics (per-task losses, accuracies); `tasks`: the ERNIE 2.0 stage's."""
    if "task" in batch:
        return _ernie(model, batch, tasks)
    if arch == "gpt2":
        logits = model(batch["input_ids"])["logits"]
        loss = K.cross_entropy(logits, batch["labels"]).mean()
        return loss, {"lm_loss": loss.detach()}
    labels = batch["labels"]
    positions = labels != -100
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch.get("task_type_ids"),
                positions=positions)
    target = labels[positions]
    predicted = vocab_parallel_argmax(out["logits"].detach())
    mlm = K.cross_entropy(out["logits"], target).mean()
    metrics = {"mlm_loss": mlm.detach(), "mlm_acc": (predicted == target).float().mean()}
    loss = mlm
    if "next_sentence_label" in batch:
        nsp = F.cross_entropy(out["nsp_logits"], batch["next_sentence_label"])
        metrics["nsp_loss"] = nsp.detach()
        metrics["nsp_acc"] = (out["nsp_logits"].argmax(-1) == batch["next_sentence_label"]).float().mean()
        loss = loss + nsp
    return loss, metrics


def _ernie(model, batch: dict, tasks) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ERNIE 2.0: each task's mean loss over the samples of that task in the batch, summed. Every head of the
    stage's `tasks` runs on every rank, on no rows when the batch has none of its samples (then adding 0 x its
    output), so that ranks make the same ZeRO-3 gathers and gradient reductions whatever their data."""
    from pretrain.data.ernie import TASKS

    h = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["task_type_ids"],
              hidden=True)["hidden"]
    total, metrics = h.new_zeros(()), {}

    def add(name, logits, target, loss_fn=lambda x, y: F.cross_entropy(x.float(), y), argmax=None):
        nonlocal total
        if not len(target):
            total = total + logits.sum() * 0
            return
        loss = loss_fn(logits, target)
        total = total + loss
        predicted = (argmax or (lambda x: x.argmax(-1)))(logits.detach())
        metrics[f"{name}_loss"] = loss.detach()
        metrics[f"{name}_acc"] = (predicted == target).float().mean()

    if "knowledge_masking" in tasks:
        masked = batch["labels"] != -100
        add("mlm", model.lm_logits(h[masked]), batch["labels"][masked],
            loss_fn=lambda x, y: K.cross_entropy(x, y).mean(), argmax=vocab_parallel_argmax)
    for name, head in model.tasks.token.items():
        if name in tasks:
            rows = (batch["task"] == TASKS.index(name))[:, None] & (batch["token_labels"] != -100)
            add(name, head(h[rows]), batch["token_labels"][rows])
    pooled = model.pooled(h)
    for name, head in model.tasks.sequence.items():
        if name in tasks:
            rows = batch["task"] == TASKS.index(name)
            add(name, head(pooled[rows]), batch["seq_label"][rows])
    return total, metrics
