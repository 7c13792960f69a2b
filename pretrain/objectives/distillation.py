"""Knowledge distillation of a frozen BERT-family teacher into a student on masked-LM samples (RoBERTa's full sentences,
as `mlm`): DistilBERT (Sanh et al. 2019). Terms, each per element of the global batch:

    soft  the soft-target cross-entropy -sum_v p_t(v) log p_s(v) at temperature T (both softmaxes of logits / T),
          times T^2, over the masked tokens (`distill.soft_weight`, 5.0)
    mlm   the student's masked LM (`distill.mlm_weight`, 2.0)
    cos   1 - cosine of the student's and the teacher's last hidden states, over the real tokens
          (`distill.cosine_weight`, 1.0)

beside them the teacher's masked-LM loss and accuracy on the same tokens (`teacher_mlm_loss`, `teacher_mlm_acc`).

The teacher (`distill.teacher`: a ptm checkpoint or run, or a Hugging Face directory of a BERT-family model) is built
as this run's model is, on the same tensor-parallel group (its vocabulary and heads split alike; ZeRO-3 partitions it
with the student), frozen (no gradients, no optimizer state, not in the checkpoints: it is read again from
`distill.teacher` on every start), without dropout, and runs inside each step under no_grad, keeping no activations.
A new student starts from its teacher (`distill.init_from_teacher`): embeddings and heads, and student layer i from
teacher layer 2i (every other layer). The soft targets' softmaxes run over the vocabulary split by TP (max and sum
all-reduced), so every layout computes the same loss.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from pretrain.objectives.base import Section
from pretrain.objectives.masked_lm import Masked
from pretrain.schema import opt

ORDER = 140


@dataclass
class DistillConfig:
    teacher: str = opt("", "the frozen teacher: a ptm checkpoint or training out_dir, or a Hugging Face directory of a "
                           "BERT-family model (BERT, RoBERTa, ERNIE, ...)")
    temperature: float = opt(2.0, "softmax temperature of the soft targets", range="> 0")
    soft_weight: float = opt(5.0, "distil: weight of the soft-target cross-entropy (DistilBERT's alpha_ce)",
                             range=">= 0")
    mlm_weight: float = opt(2.0, "distil: weight of the student's masked LM (alpha_mlm)", range=">= 0")
    cosine_weight: float = opt(1.0, "distil: weight of the hidden states' cosine loss (alpha_cos)", range=">= 0")
    init_from_teacher: bool = opt(True, "distil: a new student starts from the teacher's embeddings and heads and "
                                        "every other teacher layer (student layer i = teacher layer 2i)")
    layer_steps: int = opt(-1, "tinybert: optimizer steps of layer-wise distillation (embeddings, attention scores, "
                               "hidden states) before prediction-layer distillation (soft targets) takes the rest; "
                               "-1: all of train.steps (TinyBERT's general distillation)")


def teacher_config(cfg):
    """The teacher's ModelConfig (from its checkpoint's meta.json or its Hugging Face config), padded as this run's
    vocabulary and without dropout; and where its weights are."""
    from pretrain import checkpoint as C

    path = cfg.distill.teacher
    if not os.path.exists(path):
        raise C.CheckpointError(f"distill.teacher={path} does not exist; pass a ptm checkpoint or run, or a Hugging "
                                f"Face directory of a BERT-family model")
    if os.path.isfile(os.path.join(path, "config.json")):
        from checkpoints_tools.hf import read_config
        from pretrain.models.config import ModelConfig

        family, hf = read_config(path)
        model = ModelConfig(**family.read_model_config(path, hf, read_config))
    else:
        path = C.check_complete(C.resolve(path))
        model = C.model_config(C.read_meta(path))
    return dataclasses.replace(model, vocab_pad_to=cfg.model.vocab_pad_to, hidden_dropout=0.0,
                               attention_dropout=0.0), path


def teacher_weights(model, path: str) -> dict:
    """The whole weights of the teacher at `path` (a checkpoint, or a Hugging Face directory)."""
    from pretrain import checkpoint as C

    if os.path.isfile(os.path.join(path, "config.json")):
        from checkpoints_tools.hf import import_weights, read_config

        family, hf = read_config(path)
        return import_weights(family, model, path, hf)[0]
    return C.load_full_model(path)


def load_teacher(cfg):
    """The frozen teacher on this rank: built as the run's model is, this TP rank's slice of its weights."""
    import torch

    from pretrain import checkpoint as C
    from pretrain import models
    from pretrain.families import VOCAB_ROWS
    from pretrain.parallel import mcore

    model_cfg, path = teacher_config(cfg)
    teacher = models.build(model_cfg)
    whole, rows = teacher_weights(model_cfg, path), model_cfg.padded_vocab
    tp, rank = mcore.tp_size(), mcore.tp_rank()
    with torch.no_grad():
        for name, p in teacher.named_parameters():
            t = whole[name]
            if name in VOCAB_ROWS and t.shape[0] < rows:
                t = torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])
            dim = C.split_dim(p)
            p.copy_(t if dim is None else t.chunk(tp, dim)[rank])
    return teacher.requires_grad_(False)


class Distil(Masked):
    name = "distil"
    help = "knowledge distillation from a frozen teacher: soft targets + masked LM + hidden-state cosine (DistilBERT)"
    one_lm_head = False  # the soft targets need the student's logits
    pair_task = "none"  # RoBERTa's full sentences
    section = Section("distill", DistillConfig)
    headline = ("soft_loss", "mlm_acc")
    student_arch = "distilbert, bert"

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        teacher, m = self.check_teacher(cfg, need), cfg.model
        if teacher is None:
            return
        need(teacher.hidden_size == m.hidden_size,
             f"distill.teacher={cfg.distill.teacher} has hidden size {teacher.hidden_size}; the cosine of hidden states "
             f"needs a teacher as wide as the student (model.hidden_size={m.hidden_size}), or use "
             f"data.objective=tinybert (a learned projection)")
        need(not cfg.distill.init_from_teacher or (teacher.num_layers >= 2 * m.num_layers - 1
                                                   and teacher.ffn_hidden_size == m.ffn_hidden_size
                                                   and teacher.num_heads == m.num_heads),
             f"distill.init_from_teacher: student layer i takes teacher layer 2i, so a teacher of "
             f"{teacher.num_layers} layers (MLP {teacher.ffn_hidden_size}, {teacher.num_heads} heads) teaches at "
             f"most {(teacher.num_layers + 1) // 2} layers of the same shape (model.num_layers={m.num_layers}); "
             f"or set distill.init_from_teacher=false")

    def check_teacher(self, cfg, need):
        """What every distillation asks of its teacher (given, readable, an mlm head, the student's words, split by
        TP as the student) and student; the teacher's ModelConfig, or None where it cannot be read."""
        d, m = cfg.distill, cfg.model
        need(bool(d.teacher), f"data.objective={self.name} needs a teacher: set distill.teacher=PATH (a ptm checkpoint "
                              f"or run, or a Hugging Face BERT-family directory)")
        need("mlm" in m.heads, f"data.objective={self.name} trains the student's mlm head but model.heads={m.heads}; "
                               f"use a model with an mlm head (arch {self.student_arch})")
        need(not cfg.data.unpadded, f"data.unpadded=true is not supported with data.objective={self.name}; remove it")
        if not d.teacher or not os.path.exists(d.teacher):
            return None
        from pretrain.checkpoint import tokenizer_sha256

        try:
            teacher, where = teacher_config(cfg)
        except Exception as e:  # noqa: BLE001 (the reader's own one-line reason)
            need(False, f"distill.teacher={d.teacher}: {str(e).splitlines()[0]}")
            return None
        theirs, mine = tokenizer_sha256(where), cfg.data.paths and tokenizer_sha256(cfg.data.paths[0])
        need(None in (theirs, mine) or theirs == mine,
             f"distill.teacher={d.teacher} has another tokenizer (sha256 {str(theirs)[:12]}) than data.path (sha256 "
             f"{str(mine)[:12]}): the soft targets need the student's words; build the dataset with the teacher's "
             f"tokenizer (data_prep build --tokenizer)")
        tp = cfg.parallel.tp
        if "mlm" not in teacher.heads or teacher.causal:  # (what else differs then says nothing more)
            need(False, f"distill.teacher={d.teacher} is not a bidirectional model with an mlm head (heads "
                        f"{teacher.heads}); the soft targets need one: pass a BERT-family teacher")
            return None
        need(not m.vocab_size or teacher.vocab_size == m.vocab_size,
             f"distill.teacher={d.teacher} has {teacher.vocab_size} words, the student {m.vocab_size}: they must "
             f"share the tokenizer")
        need(teacher.num_heads % tp == 0 and teacher.ffn_hidden_size % tp == 0,
             f"distill.teacher={d.teacher} ({teacher.num_heads} heads, MLP {teacher.ffn_hidden_size}) does not split "
             f"over parallel.tp={tp}: the teacher is split by TP as the student; choose a TP that divides both")
        return teacher

    def heads(self, cfg, frozen: bool = True) -> dict:
        return {"teacher": load_teacher(cfg)} if frozen else {}

    def teacher(self, cfg):
        if not os.path.exists(cfg.distill.teacher):
            raise FileNotFoundError(f"distill.teacher={cfg.distill.teacher} is not here")
        return teacher_config(cfg)[0]

    def initialise(self, model) -> None:
        """Student layer i <- teacher layer 2i; embeddings and the MLM head <- the teacher's (the student has no
        token types, the teacher's are left out)."""
        import torch

        if not self.cfg.distill.init_from_teacher:
            return
        theirs = dict(model.teacher.named_parameters())
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith("teacher."):
                    continue
                source = name
                if name.startswith("blocks."):
                    _, i, rest = name.split(".", 2)
                    source = f"blocks.{2 * int(i)}.{rest}"
                p.copy_(theirs[source])
        from pretrain.runlog import log

        log(f"the student starts from distill.teacher={self.cfg.distill.teacher}: its embeddings, MLM head and layers "
            f"{', '.join(str(2 * i) for i in range(len(model.blocks)))} (distill.init_from_teacher)")

    def select(self, batch, phase=None):
        masked = batch["labels"] != -100
        return {"soft": masked, "mlm": masked, "cos": batch["attention_mask"].bool()}

    def compute(self, model, batch, phase=None, fused=False):
        import torch
        import torch.nn.functional as F

        from pretrain import losses

        d = self.cfg.distill
        where = self.where(batch)
        masked, tokens = where["mlm"], where["cos"]
        target = losses.pick(batch["labels"], masked, 2)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        out = model(ids, mask, positions=masked, with_hidden=True)
        with torch.no_grad():
            teacher = model.teacher(ids, mask, batch.get("token_type_ids"), positions=masked, with_hidden=True)
        soft = losses.soft_cross_entropy(out["logits"], teacher["logits"], d.temperature)  # before the cross-entropies,
        # which overwrite fp32 logits in place (kernels.cross_entropy)
        s, t = losses.pick(out["hidden"], tokens, 2), losses.pick(teacher["hidden"], tokens, 2)
        cos = (1 - F.cosine_similarity(s.float(), t.float(), dim=-1)).sum()
        mlm = losses.token_term(out["logits"], target)
        mlm.weight = d.mlm_weight
        with torch.no_grad():  # the teacher on the same masked tokens, beside the student
            judged = losses.token_term(teacher["logits"], target)
        mlm.ratios = {"teacher_mlm_loss": (judged.loss, judged.count), "teacher_mlm_acc": (judged.correct, judged.count)}
        return {"soft": losses.Term(soft.sum(), target.new_full((), len(target)), weight=d.soft_weight),
                "mlm": mlm, "cos": losses.Term(cos, target.new_full((), len(s)), weight=d.cosine_weight)}


OBJECTIVES = (Distil(),)
