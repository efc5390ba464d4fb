"""The one configuration base of lmpo: the trainer, RLVCR, the text environment and SAC are built on it.

A configuration is a tree of frozen dataclasses. Every field is declared with :func:`option`, which keeps its
documentation and its allowed values in the field's metadata::

    @dataclass(frozen=True)
    class OptimConfig:
        lr: float = option(1e-5, "Peak learning rate.", gt=0)
        schedule: str = option("constant", "constant | linear | cosine.", choices=("constant", "linear", "cosine"))

From that metadata alone this module

* builds a config from nested dicts (:func:`from_dict`): unknown keys are answered with the closest valid
  name, values are coerced to the annotated type (``"1e-4"`` → ``1e-4``), and each value is checked against
  its range (``gt``/``ge``/``lt``/``le``), its ``choices`` and, for floats, finiteness (``.inf`` and ``.nan``
  are refused unless ``finite=False``);
* loads YAML files plus dotted ``--section.key value`` overrides (:func:`load`, :func:`read_yaml`), with
  a malformed file reported by file, line and column;
* accepts the flat names of a config whose fields moved into sections (:func:`flat_aliases`: one declared
  table maps ``nce_tau`` to ``infonce.tau`` for YAML keys, dotted overrides, keyword arguments and attribute
  reads alike);
* turns a config back into plain data (:func:`to_dict`, :func:`save_yaml`) and lists what differs
  between two of them (:func:`changed_keys`, used by ``--resume``);
* renders the reference tables of the docs (:func:`render_reference`).

The field schema (:func:`option`, :func:`check_value`, :class:`ConfigError`) is shared with the objective
parts (``lmpo.objectives.parts.base.param`` is :func:`option` with the bounds spelled ``low``/``high``), so a
section's field and a part's parameter are declared, checked and reported the same way. A value of the wrong
type is a :class:`FieldTypeError`, a ``ConfigError`` that is also a ``TypeError``. The message names the field
in the spelling its user wrote: a config key (```rollout.top_p` = 1.5 must be in (0, 1] (…).``) or, with an
``owner``, a keyword argument (``eps_low=0.0 is out of range; it must lie in (0, 1] (trust_region 'ppo').``).

Checks that relate several fields (a divisor, a registry name, a file that
must exist) stay in a ``validate`` method of each section. Every error is a :class:`ConfigError` — an
:class:`lmpo.errors.InputError` whose one-paragraph message names the key, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from lmpo._hints import type_hints
from lmpo.errors import InputError
from lmpo.overrides import parse_overrides as _parse_overrides

__all__ = ["BOUND_KEYS", "ConfigError", "FieldTypeError", "aliases_of", "bounds", "changed_keys", "check_fields",
           "check_value", "coerce", "deep_merge", "fields_of", "flat_aliases", "from_dict", "generated_block",
           "idle_fields", "interval_text", "is_config_class", "load", "merge_layers", "number_type", "option", "parse_overrides",
           "range_text", "read_yaml", "render_reference", "save_yaml", "to_dict", "unknown_key_error"]


# ----------------------------------------------------------------------------------------------------
# The field schema: one declaration helper, one check, one error type
# ----------------------------------------------------------------------------------------------------


class ConfigError(InputError):
    """A configuration value is invalid. The message names the field, the value and the fix."""


class FieldTypeError(ConfigError, TypeError):
    """A field's value has the wrong type (a string for a number, a number for a flag), or a keyword names no field
    (a ``TypeError`` as Python's own for an unexpected keyword argument)."""


#: metadata keys of a range bound
BOUND_KEYS = ("gt", "ge", "lt", "le")


def option(default: Any, help: str, *, gt: float | None = None, ge: float | None = None,
           lt: float | None = None, le: float | None = None, choices: Iterable[Any] | None = None,
           finite: bool = True, hint: str = "", **metadata: Any) -> Any:
    """A dataclass field with its documentation and its allowed values.

    ``gt``/``ge``/``lt``/``le``: exclusive / inclusive bounds (a ``None`` value is never range-checked);
    ``choices``: the allowed values; ``finite``: refuse inf/nan floats (default); ``hint``: a sentence
    appended to an error (how to fix it); ``needs``: the sibling field (a switch) without which this one has
    no effect (:func:`idle_fields`; the reference table says so). Mutable defaults (dict, list) go through a
    factory.
    """
    meta = {"help": help, **metadata}
    for key, value in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le), ("hint", hint)):
        if value not in (None, ""):
            meta[key] = value
    if choices is not None:
        meta["choices"] = tuple(choices)
    if not finite:
        meta["finite"] = False
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def bounds(low: float | None = None, high: float | None = None, *, low_inclusive: bool = False,
           high_inclusive: bool = True) -> dict[str, float]:
    """``low``/``high`` with inclusiveness flags → the ``gt``/``ge``/``lt``/``le`` keys of :func:`option`."""
    out: dict[str, float] = {}
    if low is not None:
        out["ge" if low_inclusive else "gt"] = low
    if high is not None:
        out["le" if high_inclusive else "lt"] = high
    return out


def range_text(meta: Mapping[str, Any]) -> str:
    """``{"gt": 0, "le": 1}`` → ``"in (0, 1]"``; ``{"ge": 0}`` → ``">= 0"``; ``""`` when unbounded."""
    low = ("(", meta["gt"]) if "gt" in meta else ("[", meta["ge"]) if "ge" in meta else None
    high = (")", meta["lt"]) if "lt" in meta else ("]", meta["le"]) if "le" in meta else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    if high:
        return f"{'<' if high[0] == ')' else '<='} {high[1]}"
    return ""


def interval_text(meta: Mapping[str, Any]) -> str:
    """The bounds as an interval: ``{"gt": 0, "le": 1}`` → ``"(0, 1]"``, ``{"ge": 0}`` → ``"[0, inf)"``."""
    lo = f"[{meta['ge']:g}" if "ge" in meta else f"({meta['gt']:g}" if "gt" in meta else "(-inf"
    hi = f"{meta['le']:g}]" if "le" in meta else f"{meta['lt']:g})" if "lt" in meta else "inf)"
    return f"{lo}, {hi}"


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    cut = text.find(". ")
    return text if cut < 0 else text[: cut + 1]


def number_type(tp: Any) -> type | None:
    """float / int for a (possibly optional) numeric annotation, else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_args(tp) else [tp]
    for a in args:
        if a in (float, int):
            return a
    return None


def check_value(value: Any, meta: Mapping[str, Any], where: str, *, tp: Any = None, owner: str | None = None) -> None:
    """Check one value against its field's metadata (choices, type, finiteness, range); raise ConfigError.

    ``where``: the config key (``"rollout.top_p"``) or, with ``owner`` given (or ``tp``, for a value that was
    not coerced from YAML), the keyword (``"eps_low"``) and what reads it (``"trust_region 'ppo'"``). ``tp``:
    the field's annotation; when given, the value's type is checked too (:class:`FieldTypeError`).
    """
    keyword = owner is not None or tp is not None
    if value is None and (tp is None or "None" in str(tp)):
        return
    hint = f" {meta['hint']}" if meta.get("hint") else ""
    of = f" ({owner})" if owner else ""
    choices = meta.get("choices")
    if choices is not None:
        if value in choices:
            return
        names = [str(c) for c in choices]
        if keyword:
            close = difflib.get_close_matches(str(value), names, n=1)
            did = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}={value!r}{of} is not a known choice; use one of "
                              f"{', '.join(map(repr, choices))}.{did}")
        close = difflib.get_close_matches(str(value), names, n=2, cutoff=0.5)
        did = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"`{where}` = {value!r} is not one of {', '.join(names)}.{did}{hint}")
    if tp is not None:
        if tp is bool or str(tp) == "bool":
            if not isinstance(value, bool):
                raise FieldTypeError(f"{where}={value!r}{of} must be true or false.")
            return
        if number_type(tp) is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldTypeError(f"{where}{of} must be a number, got {value!r} ({type(value).__name__}).")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    finite = math.isfinite(value)
    ok = ((finite or not meta.get("finite", True))
          and ("gt" not in meta or value > meta["gt"]) and ("ge" not in meta or value >= meta["ge"])
          and ("lt" not in meta or value < meta["lt"]) and ("le" not in meta or value <= meta["le"]))
    if ok:
        return
    if keyword:
        raise ConfigError(f"{where}={value!r} is out of range; it must lie in {interval_text(meta)}{of}.{hint}")
    if not finite and meta.get("finite", True):
        raise ConfigError(f"`{where}` = {value!r} must be a finite number"
                          f"{' ' + range_text(meta) if range_text(meta) else ''}.{hint}")
    what = _first_sentence(meta.get("help", ""))
    raise ConfigError(f"`{where}` = {value!r} must be {range_text(meta)}"
                      f"{f' ({what.rstrip(chr(46))})' if what else ''}.{hint}")


# ----------------------------------------------------------------------------------------------------
# Type coercion and per-field checks
# ----------------------------------------------------------------------------------------------------


def is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML / command-line value to the annotated type, or raise ConfigError naming the field."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        last: ConfigError | None = None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, where)
            except ConfigError as e:
                last = e
        assert last is not None
        raise last
    if is_config_class(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"`{where}` must be a mapping (a YAML section), got {value!r}; write its keys "
                              f"as `{where}.KEY VALUE` or as an indented YAML block.")
        return from_dict(tp, value, where)
    if origin is tuple:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{where}` = {value!r} must be a list.")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"`{where}` = {value!r} must be a list of {len(args)} values.")
        return tuple(coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is dict or origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"`{where}` = {value!r} must be a mapping.")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ConfigError(f"`{where}` = {value!r} must be true or false.")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"`{where}` = {value!r} must be an integer.")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    f = math.nan
                if f.is_integer():
                    return int(f)
        raise ConfigError(f"`{where}` = {value!r} must be an integer.")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"`{where}` = {value!r} must be a number.")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"`{where}` = {value!r} must be a string.")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"`{where}` = {value!r} must be null.")
    return value


def fields_of(cfg_or_cls: Any) -> Iterator[tuple[dataclasses.Field, Any]]:
    """``(field, resolved type)`` of a config class or instance."""
    cls = cfg_or_cls if isinstance(cfg_or_cls, type) else type(cfg_or_cls)
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def check_fields(cfg: Any, where: str = "") -> None:
    """Check every field of ``cfg`` (and of its sections) against its metadata; raise ConfigError."""
    for f, _ in fields_of(cfg):
        value = getattr(cfg, f.name)
        key = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value):
            check_fields(value, key)
        elif isinstance(value, tuple):
            for i, v in enumerate(value):
                if dataclasses.is_dataclass(v):  # a list of sections (reward models in rewards.functions)
                    check_fields(v, f"{key}[{i}]")
                else:
                    check_value(v, f.metadata, f"{key}[{i}]")
        else:
            check_value(value, f.metadata, key)


def idle_fields(cfg: Any, switch: str) -> list[str]:
    """The fields of ``cfg`` declared ``needs=switch`` that differ from their declared default while the switch
    is off (false or 0), in declaration order: settings that would have no effect (``[]`` when it is on)."""
    if getattr(cfg, switch):
        return []
    return [f.name for f in dataclasses.fields(cfg)
            if f.metadata.get("needs") == switch and getattr(cfg, f.name) != _default(f)]


# ----------------------------------------------------------------------------------------------------
# dict <-> config
# ----------------------------------------------------------------------------------------------------


def unknown_key_error(cls: type, key: str, where: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
    flat = list(aliases_of(cls))
    close = difflib.get_close_matches(key, names + flat, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
    path = f"{where}.{key}" if where else key
    also = f" (or the flat names {', '.join(flat)})" if flat else ""
    return ConfigError(f"unknown config key `{path}`.{hint} Valid keys here: {', '.join(names)}{also}.")


# ----------------------------------------------------------------------------------------------------
# Flat names of fields that live in sections
# ----------------------------------------------------------------------------------------------------

#: the class attribute holding a config's alias table (flat name → dotted field paths)
_ALIASES = "__config_aliases__"


def aliases_of(cls_or_cfg: Any) -> dict[str, tuple[str, ...]]:
    """The flat-name table of a config class (:func:`flat_aliases`); ``{}`` for one without."""
    cls = cls_or_cfg if isinstance(cls_or_cfg, type) else type(cls_or_cfg)
    return dict(cls.__dict__.get(_ALIASES, {}))


def _leaf(cls: type, path: str) -> tuple[dataclasses.Field, Any]:
    """``(field, type)`` of the field at dotted ``path`` below ``cls``."""
    head, _, rest = path.partition(".")
    types_ = {f.name: (f, tp) for f, tp in fields_of(cls)}
    if head not in types_:
        raise KeyError(path)
    f, tp = types_[head]
    if not rest:
        return f, tp
    if not is_config_class(tp):
        raise KeyError(path)
    return _leaf(tp, rest)


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _with(section: Any, path: list[str], value: Any) -> Any:
    """``section`` (a frozen config) with the field at ``path`` set to ``value``."""
    head, *rest = path
    if not rest:
        return dataclasses.replace(section, **{head: value})
    return dataclasses.replace(section, **{head: _with(getattr(section, head), rest, value)})


def flat_aliases(table: Mapping[str, str | tuple[str, ...]]) -> Callable[[type], type]:
    """Class decorator (above ``@dataclass``): flat names for fields that live in the config's sections.

    ``table`` maps a flat name to the dotted path of the field it stands for, or to several paths that it sets
    together (``"ngram_n": ("coverage.ngram_n", "infonce.ngram_n")``). A flat name is accepted everywhere the
    config is written:

    * YAML keys and dotted overrides (:func:`from_dict`): ``env: {nce_tau: 0.1}`` or ``--env.nce_tau 0.1`` is
      ``env.infonce.tau``; a bad value is reported under the name its user wrote (```env.nce_tau` = -1 …``),
      and a field set under both of its names with different values is refused;
    * keyword arguments: ``EnvConfig(nce_tau=0.1)`` (applied on top of a section passed as well);
    * attribute reads: ``cfg.nce_tau`` (the first path of a name with several).

    A path without a dot renames a field of the class itself: the YAML spelling of a field whose name is a Python
    keyword (``{"import": "imports"}`` lets a config write ``env: {import: [...]}``).

    The table is checked when the class is defined: each path names a field (of a section, or of the class), no
    path is the target of two names, and no flat name is a field itself.
    """

    def decorate(cls: type) -> type:
        norm = {name: (paths,) if isinstance(paths, str) else tuple(paths) for name, paths in table.items()}
        seen: dict[str, str] = {}
        names = {f.name for f in dataclasses.fields(cls)}
        for name, paths in norm.items():
            if name in names or not paths:
                raise TypeError(f"{cls.__name__}: flat name {name!r} is a field itself or names no field")
            for path in paths:
                if path in seen:
                    raise TypeError(f"{cls.__name__}: alias {name!r} → {path!r} is already the target of "
                                    f"{seen[path]!r}")
                try:
                    _leaf(cls, path)
                except KeyError:
                    raise TypeError(f"{cls.__name__}: alias {name!r} → {path!r} names no field") from None
                seen[path] = name
        setattr(cls, _ALIASES, norm)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            flat = {k: kwargs.pop(k) for k in list(kwargs) if k in norm}
            if flat:
                fields = {f.name: f for f in dataclasses.fields(cls)}
                for name, value in flat.items():
                    for path in norm[name]:
                        head, *rest = path.split(".")
                        kwargs[head] = _with(kwargs.get(head, _default(fields[head])), rest, value) if rest else value
            init(self, *args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            paths = norm.get(name)
            if paths is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            value = self
            for part in paths[0].split("."):
                value = getattr(value, part)
            return value

        cls.__init__ = __init__  # type: ignore[method-assign]
        cls.__getattr__ = __getattr__  # type: ignore[attr-defined]
        return cls

    return decorate


def coerced_and_checked(value: Any, f: dataclasses.Field, tp: Any, where: str) -> Any:
    """``value`` coerced to the field's type ``tp`` and checked against its bounds (each item of a tuple; a nested
    section checks itself); errors name ``where``."""
    value = coerce(value, tp, where)
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            check_value(v, f.metadata, f"{where}[{i}]")
    elif not dataclasses.is_dataclass(value):
        check_value(value, f.metadata, where)
    return value


def _canonical(cls: type, data: Mapping[str, Any], where: str) -> dict:
    """``data`` with its flat names written as the nested sections they stand for (values coerced and checked
    under the flat name; a field set twice, under both names, with different values is a ConfigError)."""
    table = aliases_of(cls)
    if not table or not any(k in table for k in data):
        return dict(data)
    out = {k: v for k, v in data.items() if k not in table}
    for key, value in data.items():
        if key not in table:
            continue
        spelled = f"{where}.{key}" if where else key
        f, tp = _leaf(cls, table[key][0])
        value = coerced_and_checked(value, f, tp, spelled)
        for path in table[key]:
            *heads, leaf = path.split(".")
            node = out
            for head in heads:
                sub = node.get(head)
                sub = {} if sub is None else to_dict(sub) if dataclasses.is_dataclass(sub) else sub
                if not isinstance(sub, Mapping):
                    raise ConfigError(f"`{where + '.' if where else ''}{head}` must be a mapping (a YAML section), "
                                      f"got {sub!r}.")
                node[head] = node = dict(sub)
            if leaf in node and node[leaf] != value:
                nested = f"{where}.{path}" if where else path
                raise ConfigError(f"`{spelled}` = {value!r} and `{nested}` = {node[leaf]!r} set the same field; "
                                  f"write it once (`{path}`, or its flat name `{key}`).")
            node[leaf] = value
    return out


def _section_type(cls: type | None, key: str) -> type | None:
    if cls is None:
        return None
    tp = {f.name: tp for f, tp in fields_of(cls)}.get(key)
    return tp if is_config_class(tp) else None


def _leaves(cls: type | None, data: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The canonical dotted paths of the leaves ``data`` sets (flat names resolved; no values checked)."""
    table = aliases_of(cls) if cls is not None else {}
    out: set[str] = set()
    for key, value in data.items():
        if key in table:
            out.update(prefix + p for p in table[key])
        elif isinstance(value, Mapping):
            out.update(_leaves(_section_type(cls, key), value, f"{prefix}{key}."))
        else:
            out.add(prefix + str(key))
    return out


def _drop(cls: type | None, data: Mapping[str, Any], paths: set[str], prefix: str = "") -> dict:
    """``data`` without the leaves at ``paths`` (under either name)."""
    table = aliases_of(cls) if cls is not None else {}
    out = {}
    for key, value in data.items():
        if key in table:
            if any(prefix + p in paths for p in table[key]):
                continue
        elif isinstance(value, Mapping):
            kept = _drop(_section_type(cls, key), value, paths, f"{prefix}{key}.")
            if value and not kept:
                continue  # every key of this section is set again by the later layer
            value = kept
        elif prefix + str(key) in paths:
            continue
        out[key] = value
    return out


@functools.cache
def _has_aliases(cls: type) -> bool:
    return bool(aliases_of(cls)) or any(is_config_class(tp) and _has_aliases(tp) for _, tp in fields_of(cls))


def merge_layers(cls: type, base: Mapping | None, over: Mapping | None) -> dict:
    """:func:`deep_merge` for the data of ``cls``: a field ``over`` sets, under either of its names (flat or in
    its section), replaces the value ``base`` gives it under either name, so a later layer (YAML over a preset,
    a command-line override over YAML) wins whichever spelling each uses."""
    base, over = dict(base or {}), dict(over or {})
    if not over or not _has_aliases(cls):
        return deep_merge(base, over)
    return deep_merge(_drop(cls, base, _leaves(cls, over)), over)


def from_dict(cls: type, data: Mapping[str, Any] | None, where: str = "") -> Any:
    """Build ``cls`` from a nested dict: unknown keys, wrong types and out-of-range values raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"`{where or 'config'}` must be a mapping of keys to values, got {data!r}.")
    types_ = {f.name: (f, tp) for f, tp in fields_of(cls)}
    data = _canonical(cls, data, where)
    kwargs = {}
    for key, value in data.items():
        if key not in types_:
            raise unknown_key_error(cls, str(key), where)
        f, tp = types_[key]
        sub = f"{where}.{key}" if where else str(key)
        value = coerced_and_checked(value, f, tp, sub)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a section's own cross-field check
        raise ConfigError(f"`{where or cls.__name__}`: {e}") from e


def to_dict(cfg: Any) -> dict:
    """Nested plain dict (tuples as lists) suitable for YAML / JSON."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        elif isinstance(v, dict):
            v = dict(v)
        out[f.name] = v
    return out


def deep_merge(base: Mapping, over: Mapping) -> dict:
    """``base`` with ``over`` laid on top, section by section."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_overrides(argv: list[str]) -> dict:
    """``["--objective.preset", "dapo", "--optim.lr=1e-4"]`` → nested dict (:func:`lmpo.overrides.parse_overrides`)."""
    return _parse_overrides(argv, error=ConfigError)


def read_yaml(path: str | os.PathLike, what: str = "config file") -> dict:
    """A YAML mapping from ``path`` (``yaml.safe_load``: tags that would build Python objects are refused)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} {str(path)!r} does not exist; pass the path of a YAML file (see configs/).")
    if p.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a directory; pass the path of a YAML file inside it.")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte offset {e.start}); save it as UTF-8.") \
            from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{what} {str(path)!r} is not valid YAML{at}: {problem}. Fix the file (YAML needs "
                          "`key: value` pairs, spaces not tabs for indentation).") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(path)!r} must hold a YAML mapping of keys to values, not a "
                          f"{type(data).__name__}.")
    return data


def load(cls: type, path: str | os.PathLike | None = None, overrides: list[str] | Mapping | None = None, *,
         base: Mapping | None = None) -> Any:
    """``base`` dict (e.g. a preset) ← YAML file ← overrides (``--a.b value`` list or nested dict) → ``cls``."""
    data: dict = dict(base or {})
    if path is not None:
        data = merge_layers(cls, data, read_yaml(path))
    if overrides:
        over = parse_overrides(list(overrides)) if not isinstance(overrides, Mapping) else overrides
        data = merge_layers(cls, data, over)
    return from_dict(cls, data)


def save_yaml(cfg: Any, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(to_dict(cfg), fh, sort_keys=False, allow_unicode=True)


def changed_keys(old: Mapping, new: Mapping, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every leaf that differs between two config dicts."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping) and (a or b) and _is_section(a, b):
            out.extend(changed_keys(a, b, f"{name}."))  # free-form dicts too: the message names the inner key
        elif _plain(a) != _plain(b):
            out.append((name, a, b))
    return out


def _is_section(a: Mapping, b: Mapping) -> bool:
    return all(isinstance(k, str) for k in (*a, *b))


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


# ----------------------------------------------------------------------------------------------------
# Reference documentation rendered from the dataclasses
# ----------------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    s = str(tp) if not isinstance(tp, type) else tp.__name__
    s = re.sub(r"\b(?:[a-z_]+\.)+(?=[A-Z])", "", s)  # lmpo.trainer.config.RewardModelConfig → RewardModelConfig
    return s.replace("typing.", "").replace("NoneType", "None")


def _fmt_default(v: Any) -> str:
    if dataclasses.is_dataclass(v):
        return "(section)"
    if isinstance(v, tuple):
        v = [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
    return "`" + yaml.safe_dump(v, default_flow_style=True, allow_unicode=True).strip().removesuffix("...").strip() \
        + "`"


def _allowed(meta: Mapping[str, Any]) -> str:
    if meta.get("choices") is not None:
        return "one of " + ", ".join(f"`{c}`" for c in meta["choices"])
    return range_text(meta)


def generated_block(text: str, name: str) -> str:
    """The text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` (a generated part of a doc)."""
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    return text[text.index(start) + len(start): text.index(end)]


def render_reference(cls: type, prefix: str = "") -> str:
    """Markdown tables of every field of the config class ``cls``, one table per section.

    When every field of ``cls`` is a section, each is a table named after its field; otherwise ``cls`` itself
    is the first table (keys written ``prefix.key``, or bare without a prefix) followed by its sections.
    """
    lines: list[str] = []

    def section(c: type, pre: str) -> None:
        title = f"`{pre}`" if pre else "top-level keys"
        lines.append(f"### {title} — {(c.__doc__ or '').strip().splitlines()[0]}")
        lines.append("")
        head = len(lines)
        lines.append("| key | type | default | meaning |")
        lines.append("|---|---|---|---|")
        subs = []
        for f, tp in fields_of(c):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            key = f"{pre}.{f.name}" if pre else f.name
            if dataclasses.is_dataclass(default):
                subs.append((type(default), key))
                continue
            # entries of a list that may be sections themselves (reward models in rewards.functions)
            if typing.get_origin(tp) is tuple:
                item = typing.get_args(tp)[0]
                for arg in typing.get_args(item) or (item,):
                    if is_config_class(arg):
                        subs.append((arg, f"{key}[]"))
            meaning = f.metadata.get("help", "")
            allowed = _allowed(f.metadata)
            if allowed:
                meaning = f"{meaning} Allowed: {allowed}."
            needs = f.metadata.get("needs")
            if needs:
                off = "false" if type_hints(c).get(needs) is bool else "0"
                meaning = f"{meaning} No effect while `{pre + '.' if pre else ''}{needs}` is {off}."
            cells = [f"`{key}`", _type_name(tp), _fmt_default(default), meaning]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        if len(lines) == head + 2:  # sections only: no table of its own
            del lines[head:]
            lines.append(f"Sections: {', '.join(f'`{key}`' for _, key in subs)}.")
        lines.append("")
        table = aliases_of(c)
        if table:
            dot = f"{pre}." if pre else ""
            lines.append(f"Flat names: each key on the left is accepted for the field(s) on its right, in YAML, on "
                         f"the command line, as a keyword argument of `{c.__name__}` and as an attribute.")
            lines.append("")
            lines.append("| flat key | same as |")
            lines.append("|---|---|")
            for name, paths in table.items():
                lines.append(f"| `{dot}{name}` | {', '.join(f'`{dot}{p}`' for p in paths)} |")
            lines.append("")
        for sub_cls, sub_prefix in subs:
            section(sub_cls, sub_prefix)

    if prefix or not all(dataclasses.is_dataclass(f.default) for f, _ in fields_of(cls)):
        section(cls, prefix)  # keys written prefix.key (or bare, without a prefix), then each section
    else:  # a config whose fields are all sections (the trainer's): one table tree per section
        for f, _ in fields_of(cls):
            section(type(f.default), f.name)
    return "\n".join(lines).rstrip() + "\n"
