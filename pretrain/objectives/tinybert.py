"""TinyBERT's distillation (Jiao et al. 2020) of a frozen BERT-family teacher into a student of any smaller width and
depth, on masked-LM samples (RoBERTa's full sentences, as `mlm`), in two stages:

    layers      (`distill.layer_steps` optimizer steps) mean squared errors, each over the real tokens:
                embedding   the embeddings' output, the student's through the learned projection `fit` (a linear map
                            from its width to the teacher's, TinyBERT's fit_dense)
                hidden      each student layer m's output, projected, against teacher layer g(m) = m N / M's
                attention   each student layer m's attention scores q k^T / sqrt(d) before the mask (every head,
                            between real tokens), against teacher layer g(m)'s, head by head
                each term the sum over the mapped layers of their mean (TinyBERT's loss)
    prediction  (the rest of train.steps) the soft-target cross-entropy of the MLM logits at `distill.temperature`
                (TinyBERT uses 1) over the masked tokens; the last layer's hidden-state error watched (weight 0)

beside them the student's masked-LM loss and accuracy (weight 0: watched, not trained) and the teacher's. The teacher
is loaded, split by TP, frozen and run under no_grad as for DistilBERT (pretrain/objectives/distillation.py); its
attention heads must number the student's. The student starts at random (TinyBERT's general distillation) and is a
plain BERT: it exports as BertForMaskedLM (BertModel reads it too); `fit` stays in ptm's checkpoints.
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain.objectives.distillation import Distil

ORDER = 150


@dataclass(frozen=True)
class Stage:
    name: str  # layers | prediction
    steps: int


class TinyBert(Distil):
    name = "tinybert"
    help = ("TinyBERT's distillation from a frozen teacher: embeddings, attention scores and hidden states (MSE, "
            "through a learned projection), then the prediction layer (soft targets)")
    headline = ("hidden_loss", "attention_loss", "soft_loss", "mlm_acc")
    student_arch = "bert"

    def check(self, cfg, need) -> None:
        super(Distil, self).check(cfg, need)
        d, m = cfg.distill, cfg.model
        need(-1 <= d.layer_steps <= cfg.train.steps, f"distill.layer_steps={d.layer_steps} is outside -1 .. train.steps="
                                               f"{cfg.train.steps}; set it within (-1: layer-wise distillation throughout)")
        need(cfg.data.masking != "knowledge", "data.masking=knowledge has stages of its own; TinyBERT's stages are "
                                              "distill.layer_steps: use another masking")
        teacher = self.check_teacher(cfg, need)
        if teacher is None:
            return
        need(teacher.num_heads == m.num_heads,
             f"distill.teacher={d.teacher} has {teacher.num_heads} attention heads, the student {m.num_heads}: "
             f"TinyBERT matches attention scores head by head; set model.num_heads={teacher.num_heads}")
        need(teacher.num_layers % m.num_layers == 0,
             f"distill.teacher={d.teacher} has {teacher.num_layers} layers: TinyBERT's uniform mapping (student "
             f"layer m learns teacher layer m N / M) needs model.num_layers to divide it (now {m.num_layers})")

    # ---- the stages -------------------------------------------------------------------------------------------

    def phases(self) -> list:
        steps, layers = self.cfg.train.steps, self.cfg.distill.layer_steps
        return [Stage("layers", layers), Stage("prediction", steps - layers)] if 0 < layers < steps else []

    def phase_index(self, step: int) -> int:
        return int(bool(self.phases()) and step >= self.cfg.distill.layer_steps)

    def phase(self, step: int) -> Stage:
        layers = self.cfg.distill.layer_steps
        return Stage("layers" if layers < 0 or step < layers else "prediction", 0)

    def idle(self, phase) -> tuple[str, ...]:
        """The MLM head in the layer-wise stage, the projection `fit` in the prediction stage: only a watched term
        (weight 0) reaches them there, a zero gradient."""
        return ("mlm",) if phase.name == "layers" else ("fit",)

    def describe(self, phase) -> str:
        return {"layers": "layer-wise distillation (embeddings, attention scores, hidden states)",
                "prediction": "prediction-layer distillation (soft targets)"}[phase.name]

    def source(self, path, corpus, docs, phase, cache_dir=None):
        return super().source(path, corpus, docs, None, cache_dir)  # the same samples in both stages

    # ---- the student ------------------------------------------------------------------------------------------

    def heads(self, cfg, frozen: bool = True) -> dict:
        """The teacher (with `frozen`) and `fit`, the projection of the student's hidden states to the teacher's
        width (initialised as the model's linears)."""
        from torch import nn

        fit = nn.Linear(cfg.model.hidden_size, self.teacher_or_student(cfg).hidden_size)
        nn.init.normal_(fit.weight, std=cfg.model.init_std)
        nn.init.zeros_(fit.bias)
        return {**super().heads(cfg, frozen), "fit": fit}

    def head_parameters(self, cfg) -> int:
        return (cfg.model.hidden_size + 1) * self.teacher_or_student(cfg).hidden_size

    def teacher_or_student(self, cfg):
        """The teacher's ModelConfig; where it cannot be read (`ptm plan` away from it), the student's in its place."""
        try:
            return self.teacher(cfg)
        except FileNotFoundError:
            return cfg.model

    def initialise(self, model) -> None:
        """TinyBERT's student starts at random."""

    def kept_bytes(self, cfg, micro_batch: int) -> int:
        """Stage 1's traces until the loss is computed: the teacher's hidden states and scores of every layer (in
        the training dtype), the student's scores beside SDPA (kept for the backward pass) and the fp32 differences
        of the mapped layers' (each rank its heads)."""
        m, s, b, t = cfg.model, cfg.data.seq_len, micro_batch, cfg.parallel.tp
        size = 4 if cfg.precision == "fp32" else 2
        teacher = self.teacher_or_student(cfg)
        scores = b * s * s * m.num_heads // t
        return (teacher.num_layers * (b * s * teacher.hidden_size + scores) * size
                + m.num_layers * (scores * (size + 4) + b * s * teacher.hidden_size * 4))

    # ---- the loss ---------------------------------------------------------------------------------------------

    def select(self, batch, phase=None):
        masked = batch["labels"] != -100
        tokens = batch["attention_mask"].bool()
        if phase is not None and phase.name == "prediction":
            return {"soft": masked, "last_hidden": tokens, "mlm": masked}
        return {"embedding": tokens, "hidden": tokens, "mlm": masked}

    def elements(self, batch, phase=None):
        """Besides the tokens, the attention term's: (query, key) pairs of real tokens, per layer."""
        out = super().elements(batch, phase)
        if "hidden" in out:
            n = batch["attention_mask"].sum(1)
            out["attention"] = (n * n).sum()
        return out

    def compute(self, model, batch, phase=None, fused=False):
        import torch

        from pretrain import losses

        phase = phase or self.phase(0)
        layers = phase.name == "layers"
        where = self.where(batch, phase)
        masked = where["mlm"]
        target = losses.pick(batch["labels"], masked, 2)
        inputs = (batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        traced = {"layers": True} if layers else {"with_hidden": True}
        out = model(*inputs, positions=masked, **traced)
        with torch.no_grad():
            teacher = model.teacher(*inputs, positions=masked, **traced)
        mask = batch["attention_mask"]
        terms = self.layer_terms(model.fit, out, teacher, mask) if layers else {
            "soft": losses.Term(losses.soft_cross_entropy(out["logits"], teacher["logits"], self.cfg.distill.temperature)
                                .sum(), target.new_full((), len(target))),
            # watched (weight 0), and so that `fit` gets a zero gradient rather than none: ZeRO-3 would otherwise
            # keep stage 1's last gradient of it in the norm (and step on it), ZeRO 1-2 would not
            "last_hidden": losses.Term(squared_error(model.fit, out["hidden"], teacher["hidden"], mask),
                                       mask.sum().long(), weight=0.0)}
        # the cross-entropies come after the soft targets: they overwrite fp32 logits in place (kernels.cross_entropy)
        mlm = losses.token_term(out["logits"], target)
        mlm.weight = 0.0  # watched: the student's masked LM (trained through the teacher's)
        with torch.no_grad():
            judged = losses.token_term(teacher["logits"], target)
        mlm.ratios = {"teacher_mlm_loss": (judged.loss, judged.count), "teacher_mlm_acc": (judged.correct, judged.count)}
        return {**terms, "mlm": mlm}

    def layer_terms(self, fit, student: dict, teacher: dict, attention_mask) -> dict:
        """The layer-wise terms: summed squared errors over the real tokens (and pairs of them), each layer's divided
        by its width (by the heads for the scores) so that the term over its element count is the sum of the layers'
        means."""
        import torch
        from megatron.core import tensor_parallel as mtp

        from pretrain import losses
        from pretrain.parallel import mcore

        tokens = attention_mask.float()
        pairs = tokens[:, None, :, None] * tokens[:, None, None, :]  # [b, 1, s, s]
        hs, ht = student["hidden_states"], teacher["hidden_states"]
        step = (len(ht) - 1) // (len(hs) - 1)  # teacher layers per student layer

        def hidden(s, t):
            return squared_error(fit, s, t, attention_mask)

        scores = sum(((s.float() - t.float()) ** 2 * pairs).sum() for s, t in
                     zip(student["attention_scores"], teacher["attention_scores"][step - 1::step]))
        scores = mtp.reduce_from_tensor_model_parallel_region(scores, group=mcore.tp_group())  # the other heads
        total = torch.stack([hidden(s, t) for s, t in zip(hs[1:], ht[step::step])]).sum()
        count, real = attention_mask.sum().long(), attention_mask.sum(1).long()
        return {"embedding": losses.Term(hidden(hs[0], ht[0]), count), "hidden": losses.Term(total, count),
                "attention": losses.Term(scores / self.cfg.model.num_heads, (real * real).sum())}


def squared_error(fit, student, teacher, attention_mask):
    """The squared error of the projected student states and the teacher's, summed over the real tokens and averaged
    over the teacher's width."""
    return ((fit(student).float() - teacher.float()) ** 2 * attention_mask[..., None]).sum() / teacher.shape[-1]


OBJECTIVES = (TinyBert(),)
