"""What bench/cpu_step.py and bench/gpu_step.py time: one training step of ptm (the model, optimizer and DeepSpeed
engine exactly as `ptm train` builds them, and its losses), of Hugging Face (`BertForPreTraining` /
`GPT2LMHeadModel` with torch.optim.AdamW, eager or `torch.compile`d, torch.autocast for 16-bit) and of
megatron-core's own `BertModel` / `GPTModel` (local layer specs) on the same synthetic batch.

Batches: random tokens; masked LM with 15% of the real tokens masked and next-sentence labels, sample lengths
as BERT's recipe makes them (a fraction `data.short_seq_prob`, default 0.1, is shorter than the sequence, the
rest fill it); causal LM full windows.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from pretrain import config as C
from pretrain import engine, losses, objectives, optim
from pretrain.data.packing import pack
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore

WARMUP = 3  # steps left out of the median (compilation, allocator warm-up)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def ptm_config(preset: str, overrides: list[str]) -> C.Config:
    return C.load(preset, ["data.path=synthetic", *overrides])


def make_batch(cfg: C.Config, batch_size: int, device) -> dict[str, torch.Tensor]:
    """One micro-batch in ptm's format (Hugging Face and megatron-core take the same tensors)."""
    seq, vocab = cfg.data.seq_len, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(0)
    if cfg.model.causal:
        ids = torch.randint(0, vocab, (batch_size, seq + 1), generator=gen)
        return {"input_ids": ids[:, :-1].to(device), "labels": ids[:, 1:].to(device)}
    short = torch.rand(batch_size, generator=gen) < cfg.data.short_seq_prob
    lengths = torch.where(short, torch.randint(8, seq, (batch_size,), generator=gen), seq)
    real = torch.arange(seq)[None] < lengths[:, None]
    ids = torch.randint(5, vocab, (batch_size, seq), generator=gen) * real
    masked = real & (torch.rand(batch_size, seq, generator=gen) < 0.15)
    out = {"input_ids": ids, "attention_mask": real.long(),
           "token_type_ids": (torch.arange(seq)[None] >= lengths[:, None] // 2).long() * real,
           "labels": torch.where(masked, ids, -100), "next_sentence_label": torch.randint(0, 2, (batch_size,))}
    return {k: v.to(device) for k, v in out.items()}


def ptm_step(cfg: C.Config, batch_size: int, unpadded: bool = False, fused: bool | None = None,
             graphed: bool = False, whole: bool = False):
    """ptm's train step (forward, global-batch-normalised loss, DeepSpeed backward and step) on one process;
    `fused`: whether the LM head runs the fused linear cross-entropy (None: as `ptm train` decides, on CUDA);
    `graphed`: each block's forward and backward captured in a CUDA graph (`torch.cuda.make_graphed_callables`) and
    replayed, the embeddings, heads, loss and optimizer eager (a measurement of what capture would win: attention
    dropout, drawn from megatron's RNG tracker, must be off); `whole`: the whole model `torch.compile`d (not per
    block, as kernels=compile does)."""
    mcore.initialize(1, cfg.seed)
    from pretrain import device as dev

    if graphed and dev.device().type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    model = Pretraining(cfg.model).to(dev.device())
    optimizer = optim.build(model, cfg.optimizer)
    scheduler = optim.Schedule.from_config(cfg.optimizer, cfg.train.steps).scheduler(optimizer)
    # graphed: DeepSpeed's gradient hooks keep each parameter's AccumulateGrad node, whose stream is the one current
    # when it is made; made on the legacy default stream, capturing the blocks' backward fails ("operation would make
    # the legacy stream depend on a capturing blocking stream", an H200 lease of 2026-11-28). torch's CUDA-graph notes
    # build DDP on a side stream for this reason; DeepSpeed's engine is built the same way here.
    with torch.cuda.stream(torch.cuda.Stream()) if graphed else contextlib.nullcontext():
        run = engine.build(cfg, model, optimizer, scheduler)
    eng, fused = run.engine, run.fused_lm_loss if fused is None else fused
    objective = objectives.get(cfg.data.objective)
    data = make_batch(cfg, batch_size, "cpu")  # located on the host, as ptm's loader does (no syncs on the device)
    data = {k: v.to(dev.device()) for k, v in objective.locate(pack(data) if unpadded else data).items()}
    if graphed:
        _graph_blocks(model, data)
    if whole:
        model.compile()

    def step():
        loss = losses.objective(objective.compute(eng, data, fused=fused), objective.elements(data))
        eng.backward(loss)
        eng.step()
    return step


def _graph_blocks(model: Pretraining, data: dict) -> None:
    """Replace each block's forward by a CUDA graph of it (padded batches of one shape: the key-padding mask)."""
    assert not model.cfg.attention_dropout, "attention dropout draws from megatron's RNG tracker: set it to 0"
    p = next(model.parameters())
    if "attention_mask" not in data:
        raise RuntimeError("the graphed row takes BERT's padded batches (its blocks' mask is a tensor)")
    b, s = data["input_ids"].shape
    mask = data["attention_mask"][:, None, None, :].bool()
    samples = tuple((torch.randn(b, s, model.cfg.hidden_size, dtype=p.dtype, device=p.device, requires_grad=True),
                     mask) for _ in model.blocks)
    torch.cuda.make_graphed_callables(tuple(model.blocks), samples)


def hf_step(cfg: C.Config, batch_size: int, compiled: bool):
    """Hugging Face's model of the same size, torch.optim.AdamW (fused on GPUs), autocast for 16-bit."""
    import transformers as T

    m, device = cfg.model, _device()
    torch.manual_seed(0)
    sizes = dict(attn_implementation="sdpa")
    if m.causal:
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=m.vocab_size, n_embd=m.hidden_size, n_layer=m.num_layers,
                                               n_head=m.num_heads, n_inner=m.ffn_hidden_size,
                                               n_positions=m.max_position_embeddings, **sizes))
    else:
        model = T.BertForPreTraining(T.BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                                  num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                                                  intermediate_size=m.ffn_hidden_size,
                                                  max_position_embeddings=m.max_position_embeddings, **sizes))
    model.to(device).train()
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    data = make_batch(cfg, batch_size, device)
    if m.causal:
        data = {"input_ids": data["input_ids"], "labels": data["input_ids"]}  # HF shifts the labels itself

    def step():
        with _autocast(cfg.precision):
            loss = forward(**data).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return step


def mcore_step(cfg: C.Config, batch_size: int):
    """megatron-core's own BertModel / GPTModel (local layer specs: no Transformer Engine needed), the same sizes,
    16-bit weights through its Float16Module, torch.optim.AdamW on them (a throughput comparison: Megatron's
    optimizer would keep fp32 masters). Needs CUDA (megatron-core's attention allocates on the current CUDA
    device)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, device = cfg.model, _device()
    mcore.initialize(1, cfg.seed)
    tc = TransformerConfig(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
                           ffn_hidden_size=m.ffn_hidden_size, hidden_dropout=m.hidden_dropout,
                           attention_dropout=m.attention_dropout, use_cpu_initialization=True,
                           bf16=cfg.precision == "bf16", fp16=cfg.precision == "fp16")
    data = make_batch(cfg, batch_size, device)
    seq = cfg.data.seq_len
    if m.causal:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        model = GPTModel(tc, get_gpt_layer_local_spec(), m.vocab_size, m.max_position_embeddings)
        positions = torch.arange(seq, device=device)[None].expand(batch_size, -1)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)[None, None]

        def loss():
            return model(data["input_ids"], positions, causal, labels=data["labels"]).float().mean()
    else:
        from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
        from megatron.core.models.bert.bert_model import BertModel

        model = BertModel(tc, num_tokentypes=2, transformer_layer_spec=bert_layer_local_spec,
                          vocab_size=m.vocab_size, max_sequence_length=m.max_position_embeddings)
        labels = data["labels"].clamp(min=0)

        def loss():
            lm, binary = model(data["input_ids"], data["attention_mask"], tokentype_ids=data["token_type_ids"],
                               lm_labels=labels)
            return lm.float().mean() + binary.float().mean()
    if cfg.precision != "fp32":  # Megatron's own 16-bit path: 16-bit weights (its optimizer keeps fp32 masters)
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(tc, model)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        value = loss()
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def seconds(step, steps: int, device) -> float:
    """The median wall time of `steps` steps after WARMUP more."""
    times = []
    for _ in range(WARMUP + steps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP:])


def _device() -> torch.device:
    from pretrain import device as dev

    return dev.device()


def _autocast(precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(_device().type, dtype=DTYPES[precision])


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
