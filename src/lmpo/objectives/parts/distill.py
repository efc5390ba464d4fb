"""On-policy distillation: a per-token divergence between the policy's and a teacher's next-token distributions.

The policy samples the completions (on-policy); at every completion position t the teacher, run on the same
prefix, gives its next-token distribution q_t and the policy its own p_t. The part adds

    distill_coef · aggregate(D(p_t, q_t))

to the loss (aggregated like the rest of the loss), and scales the policy-gradient term by
``distill_policy_coef`` (0: pure distillation, as GKD; 1: distillation added to the RL objective).

- ``reverse_kl``: ``D = KL(p‖q) = Σ_v p(v)·(log p(v) − log q(v))``: mode-seeking, the per-token loss of on-policy
  distillation (Agarwal et al. 2024, arXiv 2306.13649; Gu et al. 2024, MiniLLM, arXiv 2306.08543).
- ``gkd_jsd``: GKD's generalised Jensen–Shannon divergence with ``m_β = (1 − β)·p + β·q``,
  ``D = β·KL(q‖m_β) + (1 − β)·KL(p‖m_β)``; β = 0 gives the forward KL(q‖p), β = 1 the reverse KL(p‖q) (the
  convention of TRL's ``GKDTrainer.generalized_jsd_loss``, which a test matches to 1e-6 in float64).

Inputs (``lmpo.objectives.parts.INPUTS``): ``logits`` (B, T, V), the policy's logits at the completion positions
(with gradient, divided by the sampling temperature), and ``teacher_logits``: the teacher's (B, T, V) logits, or
with ``distill_top_k`` = K > 0 its (B, T, K) top-K **log-probs** (log-softmax over the full vocabulary) with their
vocabulary ids ``teacher_ids`` (B, T, K). With top-K both distributions are compared on K + 1 outcomes: the K
teacher tokens and one tail bucket holding the rest of the mass, ``1 − Σ_K q`` for the teacher and the policy's
exact mass outside the K tokens (TRL's ``ServerDistillationTrainer`` ``loss_add_tail``). The teacher's memory is
then (B, T, K) instead of (B, T, V); with K = V the result equals the full one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .base import Context, Part, Registry, param

DISTILLATIONS = Registry("distill", "On-policy distillation")
"""Registry of distillation divergences: name → part class."""

_FLOOR = -1e30
"""Stand-in for log 0 (an empty tail bucket): exp gives exactly 0, and no inf − inf reaches a value or gradient."""


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) over the last dimension. log_p, log_q: (..., K). Returns (...)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def generalized_jsd(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """GKD's generalised JSD over the last dimension of log-probs: ``β·KL(q‖m) + (1 − β)·KL(p‖m)``,
    ``m = (1 − β)·p + β·q`` (p the student, q the teacher). β = 0: KL(q‖p); β = 1: KL(p‖q). Returns (...)."""
    if beta == 0.0:
        return _kl(teacher_logp, student_logp)
    if beta == 1.0:
        return _kl(student_logp, teacher_logp)
    mix = torch.logaddexp(student_logp + math.log1p(-beta), teacher_logp + math.log(beta))
    return beta * _kl(teacher_logp, mix) + (1.0 - beta) * _kl(student_logp, mix)


def _tail_from_logp(topk_logp: torch.Tensor) -> torch.Tensor:
    """(..., 1) ``log(1 − Σ_K exp(topk_logp))`` (the mass outside K tokens), floored where it is 0."""
    total = torch.logsumexp(topk_logp, dim=-1, keepdim=True).clamp(max=0.0)
    return torch.log((-torch.expm1(total)).clamp(min=0.0)).clamp(min=_FLOOR)


def sparse_distributions(student_logp: torch.Tensor, teacher_topk_logp: torch.Tensor, teacher_ids: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Both distributions on the K teacher tokens plus one tail bucket: ``((B, T, K+1), (B, T, K+1))`` log-probs.

    student_logp: (B, T, V) log-probs; teacher_topk_logp: (B, T, K) log-probs; teacher_ids: (B, T, K) ids.
    The student's tail is the log-sum-exp of its log-probs outside the K ids (exact, not 1 − a rounded sum).
    """
    picked = student_logp.gather(-1, teacher_ids)  # (B, T, K)
    outside = student_logp.scatter(-1, teacher_ids, _FLOOR)  # (B, T, V): the K ids removed
    student_tail = torch.logsumexp(outside, dim=-1, keepdim=True).clamp(min=_FLOOR)
    teacher = teacher_topk_logp.clamp(min=_FLOOR)
    return torch.cat([picked, student_tail], -1), torch.cat([teacher, _tail_from_logp(teacher)], -1)


@dataclass(frozen=True)
class DistillPart(Part):
    """Base of the ``distill`` kind: what the objective asks of it, whether a distillation term is selected or not.

    ``check_inputs(logits, teacher_logits, teacher_ids, shape)`` refuses missing or misshapen inputs;
    ``policy_scale()`` is the factor of the policy-gradient term; ``loss(ctx, logits, teacher_logits, teacher_ids,
    reduce, stats)`` is the distillation term (0-dim) or None. Without distillation: nothing to check, factor 1,
    no term.
    """

    def check_inputs(self, logits: torch.Tensor | None, teacher_logits: torch.Tensor | None,
                     teacher_ids: torch.Tensor | None, shape: tuple[int, int]) -> None:
        """Raise ValueError naming the fix when an input this part reads is missing or misshapen."""

    def policy_scale(self) -> float:
        """λ_pg: the factor of the policy-gradient term beside this part's."""
        return 1.0

    def loss(self, ctx: Context, logits: torch.Tensor | None, teacher_logits: torch.Tensor | None,
             teacher_ids: torch.Tensor | None, reduce: Callable[[torch.Tensor], torch.Tensor],
             stats: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The distillation term ``λ_d·aggregate(D_t)`` (0-dim, with gradient) or None; ``reduce`` aggregates a
        (B, T) term as the rest of the loss is aggregated."""
        return None


@dataclass(frozen=True)
class Distillation(DistillPart):
    """Base of the distillation divergences: ``per_token(logits, teacher_logits, teacher_ids)`` → (B, T)."""

    family = "a distillation divergence"
    needs = frozenset({"logits", "teacher_logits"})
    stats = {"loss/distill": "the distillation term of the objective (distill_coef · aggregated divergence)",
             "distill/divergence": "mean per-token divergence between the policy and the teacher"}

    distill_coef: float = param(1.0, "weight of the distillation term in the loss", low=0.0, low_inclusive=True)
    distill_policy_coef: float = param(1.0, "weight of the policy-gradient term beside distillation (0: pure "
                                            "on-policy distillation, as GKD)", low=0.0, low_inclusive=True)
    distill_top_k: int = param(0, "compare on the teacher's top-K tokens plus a tail bucket (the teacher input is "
                                  "(B, T, K)); 0 = the full vocabulary", low=0, low_inclusive=True,
                               hint="0 uses the full distribution.")

    def divergence(self, student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
        """D(p, q) over the last dimension of log-probs."""
        raise NotImplementedError

    def per_token(self, logits: torch.Tensor, teacher_logits: torch.Tensor, teacher_ids: torch.Tensor | None,
                  valid: torch.Tensor) -> torch.Tensor:
        """(B, T) divergence at valid positions, 0 elsewhere (garbage there reaches no value or gradient).

        logits: (B, T, V) policy logits (with gradient); teacher_logits: (B, T, V) logits, or (B, T, K) top-K
        log-probs with teacher_ids (B, T, K); valid: (B, T) bool.
        """
        dtype = torch.promote_types(logits.dtype, torch.float32)
        keep = valid.unsqueeze(-1)
        student = torch.log_softmax(torch.where(keep, logits.to(dtype), 0.0), dim=-1)
        teacher = torch.where(keep, teacher_logits.detach().to(dtype), 0.0)
        if teacher_ids is None:
            d = self.divergence(student, torch.log_softmax(teacher, dim=-1))
        else:
            student, teacher = sparse_distributions(student, teacher, torch.where(keep, teacher_ids, 0))
            d = self.divergence(student, teacher)
        return torch.where(valid, d, 0.0)

    def policy_scale(self) -> float:
        return self.distill_policy_coef

    def loss(self, ctx, logits, teacher_logits, teacher_ids, reduce, stats):
        """``distill_coef · reduce(D_t)``; reports it as ``loss/distill`` and the token mean of ``D_t`` as
        ``distill/divergence``."""
        divergence = self.per_token(logits, teacher_logits, teacher_ids, ctx.valid)  # (B, T)
        distill_loss = self.distill_coef * reduce(divergence)
        stats["loss/distill"] = distill_loss.detach()
        stats["distill/divergence"] = divergence.detach().sum() / ctx.num_valid.clamp(min=1.0)
        return distill_loss

    def check_inputs(self, logits, teacher_logits, teacher_ids, shape: tuple[int, int]) -> None:
        """Shapes of the three inputs against the (B, T) of the log-probs; raises ValueError naming the fix."""
        for name, x in (("logits", logits), ("teacher_logits", teacher_logits)):
            if x is None:
                raise ValueError(f"{name} is required by this objective (distill={self.name!r}); pass "
                                 f"{name}=(B, T, {'K' if name == 'teacher_logits' and self.distill_top_k else 'V'}).")
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != shape:
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits has shape {got}; distill={self.name!r} needs the policy's (B, T, V) logits at "
                             f"the completion positions, (B, T) = {shape}.")
        V = logits.shape[-1]
        k = self.distill_top_k
        want = (*shape, k if k else V)
        if not isinstance(teacher_logits, torch.Tensor) or tuple(teacher_logits.shape) != want:
            got = tuple(teacher_logits.shape) if isinstance(teacher_logits, torch.Tensor) else None
            what = f"top-{k} log-probs (distill_top_k={k})" if k else "logits over the policy's vocabulary"
            raise ValueError(f"teacher_logits has shape {got} but must be {want}: the teacher's {what}.")
        if k and (not isinstance(teacher_ids, torch.Tensor) or tuple(teacher_ids.shape) != want):
            got = tuple(teacher_ids.shape) if isinstance(teacher_ids, torch.Tensor) else None
            raise ValueError(f"teacher_ids has shape {got} but distill_top_k={k} needs the (B, T, K) = {want} "
                             "vocabulary ids of the teacher's top-K log-probs.")
        if not k and teacher_ids is not None:
            raise ValueError("teacher_ids was given but distill_top_k=0 compares full distributions; drop "
                             "teacher_ids or set distill_top_k to K.")


@DISTILLATIONS.register
@dataclass(frozen=True)
class NoDistillation(DistillPart):
    """No distillation term (the default)."""

    name = "none"
    formula = "—"
    source = "—"


@DISTILLATIONS.register
@dataclass(frozen=True)
class ReverseKL(Distillation):
    """Reverse KL to the teacher, ``KL(p‖q) = Σ_v p(v)(log p(v) − log q(v))`` per token: the policy is pulled
    towards the teacher's modes on its own samples (on-policy distillation)."""

    name = "reverse_kl"
    formula = "Σ_v p(v)·(log p(v) − log q(v))"
    source = "Agarwal et al. 2024, GKD (arXiv 2306.13649); Gu et al. 2024, MiniLLM (arXiv 2306.08543)"

    def divergence(self, student_logp, teacher_logp):
        return _kl(student_logp, teacher_logp)


@DISTILLATIONS.register
@dataclass(frozen=True)
class GeneralizedJSD(Distillation):
    """GKD's generalised Jensen–Shannon divergence ``β·KL(q‖m) + (1 − β)·KL(p‖m)``, ``m = (1 − β)p + βq``
    (TRL ``GKDTrainer.generalized_jsd_loss``): β = 0 is the forward KL(q‖p), β = 1 the reverse KL(p‖q)."""

    name = "gkd_jsd"
    formula = "β·KL(q‖m) + (1 − β)·KL(p‖m),  m = (1 − β)·p + β·q"
    source = "Agarwal et al. 2024, GKD (arXiv 2306.13649), Eq. 1; TRL GKDTrainer.generalized_jsd_loss"

    jsd_beta: float = param(0.5, "β of the generalised JSD (0: forward KL(teacher‖policy), 1: reverse KL)",
                            low=0.0, high=1.0, low_inclusive=True)

    def divergence(self, student_logp, teacher_logp):
        return generalized_jsd(student_logp, teacher_logp, self.jsd_beta)


__all__ = ["DISTILLATIONS", "DistillPart", "Distillation", "GeneralizedJSD", "NoDistillation", "ReverseKL", "generalized_jsd",
           "sparse_distributions"]
