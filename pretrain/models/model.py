"""One transformer for BERT, GPT-2 and ERNIE, read top to bottom. It reads features from its config
(pretrain/models/config.py), never an architecture name:

    norm          post: LayerNorm after each residual sum and on the embeddings (BERT, ERNIE);
                  pre: LayerNorm before each sublayer and a final one (GPT-2)
    activation    gelu (BERT) | gelu_tanh (GPT-2)
    causal        attention to earlier tokens only (GPT-2)
    heads         lm: the word embeddings as output projection (GPT-2); mlm: BERT's dense + GELU + LayerNorm
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

The linear layers and the word embeddings are megatron-core's tensor-parallel layers, so the same code
runs with the weights split over `tp` ranks (heads and MLP columns split, vocabulary split); with tp=1
they are ordinary layers. Logits stay vocab-parallel: losses use the vocab-parallel cross-entropy.
Nothing here knows about ZeRO, mixed precision or data parallelism.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel as tp
from torch import nn
from torch.utils.checkpoint import checkpoint

from pretrain import kernels as K
from pretrain.models.config import embedding_width, generator_config, padded_vocab_size
from pretrain.parallel import mcore


class Embeddings(nn.Module):
    def __init__(self, cfg, mp_config, init):
        super().__init__()
        e = embedding_width(cfg)
        self.word = tp.VocabParallelEmbedding(padded_vocab_size(cfg), e, init_method=init, config=mp_config,
                                              tp_group=mcore.tp_group())
        self.position = nn.Embedding(cfg.max_position_embeddings, e) if cfg.position_encoding != "relative" else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.task_type = nn.Embedding(cfg.task_type_vocab_size, e) if cfg.task_type_vocab_size else None
        self.norm = nn.LayerNorm(e, eps=cfg.layer_norm_eps) if cfg.norm == "post" else None
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.proj = nn.Linear(e, cfg.hidden_size) if e != cfg.hidden_size else None
        self.pad = cfg.pad_token_id if cfg.position_encoding == "roberta" else None

    def share(self, other: "Embeddings") -> None:
        """Use `other`'s tables and LayerNorm (ELECTRA's generator reads the discriminator's) without owning them:
        their parameters exist once; this module keeps only its projection."""
        for name in ("word", "position", "token_type", "task_type", "norm"):
            if self._modules.pop(name, None) is not None:
                object.__setattr__(self, name, getattr(other, name))

    def forward(self, input_ids, token_type_ids=None, task_type_ids=None, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        if self.pad is not None:
            position_ids = torch.where(input_ids == self.pad, self.pad, position_ids + self.pad + 1)
        x = self.word(input_ids)
        if self.position is not None:
            x = x + self.position(position_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        if self.task_type is not None:
            x = x + self.task_type(task_type_ids if task_type_ids is not None else torch.zeros_like(input_ids))
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        return self.proj(x) if self.proj is not None else x


def relative_positions(length: int, depth: int, max_distance: int, device=None) -> torch.Tensor:
    """NEZHA's functional relative position encoding [length, length, depth]: for query i and key j, sines (even
    dimensions) and cosines (odd) of (clip(j - i, +-max_distance) + max_distance) / 10000^(2k / depth), the
    clipped distance shifted to 0..2 * max_distance as NEZHA's tables index it. Nothing is learned."""
    index = torch.arange(length, device=device)
    distance = (index[None, :] - index[:, None]).clamp(-max_distance, max_distance) + max_distance
    frequency = torch.exp(torch.arange(0, depth, 2, device=device).float() * (-math.log(10000.0) / depth))
    angle = distance[..., None].float() * frequency
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)


class Attention(nn.Module):
    """Multi-head self-attention; each TP rank owns num_heads / tp whole heads. The fused QKV weight is
    laid out per head as [head][q, k, v][head_dim] (Megatron's layout) so a column split keeps heads whole.
    With relative positions (NEZHA) the scores add q . a_ij and the output p_ij . a_ij, so attention is computed
    here instead of by torch's fused kernel."""

    def __init__(self, cfg, mp_config, init, out_init):
        super().__init__()
        self.heads = cfg.num_heads // mcore.tp_size()
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.causal = cfg.causal
        self.relative = cfg.max_relative_position if cfg.position_encoding == "relative" else None
        self.dropout = cfg.attention_dropout
        self.qkv = tp.ColumnParallelLinear(cfg.hidden_size, 3 * cfg.hidden_size, config=mp_config, init_method=init,
                                           bias=True, gather_output=False, tp_group=mcore.tp_group())
        self.out = tp.RowParallelLinear(cfg.hidden_size, cfg.hidden_size, config=mp_config, init_method=out_init,
                                        bias=True, input_is_parallel=True, skip_bias_add=True, tp_group=mcore.tp_group())

    def forward(self, x, mask):
        b, s, _ = x.shape
        qkv, _ = self.qkv(x)
        q, k, v = qkv.view(b, s, self.heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)  # 3 x [b, heads, s, d]
        p = self.dropout if self.training else 0.0
        y = _on_tp_generator(self._attend, q, k, v, mask, p) if p else self._attend(q, k, v, mask, p)
        return self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))  # (output, bias)

    def _attend(self, q, k, v, mask, p):
        if self.relative is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=self.causal)
        return self._relative(q, k, v, mask, p)

    def _relative(self, q, k, v, mask, p):
        s = q.shape[2]
        a = relative_positions(s, self.head_dim, self.relative, q.device).to(q.dtype)  # [s, s, d]
        scores = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a)) / math.sqrt(self.head_dim)
        if self.causal:
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = F.dropout(scores.float().softmax(-1).to(q.dtype), p)
        return probs @ v + torch.einsum("bhij,ijd->bhid", probs, a)


@torch.compiler.disable
def _on_tp_generator(fn, *args):
    """fn(*args) drawing its dropout from this rank's tensor-parallel generator (the RNG tracker's fork: dropout on
    this rank's heads). Eager even inside a compiled block, so that no compiled graph switches generators
    (`_checkpoint` says why that matters)."""
    with mcore.rng_tracker().fork():
        return fn(*args)


class MLP(nn.Module):
    def __init__(self, cfg, mp_config, init, out_init):
        super().__init__()
        self.approximate = _approximation(cfg)
        self.fc1 = tp.ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, config=mp_config, init_method=init,
                                           bias=True, gather_output=False, skip_bias_add=True, tp_group=mcore.tp_group())
        self.fc2 = tp.RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, config=mp_config, init_method=out_init,
                                        bias=True, input_is_parallel=True, skip_bias_add=True, tp_group=mcore.tp_group())

    def forward(self, x):
        h, bias = self.fc1(x)
        return self.fc2(K.bias_gelu(h, bias, self.approximate))  # (output, bias)


class Block(nn.Module):
    """A transformer layer, post-LN or pre-LN. `shared`: an Attention or MLP that the model owns and other blocks
    call too; the block uses it without registering it, so its parameters exist once."""

    def __init__(self, cfg, mp_config, init, out_init, shared: nn.Module | None = None):
        super().__init__()
        self.pre_ln = cfg.norm == "pre"
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        for name, cls in (("attn", Attention), ("mlp", MLP)):
            if isinstance(shared, cls):
                object.__setattr__(self, name, shared)
            else:
                setattr(self, name, cls(cfg, mp_config, init, out_init))
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x, mask):
        if self.pre_ln:
            y, bias = self.attn(self.attn_norm(x), mask)
            x = x + self.dropout(y + bias)
            y, bias = self.mlp(self.mlp_norm(x))
            return x + self.dropout(y + bias)
        y, bias = self.attn(x, mask)
        x = K.layer_norm(self.dropout(y + bias), self.attn_norm.weight, self.attn_norm.bias, self.attn_norm.eps, x)
        y, bias = self.mlp(x)
        return K.layer_norm(self.dropout(y + bias), self.mlp_norm.weight, self.mlp_norm.bias, self.mlp_norm.eps, x)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense (to the embedding width) + activation + LayerNorm, then the tied word
    embeddings plus a bias."""

    def __init__(self, cfg, vocab_per_rank: int):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, embedding_width(cfg))
        self.norm = nn.LayerNorm(embedding_width(cfg), eps=cfg.layer_norm_eps)
        self.approximate = _approximation(cfg)
        self.bias = nn.Parameter(torch.zeros(vocab_per_rank))
        tp.set_tensor_model_parallel_attributes(self.bias, is_parallel=True, dim=0, stride=1)

    def forward(self, h, word: tp.VocabParallelEmbedding, labels=None, vocab_size: int = 0):
        x = self.norm(F.gelu(self.dense(h), approximate=self.approximate))
        if labels is not None:  # (summed loss, correct), the logits never whole
            return K.linear_cross_entropy(x, word.weight, self.bias, labels, vocab_size)
        return _tied_logits(x, word) + self.bias


class RTDHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation, then one score per token (replaced or original)."""

    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.approximate = _approximation(cfg)
        self.score = nn.Linear(cfg.hidden_size, 1)

    def forward(self, h):
        return self.score(F.gelu(self.dense(h), approximate=self.approximate)).squeeze(-1)


class Pretraining(nn.Module):
    """Embeddings, blocks and the heads of `cfg.heads`. `forward` returns vocab-parallel logits (only at
    `positions` when given: the MLM head is then run on the masked tokens alone) and, with an nsp head, the
    NSP/SOP logits. `positions` is a boolean mask [b, s] or the flat indices of its True elements (found on the
    host: picking them needs no device sync).

    Unpadded batches (pretrain/data/packing.py) hold several samples per row: `position_ids` restart per
    sample, `sample_index` (1, 2, ... per sample, 0 for padding) replaces `attention_mask` and makes attention
    block-diagonal, and `cls_index` points at each sample's first token for the pooler.

    With `labels` (those of `positions` for masked LM) the LM head returns `lm_loss`, (summed loss, correct
    predictions), from the fused linear cross-entropy instead of logits (TP=1; `kernels.linear_cross_entropy`).

    With an rtd head (ELECTRA) `forward` returns `rtd_logits` [b, s]; given `sample` (a function of the generator's
    logits at `positions` to token ids), the generator first fills the masked positions with its samples
    (`generator_logits`, `input_ids`: the corrupted input the discriminator scored)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        mp_config = mcore.model_parallel_config()
        init = _normal(cfg.init_std)
        out_init = _normal(cfg.init_std / math.sqrt(2 * cfg.num_layers)) if cfg.scaled_init else init
        self.embeddings = Embeddings(cfg, mp_config, init)
        share = cfg.share_layers
        self.shared = {"attention": Attention, "ffn": MLP}[share](cfg, mp_config, init, out_init) \
            if share in ("attention", "ffn") else None
        self.blocks = nn.ModuleList(Block(cfg, mp_config, init, out_init, self.shared)
                                    for _ in range(1 if share == "all" else cfg.num_layers))
        self.checkpointed = _checkpointed_layers(cfg.activation_checkpointing, cfg.num_layers)
        if cfg.norm == "pre":
            self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        if "mlm" in cfg.heads:
            self.mlm = MLMHead(cfg, self.embeddings.word.num_embeddings_per_partition)
        if "nsp" in cfg.heads:
            self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)
            self.nsp = nn.Linear(cfg.hidden_size, 2)
        if "rtd" in cfg.heads:
            self.rtd = RTDHead(cfg)
        self._init_replicated(cfg.init_std)
        if "rtd" in cfg.heads:  # built after the initialisation above: it initialises itself
            self.generator = Pretraining(generator_config(cfg))
            self.generator.embeddings.share(self.embeddings)
        vocab = padded_vocab_size(cfg)
        first = mcore.tp_rank() * (vocab // mcore.tp_size())
        ids = torch.arange(first, first + vocab // mcore.tp_size())
        self.register_buffer("vocab_padding", ids >= cfg.vocab_size, persistent=False)

    def _init_replicated(self, std):
        """Layers outside megatron-core (replicated on every TP rank) as BERT/GPT-2 initialise them."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=std)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, (tp.ColumnParallelLinear, tp.RowParallelLinear)):
                with torch.no_grad():
                    m.bias.zero_()

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None, position_ids=None,
               sample_index=None):
        """Hidden states [b, s, hidden]."""
        x = self.embeddings(input_ids, token_type_ids, task_type_ids, position_ids)
        mask = None
        if sample_index is not None:  # [b, 1, s, s]: within a sample (padding attends to padding)
            mask = sample_index[:, None, :, None] == sample_index[:, None, None, :]
        elif attention_mask is not None and not self.cfg.causal:
            mask = attention_mask[:, None, None, :].bool()  # [b, 1, 1, s]: True = attend
        for i in range(self.cfg.num_layers):
            block = self.blocks[i % len(self.blocks)]  # one block for every layer with share_layers=all
            x = _checkpoint(block, x, mask) if i in self.checkpointed and self.training else block(x, mask)
        return self.final_norm(x) if self.cfg.norm == "pre" else x

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, task_type_ids=None, positions=None,
                hidden=False, position_ids=None, sample_index=None, cls_index=None, labels=None, sample=None):
        out = {}
        if sample is not None:  # ELECTRA: the generator's samples replace the masked tokens
            logits = self.generator(input_ids, attention_mask, token_type_ids, positions=positions)["logits"]
            drawn = sample(logits.detach())
            input_ids = input_ids.flatten().index_put((positions.flatten(),), drawn).view_as(input_ids)
            out = {"generator_logits": logits, "input_ids": input_ids}
        h = self.encode(input_ids, attention_mask, token_type_ids, task_type_ids, position_ids, sample_index)
        if hidden:  # ERNIE 2.0's losses run their heads on the hidden states
            return {"hidden": h}
        if "rtd" in self.cfg.heads:
            return {**out, "rtd_logits": self.rtd(h)}
        if "nsp" in self.cfg.heads:
            out["nsp_logits"] = self.nsp_logits(h, cls_index)
        predicted = h if positions is None else h.flatten(0, 1)[positions.flatten()]
        if labels is None:
            out["logits"] = self.lm_logits(predicted)
        elif "mlm" in self.cfg.heads:
            out["lm_loss"] = self.mlm(predicted, self.embeddings.word, labels, self.cfg.vocab_size)
        else:
            out["lm_loss"] = K.linear_cross_entropy(predicted.flatten(0, -2), self.embeddings.word.weight, None,
                                                    labels.flatten(), self.cfg.vocab_size)
        return out

    def lm_logits(self, h):
        """Vocab-parallel logits of hidden states (through the MLM transform with an mlm head), padding rows
        masked."""
        logits = self.mlm(h, self.embeddings.word) if "mlm" in self.cfg.heads else _tied_logits(h, self.embeddings.word)
        return logits.masked_fill(self.vocab_padding, torch.finfo(logits.dtype).min)

    def nsp_logits(self, h, cls_index=None):
        """The pooled [CLS] state through the NSP/SOP head."""
        return self.nsp(self.pooled(h, cls_index))

    def pooled(self, h, cls_index=None):
        """tanh(pooler(h[CLS])): each row's first token, or the tokens at flat `cls_index` of a packed batch."""
        return torch.tanh(self.pooler(h[:, 0] if cls_index is None else h.flatten(0, 1)[cls_index]))


def _tied_logits(h, word: tp.VocabParallelEmbedding):
    """h @ word_embeddings.T for this rank's vocabulary slice; the input's gradient is summed over TP."""
    return F.linear(tp.copy_to_tensor_model_parallel_region(h), word.weight)


def _approximation(cfg) -> str:
    """F.gelu's `approximate` for the config's activation."""
    return "tanh" if cfg.activation == "gelu_tanh" else "none"


def _normal(std):
    return lambda w: nn.init.normal_(w, mean=0.0, std=std)


def _checkpointed_layers(setting, num_layers) -> set[int]:
    if setting is True:
        return set(range(num_layers))
    return set(setting or ())


def _checkpoint(block, x, mask):
    """Activation checkpointing whose recomputation draws the dropout masks of the forward, eager or compiled, on
    CPU or CUDA, by construction: each of the two generators dropout draws from is set back to its state at the
    forward before the block runs again.
    * The default generator (hidden dropout; in a compiled block Inductor's kernels draw their seeds from it):
      torch's checkpoint restores the CPU generator and those of the inputs' CUDA devices (preserve_rng_state).
    * The TP RNG tracker (attention dropout on this rank's heads; megatron's CudaRNGStatesTracker on CUDA, ptm's
      CpuRNGStatesTracker on CPU): its states are taken here and set again around the recomputation. They are
      tensors that each fork replaces, never changes in place (megatron's tracker without CUDA-graph-safe RNG, as
      ptm seeds it). Its fork runs eager even in a compiled block (`_on_tp_generator`), so no compiled graph
      holds a generator switch or a generator state: a graph draws from the default generator as it finds it, like
      an eager kernel, and the recomputation runs the same graphs (same shapes and grad mode) in the same order."""
    states = mcore.rng_tracker().get_states()
    ran = []

    def run(x, mask):
        if not ran:
            ran.append(True)
            return block(x, mask)
        current = mcore.rng_tracker().get_states()
        mcore.rng_tracker().set_states(states)
        try:
            return block(x, mask)
        finally:
            mcore.rng_tracker().set_states(current)

    return checkpoint(run, x, mask, use_reentrant=False)
