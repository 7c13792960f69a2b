"""Pretraining objectives, one plug-in module each (`base.Objective`), found by name in `REGISTRY`.

A module of this package that defines `OBJECTIVES` (a tuple of Objective instances) and `ORDER` (its place in
listings) is an objective plug-in: adding one is adding a module, nothing here changes. The config, the data
factory, the trainer, the engine and `ptm plan` ask the registry instead of listing names.
"""
from __future__ import annotations

import importlib
import pkgutil

from pretrain.objectives.base import AT, Objective, Section

__all__ = ["AT", "REGISTRY", "Objective", "Section", "get", "sections"]


def _registry() -> dict[str, Objective]:
    modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    plugins = sorted((m for m in modules if hasattr(m, "OBJECTIVES")), key=lambda m: m.ORDER)
    return {o.name: o for m in plugins for o in m.OBJECTIVES}


REGISTRY = _registry()


def get(name: str) -> Objective:
    if name not in REGISTRY:
        raise ValueError(f"data.objective {name!r} is not one of {' | '.join(REGISTRY)}")
    return REGISTRY[name]


def sections() -> list[Section]:
    """The config sections the objectives own, each once, in registry order."""
    found = {}
    for o in REGISTRY.values():
        if o.section is not None:
            found.setdefault(o.section.name, o.section)
    return list(found.values())
