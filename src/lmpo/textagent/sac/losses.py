"""Pure loss functions of discrete maximum-entropy SAC with top-p expected backups (docs/sac.md).

Every function takes tensors and plain scalars and returns tensors (a loss and/or detached statistics);
none reads a config object, calls ``.item()``, moves data between devices or mutates its inputs.
Randomness (the sampled CQL estimate) only comes through a passed ``torch.Generator``.

Dimension names: ``B`` states in the batch, ``A`` actions (alphabet size |Σ|), ``K`` candidate actions
per state (top-p set, padded to the largest set in the batch), ``S`` sampled actions per state.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

#: logit given to illegal actions before the softmax (docs/sac.md)
ILLEGAL_LOGIT = -1e9
#: probabilities are clamped from below so that log π is finite (docs/sac.md "ε-clip")
PROB_EPS = 1e-8


def masked_policy(logits: torch.Tensor, legal_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable masked softmax: shift by the max, illegal → −1e9, softmax, clamp at 1e-8.

    logits (B, A), legal_mask (B, A) bool → probs (B, A), log_probs (B, A).

    ``probs`` of illegal actions are exactly 0 (they are zeroed after the clamp so that expectations over
    the legal set never pick up the ε floor); ``log_probs`` are ``log(max(π, 1e-8))`` everywhere.
    The shift by the row max over *legal* logits keeps exp() in range whatever the logit scale.
    """
    if logits.shape != legal_mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and legal_mask {tuple(legal_mask.shape)} must match")
    legal = legal_mask.bool()
    shifted = logits - logits.masked_fill(~legal, float("-inf")).amax(-1, keepdim=True).detach()
    shifted = shifted.masked_fill(~legal, ILLEGAL_LOGIT)
    probs = torch.softmax(shifted, dim=-1).clamp_min(PROB_EPS)
    log_probs = probs.log()
    probs = probs * legal
    return probs, log_probs


def entropy(probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """H(π) = −Σ_a π(a) log π(a) per state.  probs, log_probs (B, A) → (B,)."""
    return -(probs * log_probs).sum(-1)


class TopPSet(NamedTuple):
    """Candidate set of the top-p expected backup; every field is detached except ``probs``.

    ``indices`` (B, K) action ids sorted by decreasing π (padding columns repeat a member id);
    ``member`` (B, K) bool, True for actions in P(s); ``probs`` (B, K) π_p = π / Σ_P π on P, 0 elsewhere
    (carries gradient through π when the input did); ``log_probs`` (B, K) log π_p (0 outside P);
    ``coverage`` (B,) Σ_P π (before renormalisation); ``size`` (B,) |P(s)|; ``capped`` (B,) bool, True
    where K_max stopped the set before its mass reached p.
    """

    indices: torch.Tensor
    member: torch.Tensor
    probs: torch.Tensor
    log_probs: torch.Tensor
    coverage: torch.Tensor
    size: torch.Tensor
    capped: torch.Tensor


def top_p_set(probs: torch.Tensor, p: float, k_max: int) -> TopPSet:
    """Smallest set P with Σ_P π ≥ p (at most ``k_max`` actions), π renormalised on it.

    probs (B, A) with illegal actions at exactly 0 (as returned by :func:`masked_policy`).

    Naive equivalent: sort π descending, keep the shortest prefix whose cumulative mass reaches p.
    Here ``torch.topk`` with ``k = min(k_max, A)`` replaces the full sort (O(A log K) instead of
    O(A log A)), an action is kept iff the mass strictly before it is < p (so the prefix stops at the
    first action that brings the mass to ≥ p), and columns are trimmed to the largest set in the batch.
    The selection is detached (docs/sac.md); only the renormalised weights carry gradient.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}; use 1.0 for the full legal set")
    if k_max < 1:
        raise ValueError(f"top_p_k_max must be ≥ 1, got {k_max}")
    k = min(int(k_max), probs.shape[-1])
    top_probs, top_idx = torch.topk(probs.detach(), k, dim=-1, sorted=True)  # (B, k)
    mass_before = top_probs.cumsum(-1) - top_probs  # exclusive cumsum, (B, k)
    # p = 1 means the whole legal set (up to K_max): no mass test, so that neither float error in the cumsum
    # nor the 1e-8 probability floor of masked_policy can drop tail actions
    threshold = math.inf if p >= 1.0 else p
    member = (mass_before < threshold) & (top_probs > 0)
    member[:, 0] = True  # the argmax is always in P, even if all mass sits there
    size = member.sum(-1)
    k_eff = int(size.max()) if size.numel() else 1  # host sync on a small int; keeps later tensors small
    indices, member = top_idx[:, :k_eff], member[:, :k_eff]
    cand = probs.gather(-1, indices) * member  # carries gradient
    coverage = cand.sum(-1)
    probs_p = cand / coverage.clamp_min(PROB_EPS).unsqueeze(-1)
    log_probs_p = torch.where(member, probs_p.clamp_min(PROB_EPS).log(), torch.zeros_like(probs_p))
    capped = (coverage.detach() < min(threshold, 1.0 - 1e-6)) & (size >= k)
    return TopPSet(indices, member, probs_p, log_probs_p, coverage.detach(), size, capped)


def full_set(probs: torch.Tensor, log_probs: torch.Tensor, legal_mask: torch.Tensor) -> TopPSet:
    """The whole legal set as a :class:`TopPSet` (K = A): the exact expectation, for ablations and tests."""
    B, A = probs.shape
    indices = torch.arange(A, device=probs.device).expand(B, A)
    member = legal_mask.bool()
    return TopPSet(
        indices, member, probs, torch.where(member, log_probs, torch.zeros_like(log_probs)),
        probs.detach().sum(-1), member.sum(-1), torch.zeros(B, dtype=torch.bool, device=probs.device),
    )


def soft_value(cand: TopPSet, q_min: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """Expected soft value over the candidate set: V(s) = Σ_P π_p (min_i Q_i(s, a) − α log π_p).

    cand: :class:`TopPSet` with K columns; q_min (B, K) min of the twin (target) critics on
    ``cand.indices``; alpha scalar → (B,).  With p = 1 and K = A this is the exact
    ``Σ_{a∈A(s)} π (min Q − α log π)`` (docs/sac.md).
    """
    terms = cand.probs * (q_min - alpha * cand.log_probs)
    return (terms * cand.member).sum(-1)


def soft_td_target(
    reward: torch.Tensor, terminated: torch.Tensor, next_value: torch.Tensor, gamma: float
) -> torch.Tensor:
    """y = r + γ (1 − terminated) V(s').  All (B,) → (B,).

    Only *termination* stops the bootstrap. A time-limit truncation is not a terminal state of the MDP,
    so a truncated transition bootstraps from V(s') like any other (pass ``terminated=False`` for it).
    """
    return reward + gamma * (1.0 - terminated.to(reward.dtype)) * next_value


def critic_loss(
    q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor, huber_delta: float = 1.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Huber loss on both critics: L_Q = mean_B [Huber(Q_1 − y) + Huber(Q_2 − y)].

    q1, q2 (B,) online critics at the data action; target (B,) detached y → scalar loss, stats.
    """
    y = target.detach()
    loss = F.huber_loss(q1, y, delta=huber_delta) + F.huber_loss(q2, y, delta=huber_delta)
    td = (q1.detach() - y)
    abs_td = td.abs()
    stats = {
        "value/td_error_mean": td.mean(),
        "value/td_error_abs_mean": abs_td.mean(),
        "value/td_error_abs_p50": abs_td.quantile(0.5) if abs_td.numel() else abs_td.sum(),
        "value/td_error_abs_p90": abs_td.quantile(0.9) if abs_td.numel() else abs_td.sum(),
        "value/td_error_abs_max": abs_td.max() if abs_td.numel() else abs_td.sum(),
        "value/q1_mean": q1.detach().mean(),
        "value/q1_var": q1.detach().var(unbiased=False),
        "value/target_mean": y.mean(),
        "value/target_var": y.var(unbiased=False),
    }
    return loss, stats


def policy_loss(
    cand: TopPSet, q_min: torch.Tensor, alpha: torch.Tensor | float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Expected-form policy loss L_π = mean_B Σ_P π_p (α log π_p − min_i Q_i(s, a)).

    cand with K columns (the full legal set from :func:`full_set`, or the top-p set); q_min (B, K),
    detached inside.  The gradient flows only through π (and log π).
    """
    q = q_min.detach()
    per_state = (cand.member * cand.probs * (alpha * cand.log_probs - q)).sum(-1)
    return per_state.mean(), {"policy/expected_q": (cand.member * cand.probs.detach() * q).sum(-1).mean()}


def bc_loss(log_probs: torch.Tensor, actions: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning: mean over weighted rows of −log π(a*|o).

    log_probs (B, A), actions (B,) teacher ids, weight (B,) 1 for demo rows (0 elsewhere) → scalar.
    Returns 0 (with gradient graph) when no row has weight.
    """
    nll = -log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    w = weight.to(nll.dtype)
    return (nll * w).sum() / w.sum().clamp_min(1.0)


def anchor_kl(ref_probs: torch.Tensor, ref_log_probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """KL(π_ref ‖ π) per state, averaged over the batch: ``mean_B Σ_a π_ref(a) (log π_ref(a) − log π(a))``.

    ref_probs, ref_log_probs (B, A) of the frozen reference policy (no gradient), log_probs (B, A) of π →
    scalar. Actions the reference gives probability 0 (illegal ones) contribute 0. The forward direction
    (reference first) is mass-covering: π is pulled to keep every character the reference finds likely,
    which is what keeps the RL stage from forgetting what imitation learned.
    """
    terms = torch.where(ref_probs > 0, ref_probs * (ref_log_probs - log_probs), torch.zeros_like(log_probs))
    return terms.sum(-1).mean()


def target_entropy(legal_mask: torch.Tensor, kappa: float) -> torch.Tensor:
    """H_tgt(s) = κ · log |A(s)| in nats.  legal_mask (B, A) → (B,)."""
    return kappa * legal_mask.sum(-1).clamp_min(1).to(torch.float32).log()


def temperature_step(
    log_alpha: torch.Tensor,
    entropy_: torch.Tensor,
    target_entropy_: torch.Tensor,
    lr: float,
    alpha_min: float = 1e-4,
    alpha_max: float = 2.0,
) -> torch.Tensor:
    """log α ← clamp(log α + η · mean_B (H_tgt − H), log α_min, log α_max)  (docs/sac.md, corrected sign).

    log_alpha scalar; entropy_, target_entropy_ (B,) → new scalar (a new tensor, the input is untouched).
    Entropy below target ⇒ the bracket is positive ⇒ α rises, which raises the entropy bonus.
    """
    gap = (target_entropy_.detach() - entropy_.detach()).mean()
    return (log_alpha.detach() + lr * gap).clamp(math.log(alpha_min), math.log(alpha_max))


def cql_exact(q_all: torch.Tensor, legal_mask: torch.Tensor, q_data: torch.Tensor) -> torch.Tensor:
    """CQL(H) term per state: logsumexp_{a∈A(s)} Q(s, a) − Q(s, a_data).

    q_all (B, A) critic on every action, legal_mask (B, A), q_data (B,) → (B,).
    """
    lse = torch.logsumexp(q_all.masked_fill(~legal_mask.bool(), float("-inf")), dim=-1)
    return lse - q_data


def sample_legal_actions(
    legal_mask: torch.Tensor, num_samples: int, generator: torch.Generator | None = None,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """``num_samples`` actions per state drawn uniformly (with replacement) from A(s) \\ {exclude}.

    legal_mask (B, A), exclude (B,) action ids or None → (B, S).  A state whose only legal action is the
    excluded one draws that action (its samples then carry zero weight in :func:`cql_sampled`).
    """
    weights = legal_mask.to(torch.float32)
    if exclude is not None:
        weights = weights.scatter(-1, exclude.long().unsqueeze(-1), 0.0)
        empty = weights.sum(-1, keepdim=True) == 0
        weights = torch.where(empty, legal_mask.to(torch.float32), weights)
    return torch.multinomial(weights, num_samples, replacement=True, generator=generator)


def cql_sampled(
    q_samples: torch.Tensor, legal_count: torch.Tensor, q_data: torch.Tensor
) -> torch.Tensor:
    """Sampled CQL term with the data action kept exact.  (B, S), (B,), (B,) → (B,).

    q_samples: the critic at S actions drawn uniformly with replacement from A(s) \\ {a_data}
    (:func:`sample_legal_actions` with ``exclude=a_data``); legal_count: |A(s)|; q_data: Q(s, a_data).

    ``Σ_{a∈A} e^{Q(a)} = e^{Q(a_data)} + Σ_{a≠a_data} e^{Q(a)}`` and the second sum is estimated without bias
    by ``((|A|−1)/S) Σ_j e^{Q(a_j)}``, so

        CQL ≈ log( e^{Q(a_data)} + ((|A|−1)/S) Σ_j e^{Q(a_j)} ) − Q(a_data)   ≥ 0.

    The correction ``log((|A|−1)/S)`` scales the samples to the size of the set they stand for.  Keeping the
    data action out of the sample and exact is what bounds the term below by 0, like the exact term: a
    uniform-sample estimate without it (``logsumexp_j Q(a_j) + log(|A|/S) − Q(a_data)``) is unbounded below,
    so minimising it keeps pushing Q(a_data) up and the sampled actions down, and the critic diverges.  The
    log makes the estimate biased low by Jensen's inequality (O(1/S)); it is exact when Q is constant on
    A(s) \\ {a_data} or when a_data is the only legal action.
    """
    S = q_samples.shape[-1]
    others = (legal_count.to(q_samples.dtype) - 1.0).clamp_min(0.0)
    # log(0) = −inf drops the sampled part when a_data is the only legal action
    correction = others.log() - math.log(S)
    sampled = torch.logsumexp(q_samples, dim=-1) + correction
    return torch.logaddexp(q_data, sampled) - q_data


def polyak_update(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """θ̄ ← τ θ + (1 − τ) θ̄ in place (the one non-pure helper here: it exists to update the target)."""
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.lerp_(o, tau)
        for t, o in zip(target.buffers(), online.buffers(), strict=True):
            t.copy_(o)


class TopPController:
    """Keeps top-p coverage ≥ a target by raising K_max (when the cap binds) or p (docs/sac.md).

    State: ``p``, ``k_max``.  After each update, given the batch's mean coverage and the fraction of states
    whose set was stopped by K_max: if coverage < ``coverage_target`` then K_max ← min(⌈K_max·growth⌉,
    k_limit) when the cap bound anywhere, else p ← min(p + p_step, p_limit).  Saved in checkpoints.
    """

    def __init__(
        self, p: float, k_max: int, *, coverage_target: float = 0.95, k_limit: int = 1024,
        growth: float = 1.25, p_step: float = 0.005, p_limit: float = 0.999, enabled: bool = True,
    ) -> None:
        self.p, self.k_max = float(p), int(k_max)
        self.coverage_target, self.k_limit, self.growth = coverage_target, int(k_limit), growth
        self.p_step, self.p_limit, self.enabled = p_step, p_limit, enabled
        self.raises_k = 0
        self.raises_p = 0

    def observe(self, coverage_mean: float, capped_fraction: float) -> None:
        if not self.enabled or coverage_mean >= self.coverage_target:
            return
        if capped_fraction > 0 and self.k_max < self.k_limit:
            self.k_max = min(self.k_limit, max(self.k_max + 1, math.ceil(self.k_max * self.growth)))
            self.raises_k += 1
        elif self.p < self.p_limit:
            self.p = min(self.p_limit, self.p + self.p_step)
            self.raises_p += 1

    def state_dict(self) -> dict[str, float | int]:
        return {"p": self.p, "k_max": self.k_max, "raises_k": self.raises_k, "raises_p": self.raises_p}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.p, self.k_max = float(state["p"]), int(state["k_max"])
        self.raises_k, self.raises_p = int(state["raises_k"]), int(state["raises_p"])
