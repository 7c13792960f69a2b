"""YAML config files into dataclasses: `base` chains, dotted `--set` overrides, unknown keys, type coercion.

    files = layers(path, schema, presets)     # [(path, its own keys)], the first base first, each file checked
    raw = merge(base_keys, file_keys, schema) # each over the one before it (sections key by key)
    override(raw, "train.steps=100", schema)  # a --set item, checked against the field's type
    cfg = build(schema, raw)                  # values coerced to the fields' types

A file may start from another one with `base: other.yaml` (relative to the file; a bare name is a preset, found by
`resolve`): sections merge key by key; lists, scalars and mapping-valued keys (e.g. unilm.mix) replace. Unknown
keys are errors naming the valid ones.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import os
import types
import typing

import yaml

from pretrain.schema import hints, type_name


class ConfigError(ValueError):
    """A bad config file, override or value; the message names the key and the fix."""


def resolve(name: str, relative_to: str, presets_dir: str) -> str:
    """The file `name` relative to `relative_to`, else the preset of that name in `presets_dir`."""
    path = os.path.join(relative_to, name)
    if os.path.isfile(path):
        return path
    preset = os.path.join(presets_dir, name if name.endswith(".yaml") else f"{name}.yaml")
    if os.sep not in name and os.path.isfile(preset):
        return preset
    presets = sorted(f[:-5] for f in os.listdir(presets_dir) if f.endswith(".yaml"))
    near = did_you_mean(name.removesuffix(".yaml"), presets)
    raise ConfigError(f"config file {name} not found in {relative_to}{near}; "
                      f"give a path to a YAML file or a preset: {', '.join(presets)}")


def did_you_mean(word: str, choices) -> str:
    """" (did you mean X?)" for the choice nearest a misspelt `word`, if one is near."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {near[0]}?)" if near else ""


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key, _ in node.value:
            if key.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: what it brings, the keys beside it replace
                continue
            name = self.construct_object(key, deep=deep)
            if not isinstance(name, collections.abc.Hashable):  # (the loader's own error says so)
                continue
            if name in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {name!r} is given twice; keep one",
                                                        key.start_mark)
            seen.add(name)
        return super().construct_mapping(node, deep)


def layers(path: str, schema, presets_dir: str, chain: tuple[str, ...] = (),
           moved: dict[str, str] | None = None) -> list[tuple[str, dict]]:
    """The file and its `base` chain, the first base first: (its path, its own keys) each, `base` taken out, each
    checked against `schema` on its own (merged in this order, they are the config)."""
    real = os.path.realpath(path)
    if real in chain:
        raise ConfigError(f"{path}: `base` loops back: {' -> '.join((*chain, real))}")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.load(f, _UniqueKeys)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(raw).__name__}")
    base = raw.pop("base", None)
    for old, new in (moved or {}).items():
        section, _, key = old.rpartition(".")
        if isinstance(raw.get(section), dict) and key in raw[section]:
            _put(raw, new.partition(".")[0], {new.partition(".")[2]: raw[section].pop(key)})
    try:
        build(schema, raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if base is None:
        return [(path, raw)]
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a file name, got {base!r}")
    return [*layers(resolve(base, os.path.dirname(path), presets_dir), schema, presets_dir, (*chain, real), moved),
            (path, raw)]


def merge(base: dict, top: dict, schema=None) -> dict:
    """`top` over `base`: sections merge key by key (`_put`); `schema` (a section's class) tells them apart."""
    out = dict(base)
    fields = hints(schema) if schema is not None else {}
    for key, value in top.items():
        _put(out, key, value, fields.get(key))
    return out


def _put(node: dict, key: str, value, hint=None) -> None:
    """node[key] = value, merging a section's mapping key by key; a mapping-valued key (`hint` a dict type, e.g.
    unilm.mix) given whole replaces: its entries are a set of shares, not defaults to keep."""
    both = isinstance(value, dict) and isinstance(node.get(key), dict) and typing.get_origin(hint) is not dict
    node[key] = merge(node[key], value, hint if dataclasses.is_dataclass(hint) else None) if both else value


def dotted(raw: dict, schema, prefix: str = ""):
    """The dotted keys of a raw config mapping, down to the sections' values."""
    fields = hints(schema)
    for key, value in raw.items():
        if dataclasses.is_dataclass(fields.get(key)) and isinstance(value, dict):
            yield from dotted(value, fields[key], f"{prefix}{key}.")
        else:
            yield prefix + key


def override(raw: dict, item: str, schema) -> None:
    """Apply one `dotted.key=value` to the raw mapping; the value is YAML unless the field takes a string."""
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.steps=1000")
    parts = key.split(".")
    cls, node, i = schema, raw, 0
    while i < len(parts):
        name, fields = parts[i], hints(cls)
        if name not in fields:
            raise ConfigError(f"--set {item}: {_unknown('.'.join(parts[:i]), name, cls)}")
        hint = fields[name]
        if i == len(parts) - 1:
            return _put(node, name, _parse(text, hint, item, key), hint)
        if typing.get_origin(hint) is dict and i == len(parts) - 2:
            value_hint = typing.get_args(hint)[1]
            return _put(_child(node, name), parts[-1], _parse(text, value_hint, item, key), value_hint)
        if typing.get_origin(hint) is list and parts[i + 1].isdigit():  # an element: stages.0.steps=...
            if name not in node:  # an element of the default: optimizer.betas.1=0.98
                node[name] = _default(cls, name)
            items, k, hint = node.get(name), int(parts[i + 1]), typing.get_args(hint)[0]
            if not isinstance(items, list) or k >= len(items):
                size = len(items) if isinstance(items, list) else 0
                raise ConfigError(f"--set {item}: {'.'.join(parts[:i + 1])} has {size} elements, no element {k}; "
                                  f"set the whole list, e.g. --set '{'.'.join(parts[:i + 1])}=[...]'")
            if i + 1 == len(parts) - 1:
                items[k] = _parse(text, hint, item, key)
                return None
            if not dataclasses.is_dataclass(hint) or not isinstance(items[k], dict):
                raise ConfigError(f"--set {item}: {'.'.join(parts[:i + 2])} is a value ({type_name(hint)}), "
                                  "not a section")
            cls, node, i = hint, items[k], i + 2
            continue
        if not dataclasses.is_dataclass(hint):
            raise ConfigError(f"--set {item}: {'.'.join(parts[:i + 1])} is a value ({type_name(hint)}), not a section")
        cls, node, i = hint, _child(node, name), i + 1


def given(item: str, schema) -> list[str]:
    """The dotted keys (as `dotted` names them) that the override `item`, which `override` applied, gives: a list's
    or a mapping's (ernie.stages.0.steps: ernie.stages), or a whole section's keys."""
    key, _, text = item.partition("=")
    parts, cls = key.strip().split("."), schema
    for i, name in enumerate(parts):
        hint = hints(cls).get(name)
        if not dataclasses.is_dataclass(hint):
            return [".".join(parts[:i + 1])]
        cls = hint
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    return list(dotted(value, cls, f"{key.strip()}.")) if isinstance(value, dict) else [key.strip()]


def _default(cls, name: str):
    """Field `name`'s default in `cls`, as a raw value (sections as mappings); None when it has none."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if not isinstance(value, list):
        return None if value is dataclasses.MISSING else value
    return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]


def _child(node: dict, name: str) -> dict:
    if not isinstance(node.get(name), dict):
        node[name] = {}
    return node[name]


def _parse(text: str, hint, item: str, key: str):
    """A --set value: YAML (numbers, booleans, lists, null), except that string fields take the text as is;
    checked against the field's type here so that errors name the --set."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    unions = (typing.Union, types.UnionType)
    takes_str = hint is str or (typing.get_origin(hint) in unions and str in typing.get_args(hint))
    if takes_str and not isinstance(value, (list, dict)):
        value = text
    try:
        coerce(value, hint, key)
    except ConfigError as e:
        raise ConfigError(f"--set {item}: {e}") from None
    return value


def _unknown(section: str, key: str, cls) -> str:
    where = f"{section}." if section else ""
    return (f"unknown key '{where}{key}'{did_you_mean(key, hints(cls))}; valid keys of {section or 'the top level'}: "
            f"{', '.join(hints(cls))}")


def build(cls, raw, where: str = ""):
    """Dataclass `cls` from a mapping; `where` is the dotted prefix of its keys (for messages)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    fields = hints(cls)
    for key in raw:
        if key not in fields:
            raise ConfigError(_unknown(where.rstrip("."), key, cls))
    return cls(**{key: coerce(value, fields[key], where + key) for key, value in raw.items()})


_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def coerce(value, hint, key: str):
    """`value` as type `hint` (int, float, bool, str, lists, dicts, unions, Optional, dataclasses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:  # Optional[X]: X's own message
            return coerce(value, options[0], key)
        for arg in options:
            try:
                return coerce(value, arg, key)
            except ConfigError:
                pass
    elif origin is list and isinstance(value, (list, tuple)):
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict and isinstance(value, dict):
        return {str(k): coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    elif hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in _BOOLS:
            return _BOOLS[str(value).lower()]
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif hint in (int, float) and not isinstance(value, bool):
        number = _number(value)
        if hint is float and number is not None:
            return float(number)
        if hint is int and number is not None and float(number).is_integer():
            return int(number)
    raise ConfigError(f"{key}: expected {type_name(hint)}, got {value!r}")


def _number(value) -> int | float | None:
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return None
