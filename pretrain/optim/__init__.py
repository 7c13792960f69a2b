"""ptm's optimizers (AdamW, LAMB) and learning-rate schedules, in plain torch (clipping is DeepSpeed's).

    optimizer = optim.build(model, cfg.optimizer)
    scheduler = optim.Schedule.from_config(cfg.optimizer, cfg.train.steps).scheduler(optimizer)
"""
from __future__ import annotations

from torch import nn

from pretrain.optim.norms import sum_of_squares
from pretrain.optim.optimizers import AdamW, Lamb, param_groups, trust_ratios
from pretrain.optim.schedule import Schedule

OPTIMIZERS = {"adamw": AdamW, "lamb": Lamb}


def build(model: nn.Module, cfg) -> AdamW | Lamb:
    """The optimizer named by a config's `optimizer` section (name, lr, betas, eps, weight_decay, multi_tensor)
    over the model's `param_groups`."""
    foreach = {"on": True, "off": False}.get(cfg.multi_tensor)
    return OPTIMIZERS[cfg.name](param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas),
                                eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=foreach)


__all__ = ["OPTIMIZERS", "AdamW", "Lamb", "Schedule", "build", "param_groups", "sum_of_squares", "trust_ratios"]
