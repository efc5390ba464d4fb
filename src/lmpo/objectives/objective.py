"""The composed policy objective: one chosen part of each kind, one pure call.

Per token (before aggregation), with ρ from the level, ψ the trust-region term, c_t the credit weight,
w_t the rollout-correction weight and k_t the rejection mask:

    ℓ_t = λ_pg·w_t·k_t·[c_t·ψ(ρ, A_t)·(1 − clipcov_t) + β_cov·|r_t|·klcov_t] + β·KL_t(π‖π_ref) − coef·H_t
          + λ_d·D_t(π‖π_teacher)
    loss = aggregate(ℓ, mask)

Example::

    obj = Objective.preset("dapo")
    loss, stats = obj(logp, old_logp, advantages, mask)   # logp (B,T) with grad; advantages (B,) or (B,T)

The call reads no config object, calls no ``.item()`` (one optional fused finiteness check is the only
host sync, see ``check_finite``), moves nothing between devices and mutates none of its inputs.
Statistics are detached 0-dim tensors with keys ``component/name``.

Construction. ``Objective(**keywords)`` takes one keyword per kind of part selecting it by name (``level``,
``trust_region``, ``credit``, ``correction``, ``rejection``, ``cov_control``, ``kl_estimator``, ``distill``, ``aggregation``;
``adaptive_entropy=True``
selects the adaptive entropy control), each part's own parameters (``eps_high``, ``ema_beta``, …), and the
objective-wide fields (``kl_coef``, ``entropy_coef``, ``log_ratio_clamp``, ``advantage_scale``,
``check_finite``, ``name``). Every route resolves the same way: ``Objective.preset(name, **o)``,
``Objective.preset(name).replace(**o)``, a YAML ``objective`` section and ``--objective.overrides.k v`` on the
command line all merge ``o`` into the explicit keywords they start from, and

- a parameter is read by the part that declares it; one given for a part that is not selected is refused,
  naming both keywords;
- when ``o`` switches a kind to another part, the explicit parameters of the old part that the new part does
  not have are dropped (``Objective.preset("grad_adaptive").replace(credit="none")`` is plain GSPO), those
  both have are kept (``Objective.preset("dapo", trust_region="ppo").eps_high`` is still 0.28);
- defaults that depend on another parameter are resolved on read, never written into the frozen object
  (``Objective.preset("grpo").replace(trust_region="clip_higher").eps_high`` is clip_higher's 0.28).

Two objectives are equal when they compute the same loss: the same parts with the same parameters and the
same objective-wide fields (``name`` is informational and not compared).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from .keywords import (
    ADVANTAGE_SCALES,
    DEFAULT_PARTS,
    GENERAL_FIELDS,
    General,
    all_keywords,
    flat_keywords,
    merge_spec,
    owners_by_keyword,
    read_keyword,
    resolve,
)
from .parts import KINDS, Context, Part, Registry
from .parts.base import Tally
from .parts.entropy import AdaptiveEntropyController
from .validation import (
    check_mask_dtype,
    check_tensor_shape,
    report_bad_mask,
    report_nonfinite,
)

_PRESETS: dict[str, Any] = {}
PRESETS: Mapping[str, Any] = MappingProxyType(_PRESETS)
"""Registry of named presets (read-only), filled by ``presets.py``: name → ``Preset``."""

class Objective:
    """A GRPO-family policy objective composed of one part of each kind (see the module docstring).

    >>> Objective(level="sequence", trust_region="ppo", eps_low=3e-4, eps_high=4e-4)   # GSPO
    >>> Objective.preset("gspo", eps_high=5e-4)
    """

    __slots__ = ("_spec", "_general", "_parts", "_needs", "_selected", "_reporters")

    def __init__(self, **keywords: Any) -> None:
        spec = flat_keywords(keywords)
        general, parts = resolve(spec)
        object.__setattr__(self, "_spec", MappingProxyType(spec))
        object.__setattr__(self, "_general", general)
        object.__setattr__(self, "_parts", MappingProxyType(parts))
        object.__setattr__(self, "_needs", None)
        # what a call runs, fixed here: the optional kinds whose part is not "none" (an unselected kind costs nothing
        # and is not opened by a reader following a call), and the parts that report statistics after the loss
        object.__setattr__(self, "_selected", {kind: part for kind, part in parts.items()
                                               if kind in OPTIONAL_KINDS and part.name != "none"})
        object.__setattr__(self, "_reporters", tuple(part for kind, part in parts.items()
                                                     if type(part).report is not Part.report
                                                     and (kind not in OPTIONAL_KINDS or kind in self._selected)))

    # ------------------------------------------------------------------ construction routes
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Objective:
        """Build a named preset (see ``lmpo.objectives.PRESETS``), overriding fields one by one."""
        if name not in PRESETS:  # presets.py fills the registry when lmpo.objectives is imported
            close = difflib.get_close_matches(str(name), list(PRESETS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}.{hint}")
        overrides = flat_keywords(overrides)
        unknown = [k for k in overrides if k not in all_keywords()]
        if unknown:
            raise TypeError(f"unknown Objective field(s) {', '.join(map(repr, unknown))} for preset {name!r}; "
                            f"valid fields: {', '.join(k for k in all_keywords() if k != 'name')}.")
        return cls(**merge_spec({"name": name, **PRESETS[name].fields}, overrides))

    def replace(self, **overrides: Any) -> Objective:
        """A copy with some keywords changed, resolved exactly as ``Objective.preset(name, **overrides)``."""
        return type(self)(**merge_spec(self._spec, overrides))

    def to_dict(self) -> dict[str, Any]:
        """The explicit keywords this objective was built from: ``Objective(**obj.to_dict()) == obj``."""
        return dict(self._spec)

    # ------------------------------------------------------------------ reading it
    @property
    def parts(self) -> Mapping[str, Part]:
        """Kind → the selected part (a frozen dataclass of its parameters)."""
        return self._parts

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        return read_keyword(key, self._general, self._parts)

    def __setattr__(self, key: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {key!r}; use objective.replace({key}=...)")

    def __delattr__(self, key: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {key!r}")

    def _key(self) -> tuple:
        general = dataclasses.replace(self._general, name="")
        return (general, tuple(self._parts[k] for k in KINDS))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Objective) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._spec.items())
        return f"Objective({inner})"

    def __reduce__(self):
        return (_rebuild, (dict(self._spec),))

    @property
    def needs(self) -> frozenset[str]:
        """The optional inputs (``lmpo.objectives.parts.INPUTS``) this objective needs from the caller."""
        if self._needs is None:
            needs = set().union(*(p.needs for p in self._parts.values()))
            if self._general.kl_coef != 0.0:
                needs.add("ref_logp")
            if self._general.entropy_coef != 0.0:
                needs.add("entropy")
            object.__setattr__(self, "_needs", frozenset(needs))
        return self._needs

    @property
    def entropy_in_loss(self) -> bool:
        """Whether the entropies enter the loss with their gradient (a bonus), not only as a mask or a statistic."""
        return self._general.entropy_coef != 0.0 or self.adaptive_entropy

    @property
    def is_sequence_level(self) -> bool:
        return self._parts["level"].per_sequence

    def make_entropy_controller(self) -> AdaptiveEntropyController | None:
        return self._parts["entropy_control"].make_controller()

    def stat_docs(self) -> dict[str, str]:
        """Every statistic key this objective may return, with its meaning."""
        docs = dict(COMMON_STATS)
        for part in self._parts.values():
            docs.update(part.stats)
        return docs

    # ------------------------------------------------------------------ the objective
    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logp: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        token_grad_norm: torch.Tensor | None = None,
        rollout_logp: torch.Tensor | None = None,
        rollout_is_weights: torch.Tensor | None = None,
        num_tokens: torch.Tensor | float | None = None,
        num_seqs: torch.Tensor | float | None = None,
        entropy_coef: float | torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        logits: torch.Tensor | None = None,
        teacher_logits: torch.Tensor | None = None,
        teacher_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss and statistics.

        Args:
            logp:       (B, T) log π_θ(y_t) of the sampled tokens; carries the gradient.
            old_logp:   (B, T) behaviour log-probs (treated as constants).
            advantages: (B,) per sequence or (B, T) per token.
            mask:       (B, T) bool or float/int 0/1; 1 where a token counts. Invalid positions may hold
                        anything (including NaN) in every (B, T) input.
            ref_logp:   (B, T) reference log-probs; required when ``"ref_logp" in self.needs``.
            entropy:    (B, T) token entropies (with gradient for the bonus); required when
                        ``"entropy" in self.needs``, otherwise only reported.
            token_grad_norm: (B, T) ‖∇θ log π(y_t)‖; required when ``"token_grad_norm" in self.needs``.
            rollout_logp: (B, T) the sampler's log-probs of the sampled tokens; required by the rollout
                        corrections and rejections (``"rollout_logp" in self.needs``).
            rollout_is_weights: (B, T) correction weights the host computed (``correction="given"``).
            num_tokens: global valid-token count for ``token_mean`` (exact accumulation / DP).
            num_seqs:   global sequence count for the ``seq_*`` aggregations.
            entropy_coef: coefficient overriding ``self.entropy_coef`` (the adaptive controller's
                        ``coef``; required when ``adaptive_entropy``).
            generator:  torch.Generator (on the tensors' device) for clip_cov's random choice.
            logits:     (B, T, V) the policy's logits / τ at the completion positions (with gradient); required
                        by a ``distill`` part.
            teacher_logits: (B, T, V) the teacher's logits, or (B, T, K) its top-K log-probs under
                        ``distill_top_k`` = K; required by a ``distill`` part.
            teacher_ids: (B, T, K) vocabulary ids of the teacher's top-K log-probs (``distill_top_k`` > 0).
        Returns:
            ``(loss, stats)``: 0-dim loss; dict of detached 0-dim statistics.
        """
        optional = {"ref_logp": ref_logp, "entropy": entropy, "token_grad_norm": token_grad_norm,
                    "rollout_logp": rollout_logp, "rollout_is_weights": rollout_is_weights}
        valid = self._check_inputs(logp, old_logp, advantages, mask, optional, num_tokens, num_seqs, entropy_coef)
        parts, selected = self._parts, self._selected
        distill = selected.get("distill")
        if distill is not None:
            distill.check_inputs(logits, teacher_logits, teacher_ids, tuple(logp.shape))
        dtype = torch.promote_types(logp.dtype, torch.float32)  # low-precision inputs are computed in fp32
        m = valid.to(dtype)
        lengths = m.sum(-1)  # (B,) |y|
        num_valid = lengths.sum()  # N
        clamp = self._general.log_ratio_clamp
        # Inputs are zeroed at invalid positions by selects, so that garbage there (even NaN) reaches no value or
        # gradient. The finiteness check then costs one reduction per input and one host sync, which also tells
        # whether any log-ratio reaches the clamp.
        diff, adv, adv_check, inputs = _masked_inputs(logp, old_logp, advantages, optional, valid, lengths, dtype)
        clamped = True  # whether some |log-ratio| may exceed the clamp (unknown without the check)
        if self._general.check_finite:
            clamped = self._check_values(diff, adv_check, inputs, mask, valid, logp, old_logp, advantages, clamp)

        # When no log-ratio reaches the clamp the clamp is the identity (in value and gradient): skip it.
        ctx = Context(logp=logp, old_logp=old_logp, valid=valid, m=m, lengths=lengths, num_valid=num_valid, diff=diff,
                      log_ratio=diff.clamp(-clamp, clamp) if clamped else diff, adv=adv, dtype=dtype, inputs=inputs,
                      generator=generator, clamp=clamp)
        stats: dict[str, torch.Tensor] = {}
        if "credit" in selected:
            ctx.credit = selected["credit"].weights(ctx)
        if "correction" in selected:
            ctx.correction = selected["correction"].apply(ctx, stats)
        if "rejection" in selected:
            ctx.keep = selected["rejection"].keep(ctx, stats)
        rho, rho_value = parts["level"].weight(ctx)
        trust_region = parts["trust_region"]
        term = ctx.term = trust_region.term(rho, adv, ctx)
        per_token = term.loss
        if ctx.credit is not None and not parts["level"].credit_inside:
            per_token = per_token * ctx.credit

        cov_control = selected.get("cov_control")
        per_token, policy_m = cov_control.apply(ctx, term, per_token, m, stats) if cov_control is not None \
            else (per_token, m)
        if ctx.correction is not None and not trust_region.absorbs_correction:
            per_token = per_token * ctx.correction
        if ctx.keep is not None:
            per_token = per_token * ctx.keep
        aggregation = parts["aggregation"]
        norm = {"num_tokens": num_valid.clamp(min=1.0) if num_tokens is None else num_tokens, "num_seqs": num_seqs}

        def reduce(x: torch.Tensor) -> torch.Tensor:
            """A (B, T) term aggregated over the valid tokens as the objective's loss is."""
            return aggregation.reduce(x, m, lengths=lengths, **norm)

        # The row sums of an edited mask are not the lengths; the lengths stay the per-sequence normalisers.
        edits_mask = cov_control is not None and cov_control.edits_mask
        policy_loss = aggregation.reduce(per_token, policy_m, lengths=None if edits_mask else lengths,
                                         seq_lengths=lengths, **norm)
        scale = distill.policy_scale() if distill is not None else 1.0
        if scale != 1.0:
            policy_loss = scale * policy_loss
        loss = policy_loss
        stats["loss/policy"] = policy_loss.detach()
        distill_loss = distill.loss(ctx, logits, teacher_logits, teacher_ids, reduce, stats) if distill is not None \
            else None
        if distill_loss is not None:
            loss = loss + distill_loss

        if "ref_logp" in inputs:
            loss = self._reference_kl(ctx, loss, stats, reduce, rho)
        if "entropy" in inputs:
            ent = inputs["entropy"]
            stats["entropy/mean"] = ent.detach().sum() / num_valid.clamp(min=1.0)
            entropy_loss = parts["entropy_control"].loss(ent, self._general.entropy_coef, entropy_coef, reduce, ctx,
                                                         stats)
            if entropy_loss is not None:
                loss = loss + entropy_loss

        with torch.no_grad():
            self._ratio_stats(stats, ctx, rho, rho_value, clamped)
        return loss, stats

    # ------------------------------------------------------------------ internals
    def _reference_kl(self, ctx: Context, loss: torch.Tensor, stats: dict, reduce, rho: torch.Tensor
                      ) -> torch.Tensor:
        """``loss + β·reduce(KL_t)`` when ``kl_coef`` β ≠ 0 (``loss/kl_ref``), else ``loss``; reports the token mean
        of the estimate as ``kl/ref`` either way (``reduce``: the loss's aggregation of a (B, T) term)."""
        estimator = self._parts["kl_estimator"]
        logp_m = ctx.diff + ctx.old_valid  # logp at valid tokens
        ref = ctx.inputs["ref_logp"]
        if self._general.kl_coef != 0.0:
            kl_term = estimator.term(logp_m, ref, ctx.clamp, rho)
            kl_loss = self._general.kl_coef * reduce(kl_term)
            loss = loss + kl_loss
            stats["loss/kl_ref"] = kl_loss.detach()
            kl_term = kl_term.detach()
        else:
            kl_term = estimator.estimate(logp_m.detach(), ref, ctx.clamp)
        stats["kl/ref"] = (kl_term * ctx.m).sum() / ctx.num_valid.clamp(min=1.0)
        return loss

    def _ratio_stats(self, stats: dict, ctx: Context, rho: torch.Tensor, rho_value: torch.Tensor,
                     clamped: bool) -> None:
        """The statistics every objective returns (``COMMON_STATS``) around those of the parts (``Part.report``)."""
        dtype, m, valid = ctx.dtype, ctx.m, ctx.valid
        n = ctx.num_valid.clamp(min=1.0)
        low, high = self._parts["trust_region"].flags(ctx.term, rho, rho_value, ctx.adv)
        # Sequence levels with per-sequence advantages count per non-empty sequence, all else per token.
        per_sequence = low.shape[-1] == 1
        if per_sequence:
            weight = (ctx.lengths > 0).to(dtype).unsqueeze(-1)  # (B, 1)
            rows = weight.sum()
            count, empty = rows.clamp(min=1.0), rows == 0
        else:
            weight, count, empty = m, n, ctx.num_valid == 0  # no valid token: report ratio 1
        values = rho_value if rho_value.shape == weight.shape else rho_value.expand_as(weight)
        # ratios are positive and ≤ e^{20}: masked min/max/mean need no select
        weighted = values * weight
        stats["ratio/mean"] = torch.where(empty, 1.0, weighted.sum() / count)
        stats["ratio/max"] = torch.where(empty, 1.0, weighted.amax())
        stats["ratio/min"] = torch.where(empty, 1.0, weighted.add_(weight.sub(1.0).mul_(-1e30)).amin())
        if clamped:
            stats["ratio/clamped_tokens"] = (ctx.log_ratio != ctx.diff).sum().to(dtype)
        else:  # the check saw every |log-ratio| within the clamp
            stats["ratio/clamped_tokens"] = torch.zeros((), dtype=dtype, device=valid.device)
        tally = Tally(weight=weight, count=count, per_sequence=per_sequence, ratio=values, low=low, high=high)
        for part in self._reporters:
            part.report(stats, ctx, tally)
        # k3 estimate of KL(π_old‖π_θ) = E_old[e^{−r} + r − 1]: exactly 0 at the masked zeros (exp(0) = 1)
        lr = ctx.log_ratio
        if self._parts["level"].unit_off_mask:  # ρ = e^{r} is there already: e^{−r} = 1/ρ costs no exp
            stats["kl/behaviour_k3"] = torch.reciprocal(rho_value).add_(lr).sub_(1.0).sum() / n
        else:
            stats["kl/behaviour_k3"] = torch.neg(lr).exp_().add_(lr).sub_(1.0).sum() / n
        stats["tokens/valid"] = ctx.num_valid.detach().clone()

    def _check_inputs(self, logp, old_logp, advantages, mask, optional, num_tokens, num_seqs,
                      entropy_coef) -> torch.Tensor:
        if not isinstance(logp, torch.Tensor) or logp.dim() != 2:
            got = tuple(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
            raise ValueError(f"logp must be a (B, T) tensor of log-probs, got {got}.")
        if not logp.dtype.is_floating_point:
            raise TypeError(f"logp has dtype {logp.dtype}; log-probs must be floating point.")
        shape = tuple(logp.shape)
        check_tensor_shape("old_logp", old_logp, shape, "(B, T)")
        check_tensor_shape("mask", mask, shape, "(B, T)")
        check_mask_dtype(mask)
        if not isinstance(advantages, torch.Tensor) or tuple(advantages.shape) not in (shape[:1], shape):
            got = tuple(advantages.shape) if isinstance(advantages, torch.Tensor) else type(advantages).__name__
            raise ValueError(
                f"advantages has shape {got} but must be (B,) = {shape[:1]} or (B, T) = {shape}; "
                f"one value per sequence or per token."
            )
        needs = self.needs
        for name, x in optional.items():
            if x is None:
                if name in needs:
                    raise ValueError(f"{name} is required by this objective ({self._why(name)}); "
                                     f"pass {name}=(B, T).")
            else:
                check_tensor_shape(name, x, shape, "(B, T)")
        if "entropy_coef" in needs and entropy_coef is None:
            raise ValueError(
                "adaptive_entropy=True: pass entropy_coef=controller.coef "
                "(controller = objective.make_entropy_controller(), updated once per optimizer step; "
                "lmpo.objectives.ObjectiveDriver does this for you)."
            )
        for name, x in (("num_tokens", num_tokens), ("num_seqs", num_seqs)):
            if isinstance(x, (int, float)) and not x > 0:
                raise ValueError(f"{name}={x!r} must be positive (the global count over the optimizer step).")
        return mask if mask.dtype == torch.bool else mask != 0

    def _check_values(self, diff, adv, masked, mask, valid, logp, old_logp, advantages, clamp) -> bool:
        """One cheap reduction per tensor the call computes anyway, a single host sync, then a slow report.

        A sum is non-finite iff some element is (inf − inf gives NaN), barring overflow of a sum of
        finite values, which needs magnitudes near 1e38 / (B·T) that log-probs never reach. The log-ratios are
        reduced to their min and max instead (finite iff every element is), which also tells whether any of
        them reaches the clamp; returns that.
        """
        finite, clamped, mask_ok = _scan(diff, adv, masked, mask, clamp)
        if finite and mask_ok:
            return clamped
        if not mask_ok:
            report_bad_mask(mask)
        report_nonfinite({"logp": logp, "old_logp": old_logp, "advantages": advantages, **masked}, valid)
        raise ValueError("logp − old_logp overflowed at a valid token; check the scale of the log-probs.")

    def _why(self, name: str) -> str:
        if name == "ref_logp":
            return f"kl_coef={self.kl_coef}"
        if name == "entropy" and self.entropy_in_loss:
            return f"entropy_coef={self.entropy_coef}, adaptive_entropy={self.adaptive_entropy}"
        owners = [f"{kind}={part.name!r}" for kind, part in self._parts.items() if name in part.needs]
        return ", ".join(owners)


def _masked_inputs(logp, old_logp, advantages, optional, valid, lengths, dtype):
    """``(diff, adv, adv_check, inputs)``: the log-ratio (B, T), advantages (B, 1) or (B, T), the advantages to check,
    and the optional inputs, each 0 at invalid positions (selects: garbage there, NaN included, goes nowhere)."""
    def zero_invalid(x: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, x, 0.0)

    diff = zero_invalid(logp.to(dtype) - old_logp.detach().to(dtype))  # (B, T) log-ratio
    if advantages.dim() == 1:
        adv_check = torch.where(lengths > 0, advantages.detach().to(dtype), 0.0)  # (B,): empty rows may hold NaN
        adv = adv_check.unsqueeze(-1)  # (B, 1)
    else:
        adv = adv_check = zero_invalid(advantages.detach().to(dtype))  # (B, T)
    inputs = {k: zero_invalid(x.to(dtype)) for k, x in optional.items() if x is not None}
    return diff, adv, adv_check, inputs


def _scan(diff, adv, inputs, mask, clamp) -> tuple[bool, bool, bool]:
    """One reduction per tensor and a single host sync: ``(finite, clamped, mask_ok)``.

    A sum is non-finite iff some element is (inf − inf gives NaN), barring overflow of a sum of finite values,
    which needs magnitudes near 1e38 / (B·T) that log-probs never reach. The log-ratios are reduced to their min
    and max instead (finite iff every element is), which also tells whether any reaches the clamp.
    """
    with torch.no_grad():
        low, high = torch.aminmax(diff.detach())
        sums = [low, high, adv.sum()] + [x.detach().sum() for x in inputs.values()]
        flags = [torch.isfinite(torch.stack(sums)).all(), (low < -clamp) | (high > clamp)]
        if mask.dtype != torch.bool:
            flags.append(((mask == 0) | (mask == 1)).all())
        ok = torch.stack(flags).tolist()  # the one host sync of the call
    return bool(ok[0]), bool(ok[1]), bool(ok[2]) if len(ok) > 2 else True


def _rebuild(spec: dict[str, Any]) -> Objective:
    return Objective(**spec)


#: kinds a call runs only when their part is not "none" (level, trust region, aggregation, KL estimator and
#: entropy control always take part: the loss, its statistics and the optional KL and entropy terms read them)
OPTIONAL_KINDS = frozenset({"credit", "correction", "rejection", "cov_control", "distill"})

COMMON_STATS: dict[str, str] = {
    "loss/policy": "the policy-gradient term of the objective",
    "loss/kl_ref": "the reference-KL term of the objective (when kl_coef > 0)",
    "kl/ref": "KL estimate to the reference policy (when reference log-probs are passed)",
    "entropy/mean": "mean token entropy of the policy on sampled completions (when entropies are passed)",
    "ratio/mean": "mean importance weight pi/pi_old (1 on-policy)",
    "ratio/min": "minimum importance weight",
    "ratio/max": "maximum importance weight",
    "ratio/clamped_tokens": "tokens whose log-ratio hit the clamp bound before exp",
    "kl/behaviour_k3": "k3 estimate of KL(pi_old || pi) over the minibatch",
    "tokens/valid": "valid completion tokens per optimizer step (the objective's normaliser)",
}
"""Statistics every objective returns (parts add theirs: ``Part.stats``)."""

__all__ = ["ADVANTAGE_SCALES", "COMMON_STATS", "DEFAULT_PARTS", "GENERAL_FIELDS", "General", "Objective",
           "Registry", "merge_spec", "owners_by_keyword"]
