"""Model families, one module each, found by name (`model.arch`) in `REGISTRY`.

A module of this package that defines `FAMILY` (a `base.Family`: the features its presets' model computes, a config
rule it may own, its Hugging Face adapter) and `ORDER` (its place in listings) is a family: adding one is adding a
module and a preset, nothing here changes. Only these modules and the objective plug-ins compare architecture names.
"""
from __future__ import annotations

import importlib
import pkgutil

from pretrain.families import base
from pretrain.families.base import COMMON, Adapter, ExportError, Family

__all__ = ["ARCH_FEATURES", "COMMON", "REGISTRY", "VOCAB_ROWS", "Adapter", "ExportError", "Family", "by_model_type", "get", "names"]


def _registry() -> dict[str, Family]:
    modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return {m.FAMILY.name: m.FAMILY for m in sorted((m for m in modules if hasattr(m, "FAMILY")),
                                                    key=lambda m: m.ORDER)}


REGISTRY = _registry()
ARCH_FEATURES = {name: f.features for name, f in REGISTRY.items()}
VOCAB_ROWS = base.VOCAB_ROWS + tuple(dict.fromkeys(r for f in REGISTRY.values() for r in f.vocab_rows))
# every model's parameters with a row per (padded) vocabulary entry: the shared model's and the families' own


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str) -> Family:
    if name not in REGISTRY:
        raise ValueError(f"model.arch {name!r} is not one of {' | '.join(REGISTRY)}")
    return REGISTRY[name]


def by_model_type(model_type: str) -> Family | None:
    """The family whose adapter imports Hugging Face configs of `model_type`."""
    return next((f for f in REGISTRY.values() if f.adapter and f.adapter.model_type == model_type), None)
