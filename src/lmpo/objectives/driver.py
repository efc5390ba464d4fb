"""The one driver between an objective and the loop that trains with it.

lmpo's trainer, the TRL adapter and the verl adapter all call an objective through :class:`ObjectiveDriver`:

1. **What the host computes** (``driver.needs``, a :class:`Needs`): the host's plan derived from
   ``objective.needs`` (the one source of what an objective asks for) and the host — token entropies (also when
   the host reports them anyway, and whether they need a gradient), reference log-probs, per-token gradient norms
   in the credit part's mode, the sampler's log-probs, the teacher's top-K — and whether it needs a hook once per
   optimizer step (the adaptive entropy controller).
2. **Refusals, once, in one style**: a :class:`Host` says what it can provide; a need it cannot meet, and any
   host setting the adapter finds incompatible (``refuse``), raise one :class:`~lmpo.errors.InputError` that
   lists every problem with what to do instead.
3. **The call and its state**: ``driver.loss(...)`` calls the objective (passing the controller's
   coefficient), records its statistics; ``driver.end_step()`` once per optimizer step merges them (one host
   sync, optionally one cross-process gather), updates the controller, and returns plain floats.
4. **One naming scheme**: the statistics are the objective's own keys (``component/name``, documented in
   docs/objectives.md), logged unchanged by every host. How micro-batches merge follows the key:
   ``…/min`` takes the minimum, ``…/max`` the maximum, counts (``…_tokens``, ``tokens/…``) add up, everything
   else is a mean weighted by the micro-batch's share of the optimizer step's sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lmpo.errors import InputError, UnsupportedError

from .objective import Objective
from .parts import AdaptiveEntropyController


@dataclass(frozen=True)
class Needs:
    """What the host computes for one objective: ``objective.needs`` read for a host (:func:`needs_of`), with what
    the bare names leave open (the gradient-norm mode, the teacher's K, entropies the host reports anyway)."""

    entropy: bool = False
    """Token entropies are needed (for the loss, or reported because the host provides them anyway)."""
    entropy_grad: bool = False
    """… and they enter the loss, so they must keep their gradient."""
    ref_logp: bool = False
    token_grad_norm: str | None = None
    """The mode of per-token gradient norms the objective reads (``lmpo.objectives.grad_norms``), or None."""
    rollout_logp: bool = False
    """The sampler's log-probs of the sampled tokens (rollout/trainer mismatch corrections)."""
    rollout_is_weights: bool = False
    """Rollout-correction weights the host computed itself (``correction="given"``)."""
    step_hook: bool = False
    """The driver must see ``end_step()`` once per optimizer step (adaptive entropy controller)."""
    teacher: bool = False
    """On-policy distillation: the policy's (B, T, V) ``logits`` (with gradient) and the teacher's ``teacher_logits``."""
    teacher_top_k: int = 0
    """… the teacher's top-K log-probs and their ``teacher_ids`` instead of its full logits (0: full logits)."""


@dataclass(frozen=True)
class Host:
    """What a training loop can give an objective.

    Args:
        name: how errors name the host, e.g. "TRL's GRPOTrainer".
        provides: the inputs it can compute: ``entropy``, ``ref_logp``, ``rollout_logp``, ``rollout_is_weights``,
            ``token_grad_norm:<mode>`` for each gradient-norm mode, ``step_hook`` (it calls ``end_step`` once
            per optimizer step).
        reports_entropy: it computes token entropies anyway, so they are passed (and reported) for every
            objective.
        advice: need → what to do instead on this host, used in refusals.
    """

    name: str
    provides: frozenset[str]
    reports_entropy: bool = False
    advice: Mapping[str, str] = field(default_factory=dict)


TRAINER_HOST = Host(
    "lmpo's trainer",
    frozenset({"entropy", "ref_logp", "rollout_logp", "step_hook", "token_grad_norm:exact", "token_grad_norm:lm_head",
               "token_grad_norm:logits", "logits", "teacher_logits"}),
    reports_entropy=True,
    advice={"rollout_is_weights": "correction='given' is for hosts that compute their own weights (verl); use "
                                  "correction='none' here."},
)
"""lmpo's own trainer: everything except host-made rollout weights. Sampler log-probs are recorded by its
generation engine (``HFRollout(record_logprobs=True)``, vLLM) when the objective needs them."""


def needs_of(objective: Objective, host: Host) -> Needs:
    """The host's plan for ``objective``: which inputs (``objective.needs``), how (the credit part's gradient-norm
    mode, the distill part's top-K, whether the entropies keep their gradient), and the entropies a host that
    reports them passes anyway."""
    wanted = objective.needs
    credit = objective.parts["credit"]
    mode = credit.value("grad_norm_mode") if "token_grad_norm" in wanted else None
    return Needs(
        entropy="entropy" in wanted or (host.reports_entropy and "entropy" in host.provides),
        entropy_grad=objective.entropy_in_loss,
        ref_logp="ref_logp" in wanted,
        token_grad_norm=mode,
        rollout_logp="rollout_logp" in wanted,
        rollout_is_weights="rollout_is_weights" in wanted,
        step_hook="entropy_coef" in wanted,
        teacher="teacher_logits" in wanted,
        teacher_top_k=objective.parts["distill"].value("distill_top_k") if "teacher_logits" in wanted else 0,
    )


def refuse(host_name: str, problems: Iterable[str], what: str = "") -> None:
    """Raise one :class:`~lmpo.errors.UnsupportedError` listing every problem (no-op when there is none): the one
    refusal style of every host."""
    problems = list(problems)
    if problems:
        subject = f" {what}" if what else ""
        raise UnsupportedError(f"{host_name} cannot run{subject}:\n- " + "\n- ".join(problems))


def check_host(objective: Objective, host: Host) -> None:
    """Refuse an objective whose needs the host cannot meet (every unmet need in one message)."""
    refuse(host.name, host_problems(objective, host), f"objective {objective.name!r}")


def host_problems(objective: Objective, host: Host) -> list[str]:
    """One line per need of ``objective`` that ``host`` cannot meet, with what to do instead."""
    needs = needs_of(objective, host)
    required = {
        "entropy": needs.entropy_grad or "entropy" in objective.needs,
        "ref_logp": needs.ref_logp,
        "rollout_logp": needs.rollout_logp,
        "rollout_is_weights": needs.rollout_is_weights,
        "step_hook": needs.step_hook,
        f"token_grad_norm:{needs.token_grad_norm}": needs.token_grad_norm is not None,
        "logits": "logits" in objective.needs,
        "teacher_logits": needs.teacher,
    }
    why = {
        "entropy": "token entropies inside the loss" if needs.entropy_grad else "token entropies (as a mask)",
        "ref_logp": f"reference log-probs (kl_coef={objective.kl_coef})",
        "rollout_logp": f"the sampler's log-probs (correction={objective.correction!r}, "
                        f"rejection={objective.rejection!r})",
        "rollout_is_weights": "rollout-correction weights computed by the host (correction='given')",
        "step_hook": "an adaptive entropy controller updated once per optimizer step",
        f"token_grad_norm:{needs.token_grad_norm}": f"per-token gradient norms in mode {needs.token_grad_norm!r}",
        "logits": f"the policy's full next-token logits (distill={objective.distill!r})",
        "teacher_logits": f"a teacher model's logits (distill={objective.distill!r})",
    }
    problems = []
    for key, needed in required.items():
        if needed and key not in host.provides:
            advice = host.advice.get(key) or host.advice.get(key.split(":")[0]) or ""
            problems.append(f"objective {objective.name!r} needs {why[key]}, which {host.name} does not provide"
                            + (f"; {advice}" if advice else "."))
    return problems


def _reduction(key: str) -> str:
    if key.endswith("/min"):
        return "min"
    if key.endswith("/max"):
        return "max"
    if key.endswith("_tokens") or key.startswith("tokens/"):
        return "sum"
    return "mean"


def merge_stats(rows: list[Mapping[str, float]], weights: list[float] | None = None) -> dict[str, float]:
    """Merge per-step statistics (e.g. the optimizer steps of one RL step) by the naming scheme's rules;
    means are weighted by ``weights`` (equal by default), a key missing from a row is skipped there."""
    weights = weights or [1.0] * len(rows)
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    out: dict[str, float] = {}
    for key in keys:
        pairs = [(row[key], w) for row, w in zip(rows, weights) if key in row]
        rule = _reduction(key)
        if rule == "min":
            out[key] = min(v for v, _ in pairs)
        elif rule == "max":
            out[key] = max(v for v, _ in pairs)
        else:  # counts per optimizer step are averaged over steps like the means
            total = sum(w for _, w in pairs)
            out[key] = sum(v * w for v, w in pairs) / total if total else float("nan")
    return out


class ObjectiveDriver:
    """Calls an objective for a host and keeps what lives between calls (see the module docstring).

    >>> driver = ObjectiveDriver(Objective.preset("adaptive_entropy"))
    >>> for microbatch in minibatch:
    ...     driver.loss(logp, old_logp, adv, mask, entropy=ent, num_tokens=N, num_seqs=S, weight=b / S).backward()
    >>> optimizer.step(); metrics = driver.end_step()    # floats; the controller has moved
    """

    def __init__(self, objective: Objective, host: Host = TRAINER_HOST) -> None:
        if not isinstance(objective, Objective):
            raise InputError(f"objective must be an lmpo Objective, got {type(objective).__name__}; e.g. "
                             f"Objective.preset('grpo').")
        check_host(objective, host)
        self.objective = objective
        self.host = host
        self.needs = needs_of(objective, host)
        self.controller: AdaptiveEntropyController | None = objective.make_entropy_controller()
        self._window: list[tuple[dict[str, torch.Tensor], float]] = []
        self._pending_entropy: float | None = None

    # ------------------------------------------------------------------ the call
    def loss(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
             weight: float = 1.0, **inputs: Any) -> torch.Tensor:
        """The objective's loss for one micro-batch; its statistics join the current optimizer step's window.

        ``weight``: the micro-batch's share of the optimizer step (its sequences / the step's), for the means.
        ``inputs``: the optional inputs and normalisers of ``Objective.__call__``; inputs the objective does not
        need may be passed (they are only reported). ``entropy_coef`` comes from the driver's controller.
        """
        if self.controller is not None:
            inputs["entropy_coef"] = self.controller.coef
        loss, stats = self.objective(logp, old_logp, advantages, mask, **inputs)
        self._window.append((stats, float(weight)))
        return loss

    def add_stats(self, stats: Mapping[str, torch.Tensor]) -> None:
        """Host statistics of the last micro-batch (e.g. a MoE router loss), merged with the objective's."""
        self._window[-1][0].update(stats)

    @property
    def pending(self) -> list[dict[str, torch.Tensor]]:
        """The current window's per-micro-batch statistics, still on device (not yet merged)."""
        return [stats for stats, _ in self._window]

    def end_step(self, gather: Callable[[torch.Tensor], torch.Tensor] | None = None, *,
                 extra: Mapping[str, torch.Tensor] | None = None, update_controller: bool = True) -> dict[str, float]:
        """Merge the window's statistics (one host sync), update the controller, start a new window.

        ``gather``: for data parallelism, a function stacking a (K,) tensor from every process into (P·K,)
        (``accelerator.gather``); the merged values then cover all processes. ``extra``: the host's own 0-dim
        tensors to bring to the host in the same sync (e.g. the step's loss and gradient norm).
        ``update_controller=False`` leaves the controller alone (evaluation windows; a host that may still skip
        the step calls ``commit_step`` once it has taken it). Returns ``{key: float}``, plus ``entropy/coef``
        after a controller update.
        """
        window, self._window = self._window, []
        self._pending_entropy = None
        if extra:
            window.append(({k: v for k, v in extra.items()}, 0.0))
        if not window:
            return {}
        keys: dict[str, None] = {}
        for stats, _ in window:
            keys.update(dict.fromkeys(stats))
        names = list(keys)
        rows = []
        for key in names:
            rule = _reduction(key)
            values = [(s[key].detach().float().reshape(()), w) for s, w in window if key in s]
            if rule == "min":
                rows.append(torch.stack([v for v, _ in values]).amin())
            elif rule == "max":
                rows.append(torch.stack([v for v, _ in values]).amax())
            elif rule == "sum":
                rows.append(torch.stack([v for v, _ in values]).sum())
            else:
                total = sum(w for _, w in values)
                rows.append(sum(v * w for v, w in values) / total if total else values[0][0])
        ent = torch.zeros(2, device=rows[0].device)  # Σ entropy·tokens, Σ tokens: the controller's input
        if "entropy/mean" in keys and "tokens/valid" in keys:
            ent = torch.stack([sum(s["entropy/mean"].detach().float() * s["tokens/valid"].detach().float()
                                   for s, _ in window if "entropy/mean" in s),
                               sum(s["tokens/valid"].detach().float() for s, _ in window if "entropy/mean" in s)])
        local = torch.cat([torch.stack(rows), ent])
        if gather is None:
            values = local.tolist()  # the one host sync of the step
            merged = dict(zip(names, values[: len(names)]))
            entropy_sum, tokens = values[-2], values[-1]
        else:
            table = gather(local).reshape(-1, local.numel()).cpu().tolist()
            merged = {}
            for i, key in enumerate(names):
                column = [row[i] for row in table]
                rule = _reduction(key)
                merged[key] = (min(column) if rule == "min" else max(column) if rule == "max"
                               else sum(column) if rule == "sum" else sum(column) / len(column))
            entropy_sum, tokens = sum(row[-2] for row in table), sum(row[-1] for row in table)
        self._pending_entropy = entropy_sum / tokens if tokens > 0 else None
        if update_controller:
            self.commit_step(merged)
        return merged

    def commit_step(self, merged: dict[str, float] | None = None) -> None:
        """The optimizer step was taken: move the controller with the step's token-weighted mean entropy
        (and record its new coefficient as ``entropy/coef`` in ``merged``)."""
        if self.controller is None or self._pending_entropy is None:
            return
        self.controller.update(self._pending_entropy)
        self._pending_entropy = None
        if merged is not None:
            merged["entropy/coef"] = float(self.controller.coef)

    def discard_step(self) -> None:
        """Drop the current window (a skipped optimizer step: its statistics are not logged)."""
        self._window = []
        self._pending_entropy = None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict() if self.controller is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.controller is not None and state.get("controller") is not None:
            self.controller.load_state_dict(state["controller"])


__all__ = ["TRAINER_HOST", "Host", "Needs", "ObjectiveDriver", "check_host", "host_problems", "merge_stats", "needs_of",
           "refuse"]
