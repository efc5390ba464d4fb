"""Keyword resolution of ``Objective(**keywords)``: which part each keyword selects or parameterises, the
objective-wide fields, and the merge rule every construction route shares (``merge_spec``).

- ``resolve(spec)``: explicit keywords → (``General``, kind → part), refusing unknown keywords (with the
  nearest valid one), values out of range, parameters of parts that are not selected (naming both keywords)
  and combinations that are valid one by one but not together;
- ``merge_spec(base, overrides)``: a kind switched to another part drops the old part's explicit parameters
  that the new part does not declare;
- ``owners_by_keyword()``: parameter keyword → the parts that declare it (the docs tables read it too);
- ``flat_keywords(keywords)``: a part addressed as a whole, ``trust_region={"name": "cispo", "eps_high": 4.0}``,
  → the flat keywords ``trust_region="cispo", eps_high=4.0`` every other function reads;
- ``read_keyword(key, general, parts)``: the value ``objective.<key>`` reads.

The maths of the objective (``lmpo.objectives.objective``) knows none of this.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmpo._hints import type_hints
from lmpo.config import ConfigError, FieldTypeError, check_value

from .parts import KINDS, Part
from .parts.base import coerce_param, param

ADVANTAGE_SCALES = ("group", "batch", "none")
"""How the advantages fed to the objective are scaled (see ``lmpo.objectives.advantages``)."""

SELECTORS: dict[str, str] = {kind: kind for kind in KINDS if kind != "entropy_control"}
"""Keyword → kind, for the kinds selected by name."""

DEFAULT_PARTS: dict[str, str] = {
    "level": "token",
    "trust_region": "ppo",
    "credit": "none",
    "correction": "none",
    "rejection": "none",
    "entropy_control": "static",
    "cov_control": "none",
    "kl_estimator": "k3",
    "distill": "none",
    "aggregation": "seq_mean_token_mean",
}


@dataclass(frozen=True)
class General:
    """Objective-wide fields (not owned by any one part)."""

    name: str = param("custom", "preset the objective was built from (informational; not compared)")
    log_ratio_clamp: float = param(20.0, "log-ratios are clamped to ±this before exp (clamped tokens get no "
                                   "gradient through the ratio)", low=0.0, high=80.0, hint="The default is 20.")
    kl_coef: float = param(0.0, "β of the reference-KL term (0 disables it and the need for ref_logp)", low=0.0,
                           low_inclusive=True, hint="0 disables the KL term.")
    entropy_coef: float = param(0.0, "static entropy bonus coefficient (loss −= coef·aggregated entropy); 0 "
                                "disables it")
    advantage_scale: str = param("group", "advantage scaling the method expects (read by the caller): group | "
                                 "batch | none (Dr. GRPO)", choices=ADVANTAGE_SCALES)
    check_finite: bool = param(True, "check inputs for NaN/inf at valid tokens (one fused reduction and one host "
                               "sync per call)")


GENERAL_FIELDS = tuple(f.name for f in dataclasses.fields(General))


def owners_by_keyword() -> dict[str, list[tuple[str, str]]]:
    """Parameter keyword → [(kind, part name)] of every registered part that declares it."""
    return _owners_for(tuple(len(r) for r in KINDS.values()))


@functools.lru_cache(maxsize=4)
def _owners_for(sizes: tuple[int, ...]) -> dict[str, list[tuple[str, str]]]:
    # keyed by the registry sizes, so a part registered later (by a user) is seen
    owners: dict[str, list[tuple[str, str]]] = {}
    for kind, registry in KINDS.items():
        for name, cls in registry.items():
            for p in cls.params():
                owners.setdefault(p, []).append((kind, name))
    return owners


def all_keywords() -> list[str]:
    return sorted(set(GENERAL_FIELDS) | set(SELECTORS) | {"adaptive_entropy"} | set(owners_by_keyword()))


_ENTROPY_CONTROL_BY_FLAG = {False: "static", True: "adaptive"}
"""``adaptive_entropy`` → the entropy control it selects."""


def selected(spec: Mapping[str, Any], kind: str) -> str:
    if kind == "entropy_control":
        return _ENTROPY_CONTROL_BY_FLAG[bool(spec.get("adaptive_entropy", False))]
    return spec.get(kind, DEFAULT_PARTS[kind])


def read_keyword(key: str, general: General, parts: Mapping[str, Part]) -> Any:
    """``objective.<key>``: an objective-wide field, the name of the part a selector chose, or the effective value
    of a part parameter (:meth:`Part.value`); a parameter of a part that is not selected reads as that part's
    ``off`` value (None unless the parameter declares one). Raises AttributeError for anything else."""
    if key in GENERAL_FIELDS:
        return getattr(general, key)
    if key in SELECTORS:
        return parts[key].name
    if key == "adaptive_entropy":
        return _ENTROPY_CONTROL_BY_FLAG[True] == parts["entropy_control"].name
    owners = owners_by_keyword().get(key)
    if owners is None:
        raise AttributeError(f"Objective has no field {key!r}")
    for kind, _ in owners:
        if key in parts[kind].params():
            return parts[kind].value(key)
    kind, name = owners[0]
    return KINDS[kind][name].off(key)


def flat_keywords(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """Keywords with every part given as a whole turned into flat keywords.

    ``trust_region={"name": "cispo", "eps_high": 4.0}`` becomes ``trust_region="cispo", eps_high=4.0``;
    without ``"name"`` the mapping sets parameters of whichever part of the kind ends up selected
    (``trust_region={"eps_high": 0.3}`` is ``eps_high=0.3``). Flat keywords pass unchanged, so both spellings mix.
    Refused (``ConfigError``): a key of the mapping that no part of the kind declares, or that the named part does
    not declare, and a parameter given both in a mapping and flat with different values.
    """
    out: dict[str, Any] = {}
    nested: dict[str, tuple[str, Any]] = {}  # parameter → (the kind whose mapping gave it, its value there)
    for key, value in keywords.items():
        if key not in SELECTORS or not isinstance(value, Mapping):
            out[key] = value
            continue
        registry = KINDS[key]
        params = dict(value)
        name = params.pop("name", None)
        if name is not None:
            out[key] = name
            declared = registry[name].params()  # an unknown name raises naming the valid ones
            whose = f"{key} {name!r}"
        else:
            declared = tuple(dict.fromkeys(p for cls in registry.values() for p in cls.params()))
            whose = f"any {key}"
        for param_key, param_value in params.items():
            if param_key not in declared:
                close = difflib.get_close_matches(str(param_key), declared, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                listed = ", ".join(declared) if declared else "none"
                raise ConfigError(f"{key}={dict(value)!r}: {param_key!r} is not a parameter of {whose} (its "
                                  f"parameters: {listed}).{hint}")
            nested[param_key] = (key, param_value)
    for param_key, (kind, param_value) in nested.items():
        if param_key in keywords and keywords[param_key] != param_value:
            raise ConfigError(f"{param_key} is given twice, {param_key}={keywords[param_key]!r} and inside "
                              f"{kind}={dict(keywords[kind])!r}; give it once.")
        out[param_key] = param_value
    return out


def merge_spec(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Explicit keywords ``base`` updated with ``overrides``; a kind switched to another part drops the old
    part's explicit parameters that the new part does not declare. A part given as a whole in ``overrides`` is
    flattened first (``flat_keywords``)."""
    overrides = flat_keywords(overrides)
    spec = dict(base)
    for kind, registry in KINDS.items():
        old, new = selected(base, kind), selected({**base, **overrides}, kind)
        if old == new or old not in registry or new not in registry:
            continue
        keep = set(registry[new].params())
        for p in registry[old].params():
            if p not in keep and p not in overrides:
                spec.pop(p, None)
    spec.update(overrides)
    return spec


def resolve(spec: dict[str, Any]) -> tuple[General, dict[str, Part]]:
    """Explicit keywords → (objective-wide fields, kind → part). Raises naming the keyword and the fix."""
    owners = owners_by_keyword()
    unknown = [k for k in spec if k not in GENERAL_FIELDS and k not in SELECTORS and k != "adaptive_entropy"
               and k not in owners]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, all_keywords(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise FieldTypeError(f"unknown Objective field {key!r}.{hint} Valid fields: "
                        f"{', '.join(k for k in all_keywords() if k != 'name')}.")
    hints = type_hints(General)
    general_kw = {}
    for f in dataclasses.fields(General):
        if f.name in spec:
            value = coerce_param("Objective", f.name, spec[f.name], hints[f.name])
            check_value(value, f.metadata, f.name, tp=hints[f.name], owner="Objective")
            general_kw[f.name] = value
    if "adaptive_entropy" in spec:
        check_value(spec["adaptive_entropy"], {}, "adaptive_entropy", tp=bool, owner="Objective")
    general = General(**general_kw)

    parts: dict[str, Part] = {}
    consumed = set(GENERAL_FIELDS) | set(SELECTORS) | {"adaptive_entropy"}
    for kind, registry in KINDS.items():
        cls = registry[selected(spec, kind)]
        part_hints = type_hints(cls)
        params = {p: coerce_param(f"{kind} {cls.name!r}", p, spec[p], part_hints[p])
                  for p in cls.params() if p in spec}
        parts[kind] = cls(**params)
        consumed |= set(params)
    for key in spec:
        if key not in consumed and spec[key] is not None:  # None leaves a parameter unset
            _refuse_unselected(key, spec, owners[key])
    _check_combinations(general, parts)
    return general, parts


def _refuse_unselected(key: str, spec: Mapping[str, Any], owners: list[tuple[str, str]]) -> None:
    """A parameter given for a part that is not selected: a bad value is reported as such, any other value is
    refused naming the part that reads it."""
    kind = owners[0][0]
    names = [name for _, name in owners]
    cls = KINDS[kind][names[0]]
    field = next(f for f in dataclasses.fields(cls) if f.name == key)
    hint_type = type_hints(cls)[key]
    check_value(coerce_param(kind, key, spec[key], hint_type), field.metadata, key, tp=hint_type,
                owner=f"{kind} {names[0]!r}")
    selector = "adaptive_entropy" if kind == "entropy_control" else kind
    if kind == "entropy_control":
        wanted, where = "True", "adaptive_entropy=True"
    elif len(names) > 1:
        wanted = repr(names[0])
        where = f"{cls.family or 'one of ' + kind} ({', '.join(names)})"
    else:
        wanted, where = repr(names[0]), f"{kind}={names[0]!r}"
    verb = "needs" if len(names) > 1 else "only applies with"
    raise ConfigError(f"{key}={spec[key]!r} {verb} {where}, but {selector}={_value_for(spec, kind)!r}; drop {key} "
                     f"or set {selector}={wanted}.")


def _value_for(spec: Mapping[str, Any], kind: str) -> Any:
    if kind == "entropy_control":
        return bool(spec.get("adaptive_entropy", False))
    return selected(spec, kind)


def _check_combinations(general: General, parts: dict[str, Part]) -> None:
    """Choices that are valid one by one but not together."""
    if parts["entropy_control"].name == "adaptive" and general.entropy_coef != 0.0:
        raise ConfigError(f"entropy_coef={general.entropy_coef!r} and adaptive_entropy=True: the adaptive controller "
                         f"sets the entropy coefficient itself; drop entropy_coef or set adaptive_entropy=False.")
    trust_region, level = parts["trust_region"], parts["level"]
    if trust_region.levels is not None and level.name not in trust_region.levels:
        wanted = " or ".join(repr(name) for name in trust_region.levels)
        raise ConfigError(f"trust_region={trust_region.name!r} builds its own weight from the token log-ratios and "
                         f"ignores the level's, so level={level.name!r} has no effect; set level={wanted} or pick "
                         f"another trust region.")
