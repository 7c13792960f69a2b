"""Fine-tuning in the spirit of Cramming's "GLUE-sane" protocol (Geiping & Goldstein 2022): a few epochs, one
learning-rate grid shared by every task, several seeds per rate; the rate whose median dev score is best is
reported with the median and spread of its seeds. AdamW (weight decay 0.01 off biases and norms), linear warm-up
over the first 10% of steps and linear decay to zero; the dev score is taken after the last epoch (no early stop).

Data parallel under any launcher ptm supports (torchrun, deepspeed, mpirun, srun: `pretrain.parallel.mcore`'s
process group): every rank reads the same shuffled order, takes its share of each global batch, and the gradients
are averaged so that the step is the global batch's mean loss whatever the number of ranks; dev predictions are
gathered. Rank 0 writes the results.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from downstream import models as M
from downstream.encode import IGNORE, Encoder
from downstream.tasks import Task
from pretrain import device as D
from ptm.files import whole_dir


@dataclass
class Options:
    epochs: int = 3
    lrs: tuple[float, ...] = (2e-5, 5e-5, 1e-4)  # transformers fine-tuned whole
    task_model_lrs: tuple[float, ...] = (1e-3,)  # a layer or task model trained over frozen features (ELMo's)
    seeds: tuple[int, ...] = (1, 2, 3)
    batch_size: int = 32
    max_len: int = 128
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_train: int = 0  # at most this many training examples (0: all)
    pretrained: bool = True  # False: the same architecture randomly initialised (the no-pretraining baseline)
    save_dir: str = ""  # write the best run's fine-tuned model here (loads with transformers for HF heads)
    features: str = ""  # feature-based: first | mean | whiten (models.LinearHead); ELMo always is
    progress: bool = True


def world() -> tuple[int, int]:
    """(rank, world size): the launcher's process group, or (0, 1) without a launcher."""
    import torch.distributed as dist
    from launchers import rendezvous

    if rendezvous.export() and not dist.is_initialized():
        from pretrain.parallel import mcore

        mcore.init_processes()
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def build(source: M.Source, task: Task, pretrained: bool, features: str = ""):
    """(model, inputs) for a task: the ELMo task model and its word inputs, or the family's head (a linear layer
    over frozen `features`) and its tokenizer's Encoder."""
    labels = {"regression": 1, "qa": 2}.get(task.kind, len(task.labels))
    if source.elmo:
        from downstream.elmo_task import ELMoInputs, elmo_model

        return elmo_model(source.elmo, task.kind, labels, task.pair, pretrained), ELMoInputs(Options.max_len)
    return M.head_model(source, task.kind, labels, pretrained, task.labels, features), None


class Features:
    """A task's examples as rows of inputs and targets (QA: windows, `owner` naming each one's example)."""

    def __init__(self, task: Task, inputs, examples):
        self.task, self.inputs, self.examples = task, inputs, examples
        self.rows: list[dict] = []
        for i, e in enumerate(examples):
            if task.kind in ("classification", "regression"):
                row = inputs.texts(e.texts)
                row["target"] = e.label if task.kind == "regression" else task.labels.index(e.label)
                self.rows.append(row)
            elif task.kind == "tagging":
                self.rows.append(inputs.words(e.words, e.tags, task.labels))
            else:
                for w in inputs.qa(e.question, e.context, e.answers):
                    w["owner"] = i
                    self.rows.append(w)

    def batch(self, idx: list[int], dev: torch.device) -> tuple[dict, dict]:
        """(model inputs, targets) of rows `idx`."""
        rows = [self.rows[i] for i in idx]
        keys = ("input_ids", "token_type_ids") + (("labels",) if self.task.kind == "tagging" else ())
        padded = self.inputs.pad(rows, keys)
        targets = {}
        if self.task.kind == "tagging":
            targets["labels"] = padded.pop("labels")
        elif self.task.kind == "qa":  # (a row padded before its tokens: its positions move by its padding)
            shift = [self.padding(r, padded) for r in rows]
            targets["start"] = torch.tensor([r["start"] + k for r, k in zip(rows, shift)])
            targets["end"] = torch.tensor([r["end"] + k for r, k in zip(rows, shift)])
        else:
            targets["target"] = torch.tensor([r["target"] for r in rows],
                                             dtype=torch.float if self.task.kind == "regression" else torch.long)
        take = getattr(self.inputs, "takes", ())  # what the model reads (GPT-2 would add token types' embeddings)
        inputs = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in padded.items() if not take or k in take}
        return inputs, {k: v.to(dev) for k, v in targets.items()}

    def padding(self, row: dict, padded: dict) -> int:
        """How many padding positions come before `row`'s tokens in its padded batch."""
        if not getattr(self.inputs, "pads_left", False):  # (ELMo's inputs: characters, padded after)
            return 0
        return padded["input_ids"].shape[1] - len(row["input_ids"])

    def count(self, idx: list[int]) -> int:
        """What the loss averages over in rows `idx`: labelled tokens (tagging) or rows."""
        if self.task.kind == "tagging":
            return sum(sum(x != IGNORE for x in self.rows[i]["labels"]) for i in idx)
        return len(idx)


def loss_sum(kind: str, out, targets: dict) -> torch.Tensor:
    """The summed loss of a batch (the caller divides by the global batch's count)."""
    if kind == "regression":
        return F.mse_loss(out.squeeze(-1).float(), targets["target"], reduction="sum")
    if kind == "classification":
        return F.cross_entropy(out.float(), targets["target"], reduction="sum")
    if kind == "tagging":
        return F.cross_entropy(out.flatten(0, 1).float(), targets["labels"].flatten().to(out.device),
                               ignore_index=IGNORE, reduction="sum")
    start, end = out
    n = start.shape[1]
    s, e = targets["start"].clamp(0, n - 1), targets["end"].clamp(0, n - 1)
    keep = (targets["start"] != IGNORE).float()
    return ((F.cross_entropy(start.float(), s, reduction="none")
             + F.cross_entropy(end.float(), e, reduction="none")) * keep).sum() / 2


def predict(model: nn.Module, feats: Features, batch_size: int, rank: int, size: int, dev: torch.device) -> list:
    """Each example's prediction (a class name, a score, its words' tags, an answer), gathered from every rank."""
    import torch.distributed as dist

    model.eval()
    task = feats.task
    mine = list(range(rank, len(feats.rows), size))
    outs: dict[int, object] = {}
    with torch.no_grad():
        for b in range(0, len(mine), batch_size):
            idx = mine[b:b + batch_size]
            inputs, _ = feats.batch(idx, dev)
            out = model(inputs)
            for j, i in enumerate(idx):  # (a row's own positions: without the padding before its tokens)
                own = slice(feats.padding(feats.rows[i], inputs), None)
                if task.kind == "qa":
                    outs[i] = (out[0][j, own].float().cpu(), out[1][j, own].float().cpu())
                elif task.kind == "tagging":
                    outs[i] = out[j, own].argmax(-1).cpu().tolist()
                elif task.kind == "regression":
                    outs[i] = float(out[j, 0])
                else:
                    outs[i] = task.labels[int(out[j].argmax())]
    if size > 1:
        parts = [None] * size
        dist.all_gather_object(parts, outs)
        outs = {k: v for part in parts for k, v in part.items()}
    model.train()
    if task.kind in ("classification", "regression"):
        return [outs[i] for i in range(len(feats.rows))]
    if task.kind == "tagging":
        preds = []
        for i, e in enumerate(feats.examples):
            row, tags = feats.rows[i], ["O"] * len(e.words)
            for pos, w in enumerate(row["word_ids"]):
                if w >= 0 and pos < len(outs[i]):
                    tags[w] = task.labels[outs[i][pos]]
            preds.append(tags)
        return preds
    windows: dict[int, list[int]] = {}
    for i, r in enumerate(feats.rows):
        windows.setdefault(r["owner"], []).append(i)
    return [feats.inputs.best_span([feats.rows[i] for i in windows[k]], [outs[i][0] for i in windows[k]],
                                   [outs[i][1] for i in windows[k]], e.context)
            for k, e in enumerate(feats.examples)]


def score(task: Task, examples, preds) -> dict[str, float]:
    from downstream import metrics

    if task.kind == "classification":
        return metrics.classification([e.label for e in examples], preds, task.labels, task.metrics)
    if task.kind == "regression":
        return metrics.regression([e.label for e in examples], preds, task.metrics)
    if task.kind == "tagging":
        return metrics.tagging([e.tags for e in examples], preds, task.metrics)
    return metrics.qa([[a for a, _ in e.answers] for e in examples], preds, task.metrics)


def _optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    decay, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (rest if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr)


def run_one(source: M.Source, task: Task, lr: float, seed: int, opts: Options):
    """One fine-tuning run: (final dev metrics, curve {step, loss} and {epoch, metric}, the model)."""
    from tqdm import tqdm

    rank, size = world()
    dev = D.device()  # (pretrain.device's rule: cuda:LOCAL_RANK, or cpu)
    torch.manual_seed(seed)
    random.seed(seed)
    model, inputs = build(source, task, opts.pretrained, opts.features)
    if inputs is None:
        tok = M.tokenizer(source)
        mask = ("real",) if M.unmasked(source) else ("attention_mask",)  # "real": the padding, for pooling only
        inputs = Encoder(tok, M.max_len(tok, opts.max_len), takes=("input_ids", *mask) + (
            ("token_type_ids",) if "token_type_ids" in tok.model_input_names else ()))
    else:
        inputs.max_len = opts.max_len
    train_ex = task.train[:opts.max_train] if opts.max_train else task.train
    train, dev_feats = Features(task, inputs, train_ex), Features(task, inputs, task.dev)
    model.to(dev).train()
    if hasattr(model, "fit_inputs"):  # statistics of the training inputs (ELMo's standardised layers, whitening)
        model.fit_inputs(train.batch(list(range(i, min(i + opts.batch_size, len(train.rows)))), dev)[0]
                         for i in range(0, len(train.rows), opts.batch_size))
    wrapped = model
    if size > 1:
        wrapped = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    opt = _optimizer(model, lr, opts.weight_decay)
    steps_per_epoch = math.ceil(len(train.rows) / opts.batch_size)
    total = steps_per_epoch * opts.epochs
    warm = max(int(total * opts.warmup), 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(total - s, 0) / max(total - warm, 1)))
    order_rng = random.Random(seed)
    curve = {"loss": [], "dev": []}
    step = 0
    bar = tqdm(total=total, desc=f"{task.name} lr={lr:g} seed={seed}", disable=not opts.progress or rank != 0,
               leave=False)
    for epoch in range(opts.epochs):
        order = list(range(len(train.rows)))
        order_rng.shuffle(order)
        for b in range(0, len(order), opts.batch_size):
            global_idx = order[b:b + opts.batch_size]
            count = max(train.count(global_idx), 1)
            mine = global_idx[rank::size]
            inputs_b, targets = train.batch(mine or global_idx[:1], dev)  # (a rank without rows adds nothing)
            loss = loss_sum(task.kind, wrapped(inputs_b), targets) * (size / count if mine else 0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            logged = loss.detach().clone()
            if size > 1:  # every rank's share: the global batch's mean loss
                import torch.distributed as dist

                dist.all_reduce(logged)
            curve["loss"].append((step, float(logged) / size))
            bar.update(1)
        metrics = score(task, task.dev, predict(model, dev_feats, opts.batch_size * 2, rank, size, dev))
        curve["dev"].append((epoch + 1, metrics))
    bar.close()
    return curve["dev"][-1][1], curve, model, inputs


def finetune(source: M.Source, task: Task, opts: Options) -> dict:
    """Every (learning rate, seed) of the grid on one task; the chosen rate's median and spread."""
    lrs = opts.task_model_lrs if source.elmo or opts.features else opts.lrs
    main = task.metrics[0]
    grid, kept, head = {}, {}, None
    for lr in lrs:
        runs, best = [], None
        for seed in opts.seeds:
            metrics, curve, model, inputs = run_one(source, task, lr, seed, opts)
            head = head or M.head_name(model)
            runs.append({"seed": seed, "metrics": metrics, "curve": curve})
            if opts.save_dir and not source.elmo and (best is None or metrics[main] > best[0]):  # ELMo's: not saved
                best = (metrics[main], model, inputs)
            else:
                del model
        values = [r["metrics"][main] for r in runs]
        grid[f"{lr:g}"] = {"median": statistics.median(values), "runs": runs}
        kept[f"{lr:g}"] = best  # (--save-model: each rate's best seed, until the rate is chosen)
    chosen = max(grid, key=lambda k: grid[k]["median"])
    best = kept[chosen]
    values = [r["metrics"][main] for r in grid[chosen]["runs"]]
    out = {"kind": task.kind, "metric": main, "lr": float(chosen), "median": statistics.median(values),
           "min": min(values), "max": max(values), "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
           "medians": {m: statistics.median(r["metrics"][m] for r in grid[chosen]["runs"]) for m in task.metrics},
           "seeds": len(values), "train_examples": len(task.train[:opts.max_train] if opts.max_train else task.train),
           "dev_examples": len(task.dev), "skipped": task.skipped, "grid": grid, "head": head}
    if best is not None and world()[0] == 0:
        with whole_dir(opts.save_dir) as tmp:  # (a refused write, Ctrl-C: no config.json without its weights)
            best[1].save(tmp, best[2].tok)
    return out
