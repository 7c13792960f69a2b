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
import shutil
import textwrap
import types
import typing
from dataclasses import field

AUTO = "auto"  # the value of a number field that the run picks when it starts (train.micro_batch_size)
RANGES = {"> 0": (lambda x: x > 0, "must be positive; set {k} to a value > 0"),
          ">= 0": (lambda x: x >= 0, "must not be negative; set {k} to a value >= 0"),
          "[0, 1)": (lambda x: 0 <= x < 1, "is outside [0, 1); set {k} to a value in [0, 1)"),
          "(0, 1)": (lambda x: 0 < x < 1, "is outside (0, 1); set {k} to a value in (0, 1)"),
          "[0, 1]": (lambda x: 0 <= x <= 1, "is outside [0, 1]; set {k} to a value in [0, 1]"),
          "[0, 63]": (lambda x: 0 <= x <= 63, "is outside [0, 63]; set {k} to a value in [0, 63]")}


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


DEFAULT_CELL = 16  # the widest default the table shows in its column; a longer one is said in its description
WIDEST = 118  # the table's width at most (a wider terminal's lines would be too long to read)
NARROWEST = 30  # the least room for the description column; less, and each description goes under its key


def help_width() -> int:
    """The columns `--help` text fills: the terminal's less 2, as argparse's help, at most WIDEST and at least 40 (a
    COLUMNS of 2 failed every command, which builds the table)."""
    return max(min(shutil.get_terminal_size().columns - 2, WIDEST), 40)


def describe(cls, width: int | None = None) -> str:
    """Every key of dataclass `cls` with its type, default and description (for `--help`): a table whose
    descriptions wrap within `width` columns (default: the terminal's, as argparse's help, at most WIDEST), each
    continued under its own start; where that leaves the descriptions too little room, each goes under its key. A
    default longer than DEFAULT_CELL is cut in its column and said in full after its description."""
    width = width or help_width()
    rows = []
    for key, hint, default, f in leaves(cls):
        shown, text = json.dumps(default), f.metadata.get("help", "")
        if len(shown) > DEFAULT_CELL:
            text, shown = f"{text} (default {shown})", shown[:DEFAULT_CELL - 3] + "..."
        rows.append((key, type_name(hint), shown, text))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    column = sum(widths) + 6
    lines = []
    for k, t, d, text in rows:
        head = f"{k:<{widths[0]}}  {t:<{widths[1]}}  {d:<{widths[2]}}  "
        if width - column >= NARROWEST:
            body = textwrap.wrap(text, width - column, break_long_words=False, break_on_hyphens=False) or [""]
            lines += [head + body[0]] + [" " * column + more for more in body[1:]]
        else:
            lines += [head.rstrip()] + textwrap.wrap(text, width, initial_indent=" " * 4, subsequent_indent=" " * 4,
                                                      break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)
