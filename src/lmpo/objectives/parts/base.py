"""What a part of an objective is, and the registry each kind of part has.

A part is a frozen dataclass of its own parameters. Its class declares

- ``kind`` and ``name``: the registry it belongs to and its name there (``TRUST_REGIONS["ppo"]``);
- ``needs``: the inputs it asks of the caller beyond ``(logp, old_logp, advantages, mask)``, from
  :data:`INPUTS`;
- ``stats``: the statistic keys it adds to an objective's stats, with their meaning. A part writes them itself:
  while the loss is built (the ``stats`` dict its kind's method receives) or afterwards in :meth:`Part.report`,
  which the objective calls for every part, so the objective knows no part's statistics;
- ``formula`` and ``source``: one line each for the generated tables; the class docstring is the reference.

Parameters are dataclass fields made with :func:`param` (:func:`lmpo.config.option`, the one field schema of
lmpo, with the range spelled ``low``/``high``), which records the help text and the allowed range or choices;
:meth:`Part.__post_init__` checks them with :func:`lmpo.config.check_value` (errors are
:class:`lmpo.config.ConfigError`, a ``ValueError``; a wrong type is also a ``TypeError``), so a part is valid once built and never written again
(defaults that depend on another parameter are resolved on read, by :meth:`Part.value`). ``param(..., off=v)``
declares what reading the parameter gives when its part is not selected (:meth:`Part.off`; None unless declared).

Adding a part is one new class decorated with its registry's ``register`` (plus its tests); the name lists,
validation messages and documentation tables are generated from the registries.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from lmpo._hints import type_hints
from lmpo.config import ConfigError, FieldTypeError, bounds, check_value, number_type, option

INPUTS: Mapping[str, str] = {
    "ref_logp": "(B, T) log-probs of the sampled tokens under the reference policy",
    "entropy": "(B, T) entropy of the policy's next-token distribution (with gradient for a bonus)",
    "token_grad_norm": "(B, T) per-token gradient norms ‖∇θ log π(y_t)‖ (mode named by the credit part)",
    "rollout_logp": "(B, T) log-probs the sampler (e.g. vLLM) gave the sampled tokens",
    "rollout_is_weights": "(B, T) rollout-correction weights the host computed itself (verl's rollout_is_weights)",
    "entropy_coef": "the adaptive controller's current coefficient (the driver passes it)",
    "logits": "(B, T, V) the policy's next-token logits at the completion positions, divided by the sampling "
              "temperature (with gradient)",
    "teacher_logits": "(B, T, V) the teacher's logits at the same positions, or (B, T, K) its top-K log-probs "
                      "(with teacher_ids) under distill_top_k = K",
    "teacher_ids": "(B, T, K) vocabulary ids of the teacher's top-K log-probs (only with distill_top_k = K > 0)",
}
"""Optional inputs a part may need, by the keyword the objective takes them under."""


def param(default: Any, help: str, *, low: float | None = None, high: float | None = None,
          low_inclusive: bool = False, high_inclusive: bool = True, choices: tuple | None = None,
          hint: str = "", off: Any = None) -> Any:
    """A part parameter: :func:`lmpo.config.option` with the range spelled ``low``/``high`` (exclusive below and
    inclusive above unless ``low_inclusive``/``high_inclusive`` say otherwise) or ``choices``. ``off``: the value
    an objective reads for it when its part is not selected (e.g. ``dual_clip`` reads False, not None)."""
    extra = {} if off is None else {"off": off}
    return option(default, help, choices=choices, hint=hint,
                  **bounds(low, high, low_inclusive=low_inclusive, high_inclusive=high_inclusive), **extra)


def coerce_param(owner: str, name: str, value: Any, tp: Any) -> Any:
    """A YAML / command-line value for a parameter annotated ``tp``: numbers written as strings
    (YAML 1.1 reads ``1e-4`` as a string) become numbers; anything else is returned unchanged."""
    number = number_type(tp)
    if number is not None and isinstance(value, str):
        try:
            return float(value) if number is float else int(value)
        except ValueError:
            raise FieldTypeError(f"{name}={value!r} ({owner}) must be a number.") from None
    return value


@dataclass(frozen=True)
class Part:
    """Base of every objective part (see the module docstring)."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    """What the parts sharing this base are called in errors, e.g. "a clipped trust region"."""
    needs: ClassVar[frozenset[str]] = frozenset()
    stats: ClassVar[Mapping[str, str]] = {}
    formula: ClassVar[str] = ""
    source: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = type_hints(type(self))
        owner = f"{self.kind} {self.name!r}"
        for f in dataclasses.fields(self):
            check_value(getattr(self, f.name), f.metadata, f.name, tp=hints[f.name], owner=owner)
        self.check()

    def check(self) -> None:
        """Checks that involve more than one parameter (ranges and choices are checked already)."""

    @classmethod
    def params(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def value(self, name: str) -> Any:
        """The effective value of a parameter (a default that depends on another one is resolved here)."""
        return getattr(self, name)

    @classmethod
    def off(cls, name: str) -> Any:
        """What reading parameter ``name`` gives when this part is not selected (``param(..., off=...)``)."""
        return next(f.metadata.get("off") for f in dataclasses.fields(cls) if f.name == name)

    def given(self) -> dict[str, Any]:
        """The parameters that differ from the class defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def report(self, stats: dict[str, torch.Tensor], ctx: Context, tally: Tally) -> None:
        """Add this part's statistics of one call to ``stats`` (detached 0-dim tensors under keys of
        ``self.stats``), once the loss is built; called under ``torch.no_grad`` for every part. Nothing by default:
        most parts write theirs while the loss is built."""


class Registry(Mapping[str, type]):
    """Name → part class for one kind of part. ``register`` is a class decorator."""

    def __init__(self, kind: str, title: str) -> None:
        self.kind = kind
        self.title = title
        self._entries: dict[str, type] = {}

    def register(self, cls: type) -> type:
        if not cls.name:
            raise TypeError(f"{cls.__name__} has no registry name")
        if cls.name in self._entries:
            raise ValueError(f"{self.kind} {cls.name!r} is registered twice ({self._entries[cls.name].__name__}, "
                             f"{cls.__name__})")
        cls.kind = self.kind
        self._entries[cls.name] = cls
        return cls

    def __getitem__(self, name: str) -> type:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            close = difflib.get_close_matches(str(name), list(self._entries), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{self.kind}={name!r} is not a known choice; use one of "
                             f"{', '.join(map(repr, self._entries))}.{hint}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, default: Any = None) -> Any:
        return self._entries.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"


class Tally(NamedTuple):
    """How the statistics reported after the loss count (:meth:`Part.report`): per valid token, or per non-empty
    sequence where the importance weight and the trust region's flags are one per sequence (sequence levels with
    per-sequence advantages). A statistic ``x`` of ``weight``'s shape is reported as ``Σ x·weight / count``."""

    weight: torch.Tensor
    """(B, T) the float mask m, or (B, 1) ``1[|y_i| > 0]`` when the statistics count sequences."""
    count: torch.Tensor
    """0-dim ``Σ weight``, at least 1."""
    per_sequence: bool
    """Whether ``weight`` is (B, 1)."""
    ratio: torch.Tensor
    """The detached importance weights ρ, broadcast to ``weight``'s shape."""
    low: torch.Tensor
    """Where the trust region's lower bound binds (bool or float 0/1), ``weight``'s shape."""
    high: torch.Tensor
    """Where its upper bound binds, ``weight``'s shape."""


class Context:
    """The tensors of one objective call, computed once and read by every part.

    Attributes:
        logp:      (B, T) the caller's log-probs (carry the gradient; garbage allowed at invalid positions).
        old_logp:  (B, T) the caller's behaviour log-probs (garbage allowed at invalid positions).
        valid:     (B, T) bool mask;  m: the same as float;  lengths: (B,) |y| = Σ_t m;  num_valid: N.
        diff:      (B, T) ``logp − sg[old_logp]`` at valid positions, 0 elsewhere (carries the gradient).
        log_ratio: (B, T) ``diff`` clamped to ±``clamp`` (the log-ratio every level exponentiates).
        adv:       (B, 1) or (B, T) detached advantages, 0 on empty rows / invalid positions.
        inputs:    optional inputs (``INPUTS``) at valid positions, 0 elsewhere.
        generator: torch.Generator for parts that draw random numbers, or None.
        credit:    (B, T) detached token credit weights, or None (set by the objective before the level runs).
        correction: (B, T) or (B, 1) detached rollout-correction weights, or None (set before the level runs).
        keep:      (B, T) or (B, 1) detached 0/1 rejection mask, or None (set before the level runs).
        term:      the trust region's ``TrustRegionTerm`` of this call, or None (set once the trust region ran).
    """

    __slots__ = ("logp", "old_logp", "valid", "m", "lengths", "num_valid", "diff", "log_ratio", "adv", "dtype", "inputs",
                 "generator", "clamp", "credit", "correction", "keep", "term", "_carrier", "_logp_valid",
                 "_old_valid", "_rollout_delta")

    def __init__(self, **values: Any) -> None:
        self._carrier = self._logp_valid = self._old_valid = self._rollout_delta = None
        self.credit = self.correction = self.keep = self.term = None
        for k, v in values.items():
            setattr(self, k, v)

    def zero_invalid(self, x: Any) -> Any:
        """(B, T) ``x`` at valid positions, 0 elsewhere (a select: garbage there, NaN included, goes nowhere)."""
        return torch.where(self.valid, x, 0.0)

    @property
    def logp_valid(self) -> Any:
        """(B, T) ``logp`` at valid tokens (with its gradient), 0 elsewhere: the ``−w·A·log π`` parts' factor."""
        if self._logp_valid is None:
            with torch.enable_grad():  # cached: built with its gradient even when first read under no_grad
                self._logp_valid = self.zero_invalid(self.logp.to(self.dtype))
        return self._logp_valid

    @property
    def old_valid(self) -> Any:
        """(B, T) detached ``old_logp`` at valid tokens, 0 elsewhere."""
        if self._old_valid is None:
            self._old_valid = self.zero_invalid(self.old_logp.detach().to(self.dtype))
        return self._old_valid

    @property
    def rollout_delta(self) -> Any:
        """(B, T) ``Δ_t = old_logp − rollout_logp`` (log π_old/π_rollout) at valid tokens, 0 elsewhere; detached."""
        if self._rollout_delta is None:
            self._rollout_delta = self.zero_invalid(self.old_logp.detach().to(self.dtype) - self.inputs["rollout_logp"])
        return self._rollout_delta

    @property
    def carrier(self) -> Any:
        """(B, T) ``diff − sg[diff]``: value 0, gradient ∇logπ_t at valid tokens. ``exp(v + carrier)`` has
        value e^v and gradient e^v·∇logπ_t (built on first use: only some levels need it)."""
        if self._carrier is None:
            self._carrier = self.diff - self.diff.detach()
        return self._carrier
