"""Run under torchrun: build a tiny model with tensor parallelism, run one forward/backward on fixed
inputs, and save this rank's weights, logits and gradients for tests/test_tensor_parallel.py."""
import sys

import torch
import torch.distributed as dist

from pretrain import kernels as K
from pretrain import models
from pretrain.models.config import ModelConfig
from pretrain.parallel import mcore


def tiny(arch: str) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=250, vocab_pad_to=128, hidden_size=32, num_layers=2, num_heads=4,
                       ffn_hidden_size=64, max_position_embeddings=32, type_vocab_size=0 if arch in ("gpt2", "xlnet") else 2,
                       hidden_dropout=0.0, attention_dropout=0.0, mem_len=8 if arch == "xlnet" else 0)


def step(model, arch: str):
    """Fixed inputs, forward, loss, backward; returns (logits, loss). XLNet: a first segment, then a second over its
    memory with both streams (a permutation mask, four targets per row) and relative segments."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 250, (2, 16), generator=g)
    labels = torch.where(torch.rand(2, 16, generator=g) < 0.3, ids, -100)
    if arch == "xlnet":
        segments, perm = torch.randint(0, 2, (2, 16), generator=g), torch.rand(2, 16, 16, generator=g) < 0.5
        targets = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(2)])
        labels = torch.randint(0, 250, (2, 4), generator=g)
        memory = model(torch.randint(0, 250, (2, 16), generator=g), None, segments)["memory"]
        out = model(ids, None, segments, perm_mask=perm, targets=targets, memory=memory)
    else:
        out = model(ids, torch.ones_like(ids), torch.zeros_like(ids)) if arch != "gpt2" else model(ids)
    logits = out["logits"].detach().clone()
    loss = K.cross_entropy(out["logits"], labels).sum() / (labels != -100).sum()
    if arch not in ("gpt2", "xlnet"):
        loss = loss + torch.nn.functional.cross_entropy(out["nsp_logits"], torch.tensor([0, 1]))
    loss.backward()
    return logits, loss.detach()


if __name__ == "__main__":
    arch, tp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mcore.initialize(tp=tp, seed=0)
    model = models.build(tiny(arch))
    logits, loss = step(model, arch)
    rank = dist.get_rank()
    torch.save({"state": {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)},
                "grads": {n: p.grad for n, p in model.named_parameters()}, "logits": logits, "loss": loss},
               f"{out}/rank{rank}.pt")
    dist.destroy_process_group()
