"""One pretraining model for every family, read top to bottom: embeddings, blocks assembled from specs
(pretrain/models/layers.py), the heads of `cfg.heads`, and any heads an objective adds. It reads features from its
config (pretrain/models/config.py), never a family's name:

    norm          post: LayerNorm after each residual sum and on the embeddings (BERT, ERNIE);
                  pre: LayerNorm before each sublayer and a final one (GPT-2)
    activation    gelu (BERT) | gelu_tanh (GPT-2) | relu | tanh: the MLP's, and the heads' transforms
    causal        attention to earlier tokens only (GPT-2)
    attention_layers  each layer's attention: global, or local (a band of attention_window positions: GPT-3's
                  alternating dense and locally banded layers)
    heads         lm: the word embeddings as output projection (GPT-2); mlm: BERT's dense + activation + LayerNorm
                  transform first, plus a bias; nsp: pooler + 2-way classifier (NSP/SOP); rtd: ELECTRA's
                  discriminator head (dense + activation + a score per token) and a generator, a narrower masked LM
                  (`generator_size`) that reads this model's embeddings
    scaled_init   residual output projections initialised with std / sqrt(2 * layers) (GPT-2)
    position_encoding  learned: absolute positions 0, 1, ...; roberta: numbered from pad_token_id + 1, padding
                  tokens at pad_token_id (HF RoBERTa's create_position_ids_from_input_ids); relative: no position
                  table, attention adds NEZHA's fixed sinusoids of the clipped distance to keys and values
    embedding_size  embeddings narrower than the hidden states, projected up (ALBERT's factorisation); the MLM
                  head's transform maps back down to it for the tied output projection
    share_layers  none | all (one block run num_layers times, ALBERT) | attention | ffn (one attention or MLP
                  module, owned by the model, that every block calls)
    type_vocab_size, task_type_vocab_size: segment (BERT) and task-type (ERNIE 2.0) embeddings

Logits stay vocab-parallel: losses use the vocab-parallel cross-entropy. Nothing here knows about mixed precision or
data parallelism; ZeRO-3 learns from `external_parameters` which modules read another's parameters.
"""
from __future__ import annotations

import torch
from megatron.core import tensor_parallel as mtp
from megatron.core.transformer.spec_utils import build_module
from torch import nn

from pretrain import families
from pretrain import kernels as K
from pretrain.models.config import embedding_width
from pretrain.models.layers import (Context, Embeddings, Record, add_heads, block_spec, init_replicated, mask_padding,
                                     tied_logits, vocab_padding)
from pretrain.models.recompute import checkpoint, checkpointed_layers
from pretrain.parallel import mcore


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense (to the embedding width) + activation + LayerNorm, then the tied word
    embeddings plus a bias."""

    def __init__(self, cfg, vocab_per_rank: int):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, embedding_width(cfg))
        self.norm = nn.LayerNorm(embedding_width(cfg), eps=cfg.layer_norm_eps)
        self.activation = cfg.activation
        self.bias = nn.Parameter(torch.zeros(vocab_per_rank))
        mtp.set_tensor_model_parallel_attributes(self.bias, is_parallel=True, dim=0, stride=1)

    def forward(self, h, word: mtp.VocabParallelEmbedding, tp, labels=None, vocab_size: int = 0):
        x = self.norm(K.bias_act(self.dense(h), None, self.activation))
        if labels is not None:  # (summed loss, correct), the logits never whole
            return K.linear_cross_entropy(x, word.weight, self.bias, labels, vocab_size)
        return tied_logits(x, word, tp) + self.bias


class RTDHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation, then one score per token (replaced or original)."""

    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.activation = cfg.activation
        self.score = nn.Linear(cfg.hidden_size, 1)

    def forward(self, h):
        return self.score(K.bias_act(self.dense(h), None, self.activation)).squeeze(-1)


class Pretraining(nn.Module):
    """Embeddings, blocks and the heads of `cfg.heads`, plus `heads` an objective adds ({attribute: module}, e.g. ERNIE
    2.0's task classifiers, or a function making them: it is called last, so that their initial draws follow the
    model's), over TP group `tp` (default: the run's, or one rank outside a run).

    `forward` returns the outputs of the model's heads: vocab-parallel `logits` (only at `positions` when given: the
    LM head then runs on the masked tokens alone), with an nsp head `nsp_logits`, with an rtd head `rtd_logits`; with
    `hidden` the hidden states alone. `positions` is a boolean mask [b, s] or the flat indices of its True elements
    (found on the host: picking them needs no device sync).

    Unpadded batches (pretrain/data/packing.py) hold several samples per row: `position_ids` restart per sample,
    `sample_index` (1, 2, ... per sample, 0 for padding) replaces `attention_mask` and makes attention
    block-diagonal, and `cls_index` points at each sample's first token for the pooler. A mask of each sample's own
    comes as a span per token (`attend_lo` .. `attend_hi`: the positions it sees, UniLM's masks).

    With `labels` (those of `positions` for masked LM) the LM head returns `lm_loss`, (summed loss, correct
    predictions), from the fused linear cross-entropy instead of logits (TP=1; `kernels.linear_cross_entropy`).

    With an rtd head (ELECTRA), given `sample` (a function of the generator's logits at `positions` to token ids), the
    generator first fills the masked positions with its samples (`generator_logits`, and `input_ids`: the corrupted
    input the discriminator scored)."""

    def __init__(self, cfg, heads: dict[str, nn.Module] | None = None, tp=None):
        super().__init__()
        self.cfg, self.tp = cfg, tp or mcore.tp_group()
        ctx = Context.of(cfg, self.tp)
        self.embeddings = Embeddings(ctx)
        shared = {"attention": "attn", "ffn": "mlp"}.get(cfg.share_layers)
        if shared:  # ALBERT's shared sublayer: one module, owned here, called by every block
            self.shared = build_module(getattr(block_spec(cfg).submodules, "attention" if shared == "attn" else "mlp"),
                                       ctx)
        blocks = 1 if cfg.share_layers == "all" else cfg.num_layers
        self.blocks = nn.ModuleList(build_module(block_spec(cfg, layer=i), ctx,
                                                 shared={shared: self.shared} if shared else None)
                                    for i in range(blocks))
        self.checkpointed = checkpointed_layers(cfg.activation_checkpointing, cfg.num_layers)
        if cfg.norm == "pre":
            self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        if "mlm" in cfg.heads:
            self.mlm = MLMHead(cfg, self.embeddings.word.num_embeddings_per_partition)
        if "nsp" in cfg.heads:
            self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)
            self.nsp = nn.Linear(cfg.hidden_size, 2)
        if "rtd" in cfg.heads:
            self.rtd = RTDHead(cfg)
        init_replicated(self, cfg.init_std)
        wire = families.get(cfg.arch).wire
        if wire:  # what the family builds beyond the features (ELECTRA's generator), after the initialisation
            wire(self)  # above: it initialises itself
        self.register_buffer("vocab_padding", vocab_padding(cfg, self.tp), persistent=False)
        self.added = add_heads(self, heads)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None, position_ids=None,
               sample_index=None, attend_lo=None, attend_hi=None, trace: dict | None = None):
        """Hidden states [b, s, hidden]. `trace`, {"hidden_states": [], "attention_scores": []}, takes every layer's:
        the embeddings' output and each block's, and each block's q k^T / sqrt(d) [b, heads / tp, s, s] before the
        mask (TinyBERT)."""
        x = self.embeddings(input_ids, token_type_ids, task_type_ids, position_ids)
        record = {} if trace is None else {"scores": Record()}
        if trace is not None:
            trace["hidden_states"].append(x)
        mask = None
        if attend_lo is not None:  # [b, 1, s, s]: each token sees the positions of its span
            mask = span_mask(attend_lo, attend_hi)[:, None]
        elif sample_index is not None:  # [b, 1, s, s]: within a sample (padding attends to padding)
            mask = sample_index[:, None, :, None] == sample_index[:, None, None, :]
        elif attention_mask is not None and not self.cfg.causal:
            mask = attention_mask[:, None, None, :].bool()  # [b, 1, 1, s]: True = attend
        for i in range(self.cfg.num_layers):
            block = self.blocks[i % len(self.blocks)]  # one block for every layer with share_layers=all
            x = checkpoint(block, x, mask, **record) if i in self.checkpointed and self.training else \
                block(x, mask, **record)
            if trace is not None:
                trace["hidden_states"].append(x)
        if trace is not None:
            trace["attention_scores"].extend(record["scores"].tensors)
        return self.final_norm(x) if self.cfg.norm == "pre" else x

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None, *, positions=None,
                labels=None, sample=None, hidden=False, with_hidden=False, layers=False, cls_index=None, **fields):
        """The heads' outputs (with `with_hidden`, the last hidden states too: DistilBERT; with `layers`, every layer's
        `hidden_states` and `attention_scores`, as `encode` traces them: TinyBERT); `fields`: what `encode` takes
        beyond the inputs (position_ids, sample_index, attend_lo, attend_hi)."""
        out = {}
        if sample is not None:
            input_ids, out = self.corrupt(input_ids, attention_mask, token_type_ids, positions, sample)
        if layers:
            out = {**out, "hidden_states": [], "attention_scores": []}
            fields["trace"] = out
        h = self.encode(input_ids, attention_mask, token_type_ids, task_type_ids, **fields)
        if hidden:  # the objective runs its heads on the hidden states (ERNIE 2.0)
            return {**out, "hidden": h}
        for name in self.cfg.heads:
            out.update(getattr(self, f"_{name}_outputs")(h, positions, labels, cls_index))
        return {**out, "hidden": h} if with_hidden else out

    # ---- the heads' outputs, one method per kind of head (`cfg.heads`) -----------------------------------------

    def _lm_outputs(self, h, positions, labels, cls_index):
        predicted = h if positions is None else h.flatten(0, 1)[positions.flatten()]
        if labels is None:
            return {"logits": self.lm_logits(predicted)}
        return {"lm_loss": K.linear_cross_entropy(predicted.flatten(0, -2), self.embeddings.word.weight, None,
                                                  labels.flatten(), self.cfg.vocab_size)}

    def _mlm_outputs(self, h, positions, labels, cls_index):
        predicted = h if positions is None else h.flatten(0, 1)[positions.flatten()]
        if labels is None:
            return {"logits": self.lm_logits(predicted)}
        return {"lm_loss": self.mlm(predicted, self.embeddings.word, self.tp, labels, self.cfg.vocab_size)}

    def _nsp_outputs(self, h, positions, labels, cls_index):
        return {"nsp_logits": self.nsp_logits(h, cls_index)}

    def _rtd_outputs(self, h, positions, labels, cls_index):
        return {"rtd_logits": self.rtd(h)}

    def corrupt(self, input_ids, attention_mask, token_type_ids, positions, sample):
        """ELECTRA: the generator's samples replace the tokens at `positions`; (the corrupted ids, the generator's
        outputs)."""
        logits = self.generator(input_ids, attention_mask, token_type_ids, positions=positions)["logits"]
        drawn = sample(logits.detach())
        input_ids = input_ids.flatten().index_put((positions.flatten(),), drawn).view_as(input_ids)
        return input_ids, {"generator_logits": logits, "input_ids": input_ids}

    def lm_logits(self, h):
        """Vocab-parallel logits of hidden states (through the MLM transform with an mlm head), padding rows
        masked."""
        word = self.embeddings.word
        logits = self.mlm(h, word, self.tp) if "mlm" in self.cfg.heads else tied_logits(h, word, self.tp)
        return mask_padding(logits, self.vocab_padding)

    def nsp_logits(self, h, cls_index=None):
        """The pooled [CLS] state through the NSP/SOP head."""
        return self.nsp(self.pooled(h, cls_index))

    def external_parameters(self):
        """(module, parameter) pairs where a module's forward reads a parameter that another module owns (ZeRO-3
        gathers a parameter only for its owner's forward unless told: pretrain/engine.py registers these): the LM
        heads read the tied word embeddings, a post-LN block passes its LayerNorms' weights to the fused residual +
        LayerNorm kernel; a model inside this one (ELECTRA's generator, on this model's embeddings; a distillation
        teacher, on its own) alike; and an objective's head that reads this model's (its `reads(model)`: SpanBERT's SBO
        head, the tied word embeddings)."""
        for name in self.added:
            yield from getattr(getattr(self, name), "reads", lambda model: ())(self)
        for m in (self, *(c for c in self.children() if isinstance(c, Pretraining))):
            yield (m.mlm if "mlm" in m.cfg.heads else m), m.embeddings.word.weight
            for block in m.blocks:
                if not block.pre_ln:
                    for norm in (block.attn_norm, block.mlp_norm):
                        yield block, norm.weight
                        yield block, norm.bias

    def pooled(self, h, cls_index=None):
        """tanh(pooler(h[CLS])): each row's first token, or the tokens at flat `cls_index` of a packed batch."""
        return torch.tanh(self.pooler(h[:, 0] if cls_index is None else h.flatten(0, 1)[cls_index]))


def span_mask(lo, hi):
    """[b, s, s] True where token i attends to position j: lo[b, i] <= j <= hi[b, i]."""
    j = torch.arange(lo.shape[-1], device=lo.device)
    return (j >= lo[..., None]) & (j <= hi[..., None])
