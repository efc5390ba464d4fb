"""Entropy control: a bonus on the policy's token entropy, fixed or steered by a controller.

- ``static``: ``loss −= entropy_coef · aggregate(H_t)`` (H_t the entropy of the full next-token distribution,
  aggregated like the policy loss).
- ``adaptive`` (Skywork-OR1, arXiv 2505.22312): the coefficient comes from :class:`AdaptiveEntropyController`,
  ``c ← clip(c ± Δ, lo, hi)`` after each optimizer step; the coefficient applied is ``c·1[e ≤ target]``. The
  controller is a small stateful object outside the pure objective (its state goes into checkpoints); the
  objective driver owns it and passes its coefficient as ``entropy_coef``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..validation import check_range
from .base import Context, Part, Registry, param

ENTROPY_CONTROLS = Registry("entropy_control", "Entropy control")
"""Registry of entropy controls: name → part class (``adaptive_entropy=True`` selects ``adaptive``)."""


@dataclass
class AdaptiveEntropyController:
    """Skywork-OR1 adaptive entropy coefficient (a small stateful object; checkpoint its ``state_dict``).

    Rule, once per optimizer step with the measured mean token entropy e (Skywork-OR1, eq. 4):
    ``c ← clip(c + Δ, lo, hi)`` if e < target, ``c ← clip(c − Δ, lo, hi)`` if e > target (unchanged at
    equality); the coefficient to apply is ``c·1[e ≤ target]``.

    ``coef`` uses the latest measured entropy for the gate and the already-updated c (the value for the
    next step, as a trainer that measures entropy during the update sees it); ``coef_for(e)`` gives
    ``c·1[e ≤ target]`` for a caller that measures the current step's entropy before the loss. Before the
    first measurement the gate is open (``coef = c_0``).
    """

    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    coef_init: float = 0.0
    c: float = field(init=False)
    last_entropy: float | None = field(init=False, default=None)
    steps: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        check_range("entropy_target", self.target, low=0.0, low_inclusive=True, high=None)
        check_range("entropy_delta", self.delta, low=0.0, low_inclusive=True, high=None)
        check_range("entropy_coef_min", self.coef_min, low=None, high=None)
        check_range("entropy_coef_max", self.coef_max, low=self.coef_min, low_inclusive=True, high=None)
        check_range(
            "entropy_coef_init", self.coef_init, low=self.coef_min, high=self.coef_max, low_inclusive=True,
            hint="Start the controller inside [entropy_coef_min, entropy_coef_max].",
        )
        self.c = float(self.coef_init)

    def coef_for(self, entropy: float) -> float:
        return self.c if entropy <= self.target else 0.0

    @property
    def coef(self) -> float:
        return self.c if self.last_entropy is None else self.coef_for(self.last_entropy)

    def update(self, mean_entropy: float) -> float:
        """Record the step's mean entropy, move c by ±Δ, return the coefficient for the next step."""
        e = float(mean_entropy)
        if not math.isfinite(e):
            raise ValueError(f"mean_entropy={mean_entropy!r} must be finite; skip the update on a bad step.")
        if e < self.target:
            self.c = min(self.coef_max, max(self.coef_min, self.c + self.delta))
        elif e > self.target:
            self.c = min(self.coef_max, max(self.coef_min, self.c - self.delta))
        self.last_entropy = e
        self.steps += 1
        return self.coef

    def state_dict(self) -> dict[str, float | int | None]:
        return {"c": self.c, "last_entropy": self.last_entropy, "steps": self.steps}

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        self.c = float(state["c"])
        self.last_entropy = None if state.get("last_entropy") is None else float(state["last_entropy"])
        self.steps = int(state.get("steps", 0))


@dataclass(frozen=True)
class EntropyControl(Part):
    """Base of the entropy controls: ``coef(objective_coef, given)`` → the coefficient of ``−coef·aggregate(H)``
    (``given`` is the ``entropy_coef`` passed to the call), or None for no entropy term."""

    def coef(self, static_coef: float, given: float | torch.Tensor | None) -> float | torch.Tensor | None:
        raise NotImplementedError

    def make_controller(self) -> AdaptiveEntropyController | None:
        return None

    def loss(self, entropy: torch.Tensor, static_coef: float, given: float | torch.Tensor | None,
             reduce: Callable[[torch.Tensor], torch.Tensor], ctx: Context, stats: dict[str, torch.Tensor]
             ) -> torch.Tensor | None:
        """The entropy term ``−coef·reduce(H)`` (0-dim) or None when there is none (``coef`` is None).

        entropy: (B, T) H_t, 0 at invalid positions (with its gradient); ``reduce`` aggregates a (B, T) term as
        the rest of the loss is. Reports ``loss/entropy`` and the coefficient applied, ``entropy/coef``.
        """
        coef = self.coef(static_coef, given)
        if coef is None:
            return None
        entropy_loss = -coef * reduce(entropy)
        stats["loss/entropy"] = entropy_loss.detach()
        stats["entropy/coef"] = torch.as_tensor(coef, dtype=ctx.dtype, device=ctx.logp.device).detach().clone()
        return entropy_loss


_ENTROPY_STATS = {"loss/entropy": "the entropy term of the objective (when it has one)",
                  "entropy/coef": "entropy coefficient applied (adaptive controller's output when it is on)"}


@ENTROPY_CONTROLS.register
@dataclass(frozen=True)
class StaticEntropy(EntropyControl):
    """A fixed bonus ``loss −= entropy_coef · aggregate(H_t)`` (no term when ``entropy_coef`` is 0; entropies
    passed in are still reported as ``entropy/mean``)."""

    name = "static"
    stats = _ENTROPY_STATS
    formula = "− c·H̄"
    source = "entropy regularisation (Williams & Peng 1991)"

    def coef(self, static_coef, given):
        if static_coef == 0.0:
            return None
        return static_coef if given is None else given


@ENTROPY_CONTROLS.register
@dataclass(frozen=True)
class AdaptiveEntropy(EntropyControl):
    """Skywork-OR1's adaptive bonus: the driver's :class:`AdaptiveEntropyController` sets the coefficient
    ``c_k·1[e_k ≤ target]`` once per optimizer step and passes it as ``entropy_coef``."""

    name = "adaptive"
    needs = frozenset({"entropy", "entropy_coef"})
    stats = _ENTROPY_STATS
    formula = "− c_k·1[e_k ≤ target]·H̄,  c_{k+1} = clip(c_k ± Δ, lo, hi)"
    source = "He et al. 2025, Skywork-OR1 (arXiv 2505.22312)"
    entropy_target: float = param(0.2, "target mean token entropy", low=0.0, low_inclusive=True)
    entropy_delta: float = param(0.005, "controller step Δ per optimizer step", low=0.0, low_inclusive=True)
    entropy_coef_min: float = param(0.0, "lower bound of the coefficient")
    entropy_coef_max: float = param(1.0, "upper bound of the coefficient")
    entropy_coef_init: float = param(0.0, "coefficient before the first update")

    def check(self) -> None:
        self.make_controller()  # the controller checks its bounds (min ≤ init ≤ max)

    def coef(self, static_coef, given):
        return given

    def make_controller(self) -> AdaptiveEntropyController:
        return AdaptiveEntropyController(target=self.entropy_target, delta=self.entropy_delta,
                                         coef_min=self.entropy_coef_min, coef_max=self.entropy_coef_max,
                                         coef_init=self.entropy_coef_init)
