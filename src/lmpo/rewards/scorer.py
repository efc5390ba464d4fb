"""Reward lookup (built-in name or ``pkg.module:function``) and the weighted ``RewardScorer``."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmpo.errors import RunError
from lmpo.rewards.builtin import REWARDS


def load_reward_fn(path: str) -> Callable[..., list]:
    """Import a user reward function from ``"package.module:function"`` (``module:Class.method`` works).

    Errors name the path and what to fix: malformed path, module not importable, attribute missing,
    object not callable.
    """
    if ":" not in path:
        raise ValueError(
            f"reward {path!r} is not a built-in reward ({sorted(REWARDS)}) and not an import path; "
            "write user functions as 'package.module:function'"
        )
    module_name, _, attr_path = path.partition(":")
    if not module_name or not attr_path:
        raise ValueError(f"reward path {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ImportError(
            f"reward {path!r}: cannot import module {module_name!r} ({e}). Make sure the module is installed "
            "or its directory is on PYTHONPATH (e.g. run from the project root or `pip install -e .`)."
        ) from e
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise AttributeError(
                f"reward {path!r}: {getattr(obj, '__name__', module_name)!r} has no attribute {part!r}; "
                f"available names include {public}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(
            f"reward {path!r} resolves to a {type(obj).__name__}, which is not callable; point it at a "
            "function fn(prompts, completions, answer, **kwargs) -> list[float]"
        )
    return obj


class RewardExit(Exception):
    """A reward function called ``sys.exit()`` / ``exit()`` (raised ``SystemExit``): a bug of the function, reported
    like any exception it raises, never the silent end of a run."""


def call_reward(fn: Callable[..., Any], kwargs: dict[str, Any]) -> list:
    """``fn(**kwargs)`` as a list, running it to completion when it is an ``async def`` function (a coroutine).
    A ``SystemExit`` it raises becomes :class:`RewardExit`."""
    try:
        result = fn(**kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return list(result)
    except SystemExit as e:
        raise RewardExit(f"the function called sys.exit({e.code!r})") from None


#: the largest reward magnitude accepted: beyond it, float32 sums and squares over a batch overflow to inf
REWARD_LIMIT = 1e9
_LIMIT_TEXT = f"{REWARD_LIMIT:.0e}".replace("e+0", "e")  # "1e9"


class RewardTypeError(TypeError):
    """A reward function returned something that is not a number (nor None) for completion ``index``."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def reward_values(name: str, values: Sequence[Any]) -> tuple[torch.Tensor, list[int]]:
    """``(values as a float32 tensor (B,), indices of the non-finite ones)`` of one function's return value.

    None is "does not apply" (NaN, TRL's convention). A number that is NaN, ±inf or beyond ±``REWARD_LIMIT`` is
    listed among the non-finite indices (its entry NaN); anything else that is not a number (a string, a list) raises
    :class:`RewardTypeError` naming the completion.
    """
    out, bad = [], []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        try:
            if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
                raise TypeError
            x = float(v)
        except (TypeError, ValueError, RuntimeError):
            raise RewardTypeError(f"reward function {name!r} returned {_truncate(v)} ({type(v).__name__}) for "
                                  f"completion {i}; a reward is a number, or None where the function does not "
                                  "apply", i) from None
        if not (math.isfinite(x) and abs(x) <= REWARD_LIMIT):
            bad.append(i)
            x = math.nan
        out.append(x)
    return torch.tensor(out, dtype=torch.float32), bad


def nonfinite_error(name: str, value: Any, index: int, count: int, batch: int, prompts, completions, answers
                    ) -> RunError:
    """The message of ``rewards.on_error: raise`` for a non-finite reward value."""
    return RunError(f"reward function {name!r} returned {value!r} for sample {index} (prompt "
                    f"{_truncate(prompts[index])}, completion {_truncate(completions[index])}, answer "
                    f"{_truncate(answers[index])}); {count} of its {batch} values were NaN, infinite or beyond "
                    f"±{_LIMIT_TEXT}, which would make every advantage of the group NaN or 0. Return None for a "
                    "completion the function does not apply to and keep rewards finite, or set rewards.on_error: "
                    "skip to score such values as undefined (0 in the total), counted in `reward/nonfinite`.")


async def _await(awaitable):
    return await awaitable


def get_reward_fn(name_or_path: str) -> Callable[..., list]:
    """A built-in reward by name (``REWARDS``) or a user function by ``pkg.module:function``."""
    if name_or_path in REWARDS:
        return REWARDS[name_or_path]
    return load_reward_fn(name_or_path)


def reward_arguments(examples: Sequence, completions: Sequence[str]
                     ) -> tuple[list, list, list[str], dict[str, list]]:
    """``(prompts, completions, answers, columns)`` for reward functions, one entry per completion of the
    ``lmpo.tasks.Example`` at the same position.

    As TRL passes them: for an example whose prompt is a conversation (``Example.messages``), its prompt is
    the message list and its completion ``[{"role": "assistant", "content": text}]``; otherwise both are
    strings. ``columns`` are the examples' extra fields (see :func:`_meta_columns`).
    """
    prompts = [e.messages if e.messages is not None else e.prompt for e in examples]
    wrapped = [[{"role": "assistant", "content": c}] if e.messages is not None else c
               for e, c in zip(examples, completions)]
    return prompts, wrapped, [e.answer for e in examples], _meta_columns(examples)


def _meta_columns(examples: Sequence) -> dict[str, list]:
    """Per-sample meta columns (TRL style keyword lists) shared by every example."""
    if not examples:
        return {}
    keys = set(examples[0].meta)
    for e in examples[1:]:
        keys &= set(e.meta)
    return {k: [e.meta[k] for e in examples] for k in sorted(keys) if k not in ("prompts", "completions", "answer")}


@dataclass(frozen=True)
class RewardSpec:
    """One weighted reward function: ``name`` is a built-in name or ``pkg.module:function``;
    ``kwargs`` are passed to the function on every call (``pattern`` for ``format``...). ``fn``, when given,
    is the function itself (a ``RewardModel``, a closure) and ``name`` only labels it in metrics."""

    name: str
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    fn: Callable[..., list] | None = None

    @staticmethod
    def coerce(spec: Any) -> RewardSpec:
        if isinstance(spec, RewardSpec):
            return spec
        if isinstance(spec, str):
            return RewardSpec(spec)
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"name", "weight", "kwargs", "fn"}
            if "name" not in spec or unknown:
                raise ValueError(
                    f"reward spec {dict(spec)} needs a 'name' and may have 'weight', 'kwargs' and 'fn' only"
                    + (f" (unknown keys: {sorted(unknown)})" if unknown else "")
                )
            return RewardSpec(
                str(spec["name"]), float(spec.get("weight", 1.0)), dict(spec.get("kwargs") or {}), spec.get("fn")
            )
        if isinstance(spec, Sequence) and len(spec) in (2, 3):
            return RewardSpec(str(spec[0]), float(spec[1]), dict(spec[2]) if len(spec) == 3 else {})
        raise ValueError(f"cannot read reward spec {spec!r}; use (name, weight) or {{name, weight, kwargs}}")


def _truncate(text: Any, limit: int = 200) -> str:
    s = repr(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


class RewardScorer:
    """Weighted sum of reward functions.

    ``total[i] = Σ_f w_f · r_f[i]`` over the functions whose value for sample ``i`` is defined; a value is
    undefined (NaN in ``per_fn``) when the function returned ``None`` for it (not applicable, TRL's
    convention) or raised with ``on_error="skip"``. Undefined values contribute 0 to the total — the same
    ``nansum`` TRL uses — so a skipped function neither rewards nor penalises that sample.

    Values are checked (:func:`reward_values`): a returned NaN, ±inf or a number beyond ±``REWARD_LIMIT`` is not
    "does not apply" (that is None) but a broken reward, which would make its group's advantages NaN or 0
    silently; a value that is not a number (a string, a list) is treated as if the function raised. A function
    that calls ``sys.exit()`` raises :class:`RewardExit`.

    Args:
        specs: ``[("exact_match", 1.0), ...]``, ``[{"name": ..., "weight": ..., "kwargs": {...}}]`` or
            ``RewardSpec`` objects. A name may appear once; give ``pkg.module:function`` for user functions,
            or ``fn=`` a callable (e.g. ``lmpo.rewards.RewardModel``) under a name of your choice.
        on_error: ``"raise"`` — a function that raises, or returns a non-finite value, stops scoring with an error
            naming it and the sample; ``"skip"`` — the values of a call that raised become NaN and are counted in
            ``stats["reward/skipped"]``, and each non-finite value becomes NaN (undefined) and is counted in
            ``stats["reward/nonfinite"]``.
    """

    def __init__(self, specs: Sequence[Any], on_error: str = "raise") -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
        self.specs = [RewardSpec.coerce(s) for s in specs]
        if not self.specs:
            raise ValueError("RewardScorer needs at least one reward function")
        names = [s.name for s in self.specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"reward function(s) {duplicates} listed twice; merge their weights")
        for s in self.specs:
            if not math.isfinite(s.weight):
                raise ValueError(f"reward {s.name!r}: weight={s.weight} must be finite")
        self.on_error = on_error
        self.fns = {s.name: functools.partial(s.fn if s.fn is not None else get_reward_fn(s.name), **dict(s.kwargs))
                    for s in self.specs}
        self.weights = {s.name: s.weight for s in self.specs}
        self.skipped_calls = 0  # cumulative count of (function, call) pairs skipped because they raised
        self.last_stats: dict[str, float] = {}
        #: the last ``score`` call's first non-finite value skipped (``on_error="skip"``), for a warning line
        self.nonfinite_note: str | None = None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def _call_one(self, name: str, fn, prompts, completions, answers, columns) -> list:
        values = call_reward(fn, {"prompts": prompts, "completions": completions, "answer": answers, **columns})
        if len(values) != len(completions):
            raise ValueError(
                f"reward function {name!r} returned {len(values)} values for {len(completions)} completions"
            )
        return values

    def _locate_failure(self, name, fn, prompts, completions, answers, columns) -> tuple[int, BaseException]:
        """Re-run ``fn`` one sample at a time to find which sample makes it raise."""
        for i in range(len(completions)):
            one_cols = {
                k: [v[i]] if isinstance(v, list) and len(v) == len(completions) else v
                for k, v in columns.items()
            }
            try:
                call_reward(fn, {"prompts": [prompts[i]], "completions": [completions[i]], "answer": [answers[i]],
                                 **one_cols})
            except Exception as e:  # report whatever the user function raised
                return i, e
        return -1, RuntimeError("raised on the full batch but on no single sample")

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        answers: Sequence[str],
        **columns: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Score a batch of B completions.

        Args:
            prompts, completions, answers: length-B lists (prompt repeated for each of its completions).
            columns: extra per-sample lists (dataset columns) passed to every function as keyword arguments.
        Returns:
            total: (B,) float32 weighted sum (undefined values count 0, see class docstring);
            per_fn: name -> (B,) float32 raw (unweighted) values, NaN where undefined.
        """
        prompts, completions, answers = list(prompts), list(completions), list(answers)
        if not (len(prompts) == len(completions) == len(answers)):
            raise ValueError(
                f"prompts ({len(prompts)}), completions ({len(completions)}) and answers ({len(answers)}) "
                "must have the same length"
            )
        batch = len(completions)
        total = torch.zeros(batch, dtype=torch.float32)
        per_fn: dict[str, torch.Tensor] = {}
        skipped = nonfinite = 0
        self.nonfinite_note = None
        for name, fn in self.fns.items():
            try:
                values = self._call_one(name, fn, prompts, completions, answers, columns)
                tensor, bad = reward_values(name, values)
            except Exception as e:  # user code can raise anything
                if self.on_error == "skip":
                    skipped += 1
                    per_fn[name] = torch.full((batch,), math.nan)
                    continue
                if isinstance(e, RewardTypeError):
                    index, cause = e.index, e
                else:
                    index, cause = self._locate_failure(name, fn, prompts, completions, answers, columns)
                where = (
                    f"sample {index} (prompt {_truncate(prompts[index])}, completion "
                    f"{_truncate(completions[index])}, answer {_truncate(answers[index])})"
                    if index >= 0
                    else "the batch (no single sample reproduces it)"
                )
                raise RunError(
                    f"reward function {name!r} raised {type(cause).__name__}: {cause} on {where}. Fix the "
                    "function, or set on_error='skip' to record NaN for it and continue."
                ) from e
            if bad:
                if self.on_error == "raise":
                    raise nonfinite_error(name, values[bad[0]], bad[0], len(bad), batch, prompts, completions, answers)
                nonfinite += len(bad)
                self.nonfinite_note = f"{name!r} returned {values[bad[0]]!r} for completion {bad[0]}"
            per_fn[name] = tensor
            total += self.weights[name] * torch.nan_to_num(tensor, nan=0.0)
        self.skipped_calls += skipped
        self.last_stats = {"reward/skipped": float(skipped), "reward/nonfinite": float(nonfinite)}
        return total, per_fn

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name}×{s.weight:g}" for s in self.specs)
        return f"RewardScorer({parts}, on_error={self.on_error!r})"
