"""Config fields that carry their own description, choices and range (the one place config metadata lives), and
the checks and listings made from them. The sections are plain dataclasses: pretrain/config.py (the training
config), pretrain/models/config.py (the model), and the sections that objective plug-ins own.

    steps: int = opt(1000, "optimizer steps", range="> 0")
    name: str = opt("adamw", "the optimizer", choices=("adamw", "lamb"))
"""
from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import field

AUTO = "auto"  # the value of a number field that the run picks when it starts (train.micro_batch_size)
RANGES = {"> 0": (lambda x: x > 0, "must be positive; set {k} to a value > 0"),
          ">= 0": (lambda x: x >= 0, "must not be negative; set {k} to a value >= 0"),
          "[0, 1)": (lambda x: 0 <= x < 1, "is outside [0, 1); set {k} to a value in [0, 1)"),
          "(0, 1)": (lambda x: 0 < x < 1, "is outside (0, 1); set {k} to a value in (0, 1)"),
          "[0, 1]": (lambda x: 0 <= x <= 1, "is outside [0, 1]; set {k} to a value in [0, 1]")}


def opt(default, help_: str, *, choices=None, range: str | None = None):  # noqa: A002 (the metadata's name)
    """A field with its one-line description, its allowed values (a tuple, or a function returning one: a registry
    read when checked) and its range (a key of RANGES); list and dict defaults are copied per instance."""
    assert range is None or range in RANGES, range
    metadata = {"help": help_, "choices": choices, "range": range}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: json.loads(json.dumps(default)), metadata=metadata)
    return field(default=default, metadata=metadata)


@functools.cache
def hints(cls) -> dict:
    return typing.get_type_hints(cls)


def choices_of(f: dataclasses.Field) -> tuple | None:
    found = f.metadata.get("choices")
    return found() if callable(found) else found


def leaves(cls, prefix: str = ""):
    """(dotted key, type, default, field) of every value field of dataclass `cls`, sections flattened."""
    for f in dataclasses.fields(cls):
        hint = hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            yield from leaves(hint, f"{prefix}{f.name}.")
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        yield prefix + f.name, hint, default, f


def problems(obj, prefix: str = "") -> list[str]:
    """Each value of dataclass `obj` (sections, and lists of sections, included) outside its field's choices or
    range: one line each, with the fix."""
    out = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            out += problems(value, key + ".")
            continue
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                out += problems(item, f"{key}[{i}].")
            continue
        allowed = choices_of(f)
        if value is None and f.default is None:  # unset (a model feature of an unknown arch: its error says it)
            continue
        if allowed is not None and value not in allowed:
            out.append(f"{key}={value!r} is not one of {' | '.join(map(str, allowed))}; set {key} to one of them")
        limit = f.metadata.get("range")
        if limit is not None and isinstance(value, str):  # a number field that takes auto (train.micro_batch_size)
            if value != AUTO:
                out.append(f"{key}={value!r} is neither a number nor {AUTO}; set {key} to a number or {AUTO}")
        elif limit is not None and value is not None and not RANGES[limit][0](value):
            out.append(f"{key}={value} " + RANGES[limit][1].format(k=key))
    return out


def type_name(hint) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in args)
    if args:
        return f"{typing.get_origin(hint).__name__}[{', '.join(map(type_name, args))}]"
    return hint.__name__


def describe(cls) -> str:
    """Every key of dataclass `cls` with its type, default and description, one per line (for `--help`)."""
    rows = [(key, type_name(hint), json.dumps(default), f.metadata.get("help", ""))
            for key, hint, default, f in leaves(cls)]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{k:<{widths[0]}}  {t:<{widths[1]}}  {d:<{widths[2]}}  {h}" for k, t, d, h in rows)
