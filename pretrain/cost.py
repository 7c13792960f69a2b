"""What a model costs, from its config alone (no torch): parameters, training FLOPs, and the memory of its states
and activations. `ptm plan`, the speed model (pretrain/speed.py) and the trainer's MFU all count with it; the suite
holds its parameter count to the model built on the meta device for every preset.

    n = count_parameters(cfg.model, tp=2)                                   # one TP rank's parameters
    flops = flops_per_sample(cfg)
    layers, logits = activation_bytes(cfg, micro_batch=8)
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain import families, objectives
from pretrain.models.config import FUSED_CHUNK_BYTES, ModelConfig, embedding_width, normalises_embeddings
from pretrain.stacks import Stack, stack_flops

# bytes per parameter: (weights, gradients, fp32 master copy); Adam and LAMB add fp32 moments m and v
STATE_BYTES = {"fp32": (4, 4, 0), "bf16": (2, 2, 4), "fp16": (2, 2, 4)}
MOMENT_BYTES = 8
OFFLOAD_BYTES = 16  # per parameter of a ZeRO-Offload shard in CPU memory: fp32 weights, fp32 gradients, moments


def _family(m: ModelConfig):
    return families.get(m.arch).cost


def _own_stacks(m: ModelConfig, seq_len: int, decoder: int = 0, predicted: int | None = None) -> list[Stack]:
    own = _family(m).stacks(m, seq_len, decoder, seq_len if predicted is None else predicted)
    return own if own is not None else [Stack(m, m.num_layers, seq_len,
                                              keeps_scores=m.positional.pair_terms)]


def stacks(m: ModelConfig, seq_len: int, decoder: int = 0, predicted: int | None = None) -> list[Stack]:
    """The transformer stacks a model runs on sequences of `seq_len`, `predicted` tokens predicted (default all): its
    family's (an encoder-decoder's decoder on `decoder` tokens, default seq_len, reading the encoder's output; XLNet's
    query stream on the predicted tokens), then its companions' (ELECTRA's generator, its own sizes)."""
    return _own_stacks(m, seq_len, decoder, predicted) + [
        s for c in _family(m).companions(m) for s in _own_stacks(c, seq_len, decoder, predicted)]


def checkpointed(m: ModelConfig) -> int:
    """How many layers `model.activation_checkpointing` recomputes (of the encoder's, in an encoder-decoder)."""
    return Stack(m, m.num_layers, 0).recomputed


# ------------------------------------------------------------------------------------------ parameters

def _modules(m: ModelConfig, shared_embeddings: bool = False) -> list[tuple[int, int]]:
    """(TP-split, replicated) counts of the parameters each module of the model of `m` (`models.build`) owns
    directly; a shared layer (share_layers) once; `shared_embeddings`: the tables and their LayerNorm belong to
    another model (a companion's: ELECTRA's generator reads the discriminator's). Its family's cost hooks count what
    the transformer's formulas do not (an encoder-decoder's decoder, XLNet's attention, ELMo's LSTMs)."""
    family = _family(m)
    whole = family.modules(m)
    if whole is not None:
        return whole
    h, f, v, e, a = m.hidden_size, m.ffn_hidden_size, m.padded_vocab, embedding_width(m), m.attention_width
    bias, qkv_bias = (1 if m.bias else 0), (1 if m.bias and m.qkv_bias else 0)
    norm = h if m.norm_type == "rmsnorm" else 2 * h  # RMSNorm has no bias
    positions = m.max_position_embeddings if m.positional.table else 0
    tables = [(v * e, 0), (0, positions * e), (0, m.type_vocab_size * e), (0, m.task_type_vocab_size * e)]
    embeddings = ([] if shared_embeddings else tables) + ([(0, e * h + h)] if e != h else [])  # ALBERT's projection
    layer = family.layer_modules(m, {
        "norms": [(0, norm), (0, norm)],
        "attention": [(3 * h * a + 3 * a * qkv_bias, 0), (a * h, h * bias)],  # QKV (column), output (row: bias replicated)
        "mlp": [(f * h + f * bias, 0), (f * h, h * bias)] + ([(f * h + f * bias, 0)] if m.gated_mlp else [])})
    norms, attention, mlp = layer["norms"], layer["attention"], layer["mlp"]  # (the MLP: fc1, fc2, gate)
    if m.share_layers == "all":
        blocks = norms + attention + mlp
    else:
        shared = {"attention": attention, "ffn": mlp}.get(m.share_layers, [])
        blocks = (norms + (attention if m.share_layers != "attention" else [])
                  + (mlp if m.share_layers != "ffn" else [])) * m.num_layers + shared
    # the embedding LayerNorm (a shared one belongs to the other model) and the final one (pre-LN)
    embedding_norm = 2 * e if normalises_embeddings(m) else 0
    heads = ([(0, embedding_norm)] if embedding_norm and not shared_embeddings else []) + (
        [(0, norm)] if m.norm == "pre" else [])
    if "mlm" in m.heads:  # MLM bias (vocab-split), transform dense and LayerNorm; "lm" is the word embeddings
        heads += [(v, 0), (0, h * e + e), (0, 2 * e)]
    if "nsp" in m.heads:  # pooler, NSP/SOP classifier
        heads += [(0, h * h + h), (0, 2 * h + 2)]
    if "rtd" in m.heads:  # the discriminator head
        heads += [(0, h * h + h), (0, h + 1)]
    heads += family.more_modules(m, layer, dict(norm=norm, positions=positions * e, embedding_norm=embedding_norm,
                                                vocab=v))
    for companion in family.companions(m):
        heads += _modules(companion, shared_embeddings=True)
    return embeddings + blocks + heads


def count_parameters(m: ModelConfig, tp: int = 1) -> int:
    """Parameters of the model of `m` on one of `tp` tensor-parallel ranks (tp=1: the whole model). Split over
    TP: word embeddings, QKV/output/MLP weights, column biases, the MLM bias; the rest is replicated. ELECTRA's
    generator is counted with its discriminator, their shared embeddings once. ERNIE 2.0's task heads (a few thousand parameters, added by the trainer) are not counted."""
    return sum(split // tp + replicated for split, replicated in _modules(m))


def largest_module(m: ModelConfig, tp: int = 1) -> int:
    """Parameters of the biggest single module on one TP rank (usually the word embeddings): what ZeRO-3
    gathers at once (DeepSpeed's `largest_layer_params`)."""
    return max(split // tp + replicated for split, replicated in _modules(m))



# --------------------------------------------------------------------------------------------- FLOPs

def predicted_tokens(cfg) -> int:
    """Tokens per sequence the LM head runs on: all for causal LM, the masked positions for masked LM."""
    return objectives.get(cfg.data.objective).predicted_tokens(cfg.data)


def flops_per_sample(cfg) -> float:
    """`model_flops_per_sample` of a config: its model, sequence length, and its objective's predicted tokens and
    decoder length; plus the forward pass of a distillation's teacher (a third of its training FLOPs), where it
    can be read."""
    own = model_flops_per_sample(cfg.model, cfg.data.seq_len, predicted_tokens(cfg), decoder_tokens(cfg))
    try:
        teacher = objectives.get(cfg.data.objective).configured(cfg).teacher(cfg)
    except FileNotFoundError:
        teacher = None
    return own + (model_flops_per_sample(teacher, cfg.data.seq_len, predicted_tokens(cfg)) / 3 if teacher else 0)


def decoder_tokens(cfg) -> int:
    """Tokens per sequence an encoder-decoder's decoder runs on (0 without a decoder)."""
    return objectives.get(cfg.data.objective).decoder_tokens(cfg.data)


def query_tokens(cfg) -> int:
    """Tokens per sequence a second stream of queries runs on (XLNet's query stream: the predicted ones; 0 for other
    models, and for a causal Transformer-XL, which predicts from its content stream)."""
    return sum(st.queries for st in stacks(cfg.model, cfg.data.seq_len, decoder_tokens(cfg), predicted_tokens(cfg)))


def model_flops_per_sample(m: ModelConfig, seq_len: int, predicted: int | None = None, decoder: int = 0) -> float:
    """Training FLOPs of one sequence: forward + backward = 3 x forward (2 FLOPs per multiply-add), activation
    recomputation not counted (model FLOPs, not hardware FLOPs). With s = seq_len, L layers, hidden h, MLP
    width f, padded vocabulary V and p = `predicted` tokens (default s):

        6 * s * L * (4h^2 + 2hf)      block matmuls: QKV, attention output, MLP (4ha with an attention width
                                      a = heads x model.head_dim other than h; 3hf with a gated MLP)
      + 12 * L * h * s^2              attention scores QK^T and P @ V over the full s x s square (a for h)
                                      (causal masking's halving is not applied, as in Megatron and nanoGPT);
                                      a local layer's over s x its band, s x min(s, attention_window) when causal
                                      (stacks.attended_keys); twice that with relative positions (NEZHA: q . a_ij
                                      and P . a_ij too)
      + 6 * p * e * V                 LM head logits on the predicted tokens (e: the embedding width, = h
                                      unless factorised as ALBERT's)
      + 6 * p * h * e                 with an mlm head: its transform dense on the predicted tokens
      + 6 * s * e * h                 with e != h: the embedding projection
      + 6 * s * (h^2 + h)             with an rtd head (ELECTRA) instead of the LM head: the discriminator head on
                                      every token, plus the generator's FLOPs (this formula, its own sizes)

    For f = 4h and p = s this is Megatron's 72*s*L*h^2 * (1 + s/(6h) + V/(12*L*h)). An encoder-decoder adds its
    decoder's layers on its `decoder` tokens (default p), each with its cross-attention to the s encoder outputs
    (`stack_flops`), and the LM head on the p it predicts.
    Embedding lookups, norms, softmax, biases and the pooler/NSP head (one token per sequence) are left out."""
    h, s, p, e = m.hidden_size, seq_len, seq_len if predicted is None else predicted, embedding_width(m)
    family = _family(m)
    whole = family.flops(m, s)
    if whole is not None:
        return whole
    layers = sum(stack_flops(st) for st in _own_stacks(m, s, decoder or p, p))  # every layer, shared or not
    projection = 6 * s * e * h if e != h else 0  # ALBERT's embedding projection
    if "rtd" in m.heads:  # the discriminator head on every token
        head = 6 * s * (h * h + h)
    else:
        head = 6 * p * e * (m.padded_vocab + (h if "mlm" in m.heads else 0))
    return float(layers + head + projection) + sum(model_flops_per_sample(c, seq_len, predicted)
                                                   for c in family.companions(m))


# -------------------------------------------------------------------------------------------- memory

def model_state_bytes(n: int, dp: int, stage: int, offload: bool, precision: str) -> tuple[int, int, int, int]:
    """(weights, gradients, optimizer states) bytes per GPU and CPU bytes per GPU process, for `n` parameters
    per TP rank under ZeRO `stage` over `dp` ranks: stage 1 partitions optimizer states, 2 also gradients,
    3 also weights. Offload moves the optimizer states to CPU memory, and from stage 2 the gradient partition
    too (the CPU optimizer steps on an fp32 copy of it)."""
    weight, grad, master = STATE_BYTES[precision]

    def per_gpu(nbytes: int, partitioned: bool) -> int:
        return nbytes * n // dp if partitioned else nbytes * n

    gradients = 0 if offload and stage >= 2 else per_gpu(grad, stage >= 2)
    optimizer = 0 if offload else per_gpu(master + MOMENT_BYTES, stage >= 1)
    cpu = per_gpu(OFFLOAD_BYTES, True) if offload else 0
    return per_gpu(weight, stage >= 3), gradients, optimizer, cpu


def activation_bytes(cfg, micro_batch: int) -> tuple[int, int]:
    """(transformer layers, LM head) activation bytes per GPU, as ptm's kernels on a GPU keep them. A layer keeps
    s*b*h*(10 + 24/t) bytes in 16 bits (Korthikanti et al. 2022, tensor parallelism without sequence parallelism;
    24 is 8 + 4f/h for an MLP of width f), double in fp32, plus its attention's: 4*a*s*b/t (flash or memory-efficient
    attention's fp32 logsumexp) or, where the probabilities are kept (a stack's `keeps_scores`, set by its family),
    Korthikanti's 5*a*s^2*b/t (16-bit probabilities, their dropout mask and dropped-out copy). A checkpointed layer keeps only its
    input (2*s*b*h), and one layer's full activations live again during its recomputation. LM head: the fp32 logits
    over this rank's vocabulary; with the fused linear cross-entropy (`Config.lm_loss_fusable`) only what it keeps for
    the backward pass: the input's gradient, the fp32 weight-gradient sum and a chunk of logits (up to
    FUSED_CHUNK_BYTES, or as large as the input, up to 2x, where that is more: `kernels.fused_chunk_rows`).
    A stack's memory (XLNet, Transformer-XL: mem_len) adds its keys to every query's (probabilities of s x
    (s + mem_len)), and each layer keeps the memory it read and its keys and values (mem_len*b*(2h + 4h/t)); XLNet's
    query stream runs the same layer on the predicted tokens. Plus what the objective's loss keeps (`Objective.kept_bytes`). A model
    that is no transformer (ELMo's) is counted by its family's hook."""
    m, t, b = cfg.model, cfg.parallel.tp, micro_batch
    scale = 2 if cfg.precision == "fp32" else 1
    whole = _family(m).activation_bytes(cfg, micro_batch)
    if whole is not None:
        return whole
    layers = objectives.get(cfg.data.objective).configured(cfg).kept_bytes(cfg, micro_batch)
    for stack in stacks(m, cfg.data.seq_len, decoder_tokens(cfg), predicted_tokens(cfg)):
        model, c, mem, s = stack.model, stack.context, stack.memory, stack.seq_len
        h, a = model.hidden_size, model.num_heads

        def layer_of(tokens: int) -> int:  # one stream's queries on `tokens` tokens
            attention = 5 * a * (s + mem) * scale if stack.keeps_scores else 4 * a
            return tokens * b * (scale * (10 * h + (8 * h + 4 * model.ffn_hidden_size) // t) + attention // t)
        layer = layer_of(s) + (layer_of(stack.queries) if stack.queries else 0) + mem * b * scale * (2 * h + 4 * h // t)
        if c:  # cross-attention: its input and LayerNorm (2h), queries, output and dropout (5h/t), keys and values
            layer += s * b * (scale * (2 * h + 5 * h // t) + 4 * a // t) + c * b * scale * 4 * h // t
        recomputed, kept = stack.recomputed, scale * 2 * (s + stack.queries) * b * h
        layers += (stack.layers - recomputed) * layer + recomputed * kept + (layer if recomputed else 0)
        layers += c * b * h * 2 * scale  # the encoder's output, which every decoder layer reads
    rows, v, e = b * predicted_tokens(cfg), m.padded_vocab, embedding_width(m)
    act = 2 * scale
    chunk = max(2 * rows * e * act, min(rows * v * act, FUSED_CHUNK_BYTES))  # liger's sizing, or the byte budget
    logits = rows * e * act + chunk + 4 * v * e if cfg.lm_loss_fusable() else 4 * rows * v // t
    return layers, logits


def stream_memory_bytes(cfg, dp: int) -> int:
    """The memory a recurrent model carries from step to step, per GPU (its family's; pretrain/models/recurrence.py)."""
    return _family(cfg.model).carried_bytes(cfg, dp)


def teacher_parameters(cfg) -> int | None:
    """Parameters per TP rank of the frozen model the objective runs beside the trained one (a distillation's
    teacher, split by TP as the student): 0 without one, None where it is named but not readable here."""
    try:
        teacher = objectives.get(cfg.data.objective).configured(cfg).teacher(cfg)
    except FileNotFoundError:
        return None
    return count_parameters(teacher, cfg.parallel.tp) if teacher is not None else 0


def objective_parameters(cfg) -> int:
    """Parameters of the heads the objective adds to the model (ERNIE 2.0's task classifiers), replicated on every
    TP rank."""
    return objectives.get(cfg.data.objective).head_parameters(cfg)


@dataclass(frozen=True)
class Launches:
    """Kernel launches of one optimizer step: its `first` micro-batch (with the step's preparation: the batches moved
    and their loss elements counted), each further micro-batch (`per_micro_batch`: its gradients added to the first's),
    and the step's end (`optimizer`: the accumulation boundary's gradient work, the step's metrics, DeepSpeed's
    optimizer step)."""
    first: int
    per_micro_batch: int
    optimizer: int

    def of(self, accumulation: int) -> int:
        return self.first + (accumulation - 1) * self.per_micro_batch + self.optimizer


# ------------------------------------------------------------------------------------------ kernel launches

LAYER_LAUNCHES = 56  # one transformer layer's forward and backward in a further micro-batch (BERT's, counted)
CROSS_LAUNCHES = 30  # a cross-attention sublayer's, more
MICRO_BATCH_LAUNCHES = 152  # embeddings, heads and loss of a micro-batch (BERT's MLM and NSP)
PREPARE_LAUNCHES = 36  # the step's preparation, in its first micro-batch (batches moved, loss elements counted)
FIRST_SAVES = 12  # per layer: the gradient additions the first micro-batch does not make
OPTIMIZER_LAUNCHES = 53  # the step's end: the accumulation boundary, metrics, a fused or multi-tensor optimizer


def estimate_launches(cfg) -> Launches:
    """The launches of one step of `cfg` without counting them: LAYER_LAUNCHES per layer (a cross-attention layer's
    more, a recomputed layer's forward again) and the constants above, counted on BERT (tests/test_launches.py
    holds them to its count; docs/performance.md lists the other families' counts; pretrain/launches.py counts a
    config's own); a family whose model is no transformer estimates its own (`Cost.launches`)."""
    own = _family(cfg.model).launches(cfg.model, cfg.data.seq_len)
    if own is not None:
        return Launches(*own)
    layers = sum((s.layers + s.recomputed / 3) * LAYER_LAUNCHES + (s.layers * CROSS_LAUNCHES if s.context else 0)
                 for s in stacks(cfg.model, cfg.data.seq_len, decoder_tokens(cfg), predicted_tokens(cfg)))
    per_micro_batch = round(layers + MICRO_BATCH_LAUNCHES)
    first = per_micro_batch + PREPARE_LAUNCHES - FIRST_SAVES * cfg.model.num_layers
    return Launches(first, per_micro_batch, OPTIMIZER_LAUNCHES)


def tp_launches(cfg) -> int:
    """The all-reduces one micro-batch adds under tensor parallelism (none at TP=1, where launches are counted): two
    forward and two backward per layer (a cross-attention layer's output two more), two per recomputed layer, two
    around the embeddings and the LM head."""
    if cfg.parallel.tp == 1:
        return 0
    return 2 + sum((6 if s.context else 4) * s.layers + 2 * s.recomputed
                   for s in stacks(cfg.model, cfg.data.seq_len, decoder_tokens(cfg), predicted_tokens(cfg)))
