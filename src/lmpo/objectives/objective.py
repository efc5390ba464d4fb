"""The composed policy objective (SPEC §1): one frozen dataclass, one pure call.

Per token (before aggregation), with ρ from the level, ψ the trust-region term and c_t the credit weight:

    ℓ_t = c_t·ψ(ρ, A_t)·(1 − clipcov_t) + β_cov·|r_t|·klcov_t + β·KL_t(π‖π_ref) − coef·H_t
    loss = aggregate(ℓ, mask)

Example::

    obj = Objective.preset("dapo")
    loss, stats = obj(logp, old_logp, advantages, mask)   # logp (B,T) with grad; advantages (B,) or (B,T)

The call reads no config object, calls no ``.item()`` (one optional fused finiteness check is the only
host sync, see ``check_finite``), moves nothing between devices and mutates none of its inputs.
Statistics are detached 0-dim tensors with keys ``component/name``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .aggregation import AGGREGATIONS, aggregate
from .credit import CREDIT_MODES, GRAD_NORM_MODES, gradient_adaptive_weights, temporal_decay_weights
from .entropy import (
    COV_CONTROLS,
    AdaptiveEntropyController,
    clip_cov_pick,
    covariance_mean,
    kl_cov_pick,
    token_covariance,
    top_fraction_mean,
)
from .kl import KL_ESTIMATORS, kl_estimate
from .levels import EMA_GRADS, LEVELS, SEQUENCE_LEVELS, importance_weight
from .trust_region import (
    CLIPPED_TRUST_REGIONS,
    PTRW_GRADS,
    TRUST_REGIONS,
    clip_activity,
    clip_bounds,
    trust_region_loss,
)
from .validation import (
    check_choice,
    check_mask_dtype,
    check_range,
    check_tensor_shape,
    report_bad_mask,
    report_nonfinite,
)

ADVANTAGE_SCALES = ("group", "batch", "none")
CLIP_HIGHER_DEFAULT_EPS_HIGH = 0.28


@dataclass(frozen=True)
class Objective:
    """A GRPO-family policy objective composed of independently selectable parts (SPEC §1.1–1.6)."""

    name: str = "custom"
    """Preset the objective was built from (informational)."""
    # --- importance weight (levels.py) ---
    level: str = "token"
    """token | sequence (GSPO) | sequence_token (GSPO-token) | sequence_arith (AMIC) | token_ema."""
    ema_beta: float = 0.2
    """token_ema smoothing factor β ∈ (0, 1]; β = 1 is the token level."""
    ema_grad: str = "local"
    """token_ema gradient: local (value w'_t, gradient w'_t·∇logπ_t) | full (autograd through the recurrence)."""
    log_ratio_clamp: float = 20.0
    """Log-ratios are clamped to ±this before exp (clamped tokens get no gradient through the ratio)."""
    # --- trust region (trust_region.py) ---
    trust_region: str = "ppo"
    """ppo | clip_higher | sign_asym | gaussian (PTRW) | none."""
    eps_low: float = 0.2
    """Lower clip range: ρ ≥ 1 − eps_low binds for A < 0 (ppo, clip_higher)."""
    eps_high: float | None = None
    """Upper clip range: ρ ≤ 1 + eps_high binds for A > 0. None: eps_low for ppo, 0.28 for clip_higher."""
    eps_pos: float = 0.28
    """sign_asym: ε used where A > 0."""
    eps_neg: float = 0.2
    """sign_asym: ε used where A < 0."""
    dual_clip: bool = False
    """Cap the loss of A < 0 terms at −dual_clip_c·A (clipped modes only)."""
    dual_clip_c: float = 3.0
    ptrw_sigma: float = 0.5
    """gaussian: width σ of φ(ρ) = exp(−(ρ−1)²/(2σ²))."""
    ptrw_grad: str = "full"
    """gaussian: full (gradient of φ·ρ, sign flips when ρ(ρ−1) > σ²) | detach_phi."""
    # --- token credit weights (credit.py) ---
    credit: str = "none"
    """none | temporal_decay | gradient_adaptive."""
    decay_gamma: float = 0.999
    """temporal_decay: d(t) = γ^{t−1}, γ ∈ (0, 1]."""
    decay_normalize: bool = True
    """temporal_decay: rescale so Σ_t d(t) = |y|."""
    grad_tau: float = 1.0
    """gradient_adaptive: softmax temperature τ > 0."""
    grad_norm_mode: str | None = None
    """gradient_adaptive: how the trainer computes token_grad_norm: exact | lm_head (default) | logits."""
    # --- entropy control (entropy.py) ---
    entropy_coef: float = 0.0
    """Static entropy bonus coefficient (loss −= coef·aggregated entropy)."""
    adaptive_entropy: bool = False
    """Use the Skywork-OR1 controller (obj.make_entropy_controller()); its coef is passed per call."""
    entropy_target: float = 0.2
    entropy_delta: float = 0.005
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_init: float = 0.0
    cov_control: str = "none"
    """none | clip_cov | kl_cov (Cui et al. 2025)."""
    clip_cov_ratio: float = 2e-4
    """clip_cov: fraction r of valid tokens to zero (max(1, ⌊r·N⌋))."""
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_frac: float = 2e-3
    """kl_cov: fraction k (not a percentage) of valid tokens penalised (max(1, ⌊k·N⌋))."""
    kl_cov_coef: float = 1.0
    """kl_cov: β_cov of the |logp − old_logp| penalty."""
    # --- reference KL (kl.py) ---
    kl_coef: float = 0.0
    """β of the reference-KL term (0 disables it and the need for ref_logp)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3."""
    # --- aggregation (aggregation.py) ---
    aggregation: str = "seq_mean_token_mean"
    """token_mean | seq_mean_token_mean | seq_mean_token_sum | seq_sum_norm."""
    norm_constant: float | None = None
    """seq_sum_norm: the constant L (e.g. max completion length); None uses T of the batch."""
    # --- what the caller should do around the objective ---
    advantage_scale: str = "group"
    """Advantage scaling the method expects: group | batch | none (Dr. GRPO)."""
    check_finite: bool = True
    """Check inputs for NaN/inf at valid tokens (one fused reduction and one host sync per call)."""

    def __post_init__(self) -> None:
        check_choice("level", self.level, LEVELS)
        check_choice("ema_grad", self.ema_grad, EMA_GRADS)
        check_choice("trust_region", self.trust_region, TRUST_REGIONS)
        check_choice("ptrw_grad", self.ptrw_grad, PTRW_GRADS)
        check_choice("credit", self.credit, CREDIT_MODES)
        check_choice("cov_control", self.cov_control, COV_CONTROLS)
        check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        check_choice("aggregation", self.aggregation, AGGREGATIONS)
        check_choice("advantage_scale", self.advantage_scale, ADVANTAGE_SCALES)
        check_range("ema_beta", self.ema_beta, low=0.0, high=1.0, hint="β = 1 is the token level; small β smooths more.")
        check_range("log_ratio_clamp", self.log_ratio_clamp, low=0.0, high=80.0, hint="The default is 20.")
        if self.eps_high is None:
            default_high = CLIP_HIGHER_DEFAULT_EPS_HIGH if self.trust_region == "clip_higher" else self.eps_low
            object.__setattr__(self, "eps_high", default_high)
        for name in ("eps_low", "eps_high", "eps_pos", "eps_neg"):
            check_range(name, getattr(self, name), low=0.0, high=None, hint="Clip ranges are positive, e.g. 0.2.")
        check_range("eps_low", self.eps_low, low=0.0, high=1.0, high_inclusive=False,
                    hint="1 − eps_low must stay positive.")
        check_range("eps_neg", self.eps_neg, low=0.0, high=1.0, high_inclusive=False,
                    hint="1 − eps_neg must stay positive.")
        check_range("dual_clip_c", self.dual_clip_c, low=1.0, high=None, hint="The usual value is 3.")
        if self.dual_clip and self.trust_region not in CLIPPED_TRUST_REGIONS:
            raise ValueError(
                f"dual_clip=True needs a clipped trust region ({', '.join(CLIPPED_TRUST_REGIONS)}), "
                f"got trust_region={self.trust_region!r}; set dual_clip=False or change trust_region."
            )
        check_range("ptrw_sigma", self.ptrw_sigma, low=0.0, high=None, hint="The default is 0.5.")
        check_range("decay_gamma", self.decay_gamma, low=0.0, high=1.0, hint="γ = 1 disables the decay.")
        check_range("grad_tau", self.grad_tau, low=0.0, high=None, hint="The default is 1.")
        if self.credit == "gradient_adaptive":
            if self.grad_norm_mode is None:
                object.__setattr__(self, "grad_norm_mode", "lm_head")
            check_choice("grad_norm_mode", self.grad_norm_mode, GRAD_NORM_MODES)
        elif self.grad_norm_mode is not None:
            raise ValueError(
                f"grad_norm_mode={self.grad_norm_mode!r} only applies with credit='gradient_adaptive' "
                f"(credit={self.credit!r}); drop grad_norm_mode or set credit='gradient_adaptive'."
            )
        check_range("entropy_coef", self.entropy_coef, low=None, high=None)
        if self.adaptive_entropy:
            self.make_entropy_controller()  # validates the controller's fields
        check_range("clip_cov_ratio", self.clip_cov_ratio, low=0.0, high=1.0, hint="The paper uses 2e-4.")
        check_range("clip_cov_lb", self.clip_cov_lb, low=None, high=None)
        check_range("clip_cov_ub", self.clip_cov_ub, low=self.clip_cov_lb, high=None,
                    hint="clip_cov_ub must exceed clip_cov_lb (defaults 1 and 5).")
        check_range("kl_cov_frac", self.kl_cov_frac, low=0.0, high=1.0,
                    hint="A fraction: verl's k_percent=0.2 is kl_cov_frac=0.002.")
        check_range("kl_cov_coef", self.kl_cov_coef, low=0.0, low_inclusive=True, high=None)
        check_range("kl_coef", self.kl_coef, low=0.0, low_inclusive=True, high=None, hint="0 disables the KL term.")
        if self.norm_constant is not None:
            check_range("norm_constant", self.norm_constant, low=0.0, high=None,
                        hint="Use the max completion length, e.g. 1024.")

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def preset(cls, name: str, **overrides: object) -> Objective:
        """Build a named preset (see ``lmpo.objectives.PRESETS``), overriding fields one by one."""
        from .presets import PRESETS

        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}.")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in overrides if k not in fields]
        if unknown:
            raise TypeError(
                f"unknown Objective field(s) {', '.join(map(repr, unknown))} for preset {name!r}; "
                f"valid fields: {', '.join(sorted(fields - {'name'}))}."
            )
        config = {**PRESETS[name].fields, **overrides}
        config.setdefault("name", name)
        return cls(**config)

    def replace(self, **overrides: object) -> Objective:
        return dataclasses.replace(self, **overrides)

    @property
    def requires_entropy(self) -> bool:
        return self.adaptive_entropy or self.entropy_coef != 0.0

    @property
    def requires_ref_logp(self) -> bool:
        return self.kl_coef != 0.0

    @property
    def requires_token_grad_norm(self) -> bool:
        return self.credit == "gradient_adaptive"

    @property
    def is_sequence_level(self) -> bool:
        return self.level in SEQUENCE_LEVELS

    def make_entropy_controller(self) -> AdaptiveEntropyController | None:
        if not self.adaptive_entropy:
            return None
        return AdaptiveEntropyController(
            target=self.entropy_target,
            delta=self.entropy_delta,
            coef_min=self.entropy_coef_min,
            coef_max=self.entropy_coef_max,
            coef_init=self.entropy_coef_init,
        )

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
        num_tokens: torch.Tensor | float | None = None,
        num_seqs: torch.Tensor | float | None = None,
        entropy_coef: float | torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss and statistics.

        Args:
            logp:       (B, T) log π_θ(y_t) of the sampled tokens; carries the gradient.
            old_logp:   (B, T) behaviour log-probs (treated as constants).
            advantages: (B,) per sequence or (B, T) per token.
            mask:       (B, T) bool or float/int 0/1; 1 where a token counts. Invalid positions may hold
                        anything (including NaN) in every (B, T) input.
            ref_logp:   (B, T) reference log-probs; required when ``requires_ref_logp``.
            entropy:    (B, T) token entropies (with gradient for the bonus); required when
                        ``requires_entropy``, otherwise only reported.
            token_grad_norm: (B, T) ‖∇θ log π(y_t)‖; required when ``requires_token_grad_norm``.
            num_tokens: global valid-token count for ``token_mean`` (exact accumulation / DP).
            num_seqs:   global sequence count for the ``seq_*`` aggregations.
            entropy_coef: coefficient overriding ``self.entropy_coef`` (the adaptive controller's
                        ``coef``; required when ``adaptive_entropy``).
            generator:  torch.Generator (on the tensors' device) for clip_cov's random choice.
        Returns:
            ``(loss, stats)``: 0-dim loss; dict of detached 0-dim statistics.
        """
        valid = self._check_inputs(
            logp, old_logp, advantages, mask, ref_logp, entropy, token_grad_norm, num_tokens, num_seqs, entropy_coef
        )
        dtype = torch.promote_types(logp.dtype, torch.float32)  # low-precision inputs are computed in fp32
        m = valid.to(dtype)
        lengths = m.sum(-1)  # (B,) |y|
        num_valid = lengths.sum()  # N
        # One masked select keeps garbage (even NaN) at invalid positions out of values and gradients.
        diff = torch.where(valid, logp.to(dtype) - old_logp.detach().to(dtype), 0.0)  # (B, T) log-ratio
        if advantages.dim() == 1:
            adv_check = torch.where(lengths > 0, advantages.detach().to(dtype), 0.0)  # empty rows may hold NaN
            adv = adv_check.unsqueeze(-1)  # (B, 1)
        else:
            adv = adv_check = torch.where(valid, advantages.detach().to(dtype), 0.0)  # (B, T)
        masked = {}
        for name, x in (("ref_logp", ref_logp), ("entropy", entropy), ("token_grad_norm", token_grad_norm)):
            if x is not None:
                masked[name] = torch.where(valid, x.to(dtype), 0.0)
        if self.check_finite:
            self._check_values(diff, adv_check, masked, mask, valid, logp, old_logp, advantages)

        clamp = self.log_ratio_clamp
        log_ratio = diff.clamp(-clamp, clamp)
        carrier = None  # value 0, gradient ∇logπ_t at valid tokens (only the levels that need it)
        if self.level == "sequence_token" or (self.level == "token_ema" and self.ema_grad == "local"):
            carrier = diff - diff.detach()

        credit = None
        if self.credit == "temporal_decay":
            credit = temporal_decay_weights(valid, lengths, self.decay_gamma, self.decay_normalize)
        elif self.credit == "gradient_adaptive":
            credit = gradient_adaptive_weights(masked["token_grad_norm"], valid, lengths, self.grad_tau)

        rho, rho_value = importance_weight(
            self.level, log_ratio, carrier, m, valid, lengths, credit, self.ema_beta, self.ema_grad
        )
        term = trust_region_loss(
            rho,
            adv,
            self.trust_region,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            eps_pos=self.eps_pos,
            eps_neg=self.eps_neg,
            dual_clip=self.dual_clip,
            dual_clip_c=self.dual_clip_c,
            ptrw_sigma=self.ptrw_sigma,
            ptrw_grad=self.ptrw_grad,
        )
        per_token = term.loss
        # `sequence` / `sequence_arith` carry c_t inside the sequence mean (levels.py); the other levels
        # weight their per-token terms here.
        if credit is not None and self.level not in ("sequence", "sequence_arith"):
            per_token = per_token * credit

        stats: dict[str, torch.Tensor] = {}
        policy_m = m  # clip_cov replaces it by a copy with the picked tokens at 0
        if self.cov_control != "none":
            with torch.no_grad():
                logp_valid = torch.where(valid, logp.detach().to(dtype), 0.0)
                stats["cov/mean"] = covariance_mean(logp_valid, adv, m, num_valid)
                # −inf at invalid positions: range tests and top-k then skip them with no extra pass
                cov = token_covariance(logp_valid, adv, m, num_valid, inplace=True, invalid_fill=-math.inf)
            # The picks are a handful of tokens: edit them through their flat indices instead of building
            # (B, T) masks (fewer full-size allocations, which dominate the cost on CPU).
            if self.cov_control == "clip_cov":
                index, keep = clip_cov_pick(
                    cov, None, None, num_valid, trust_free=term.free,
                    ratio=self.clip_cov_ratio, lb=self.clip_cov_lb, ub=self.clip_cov_ub, generator=generator,
                )
                # weight 0 for the picked tokens' policy terms (counts for the normalisers stay unchanged)
                policy_m = m.clone()
                flat_m = policy_m.view(-1)
                flat_m.index_put_((index,), flat_m[index] * ~keep)
            else:
                index, keep = kl_cov_pick(cov, num_valid, fraction=self.kl_cov_frac)
                penalty = self.kl_cov_coef * log_ratio.reshape(-1)[index].abs() * keep
                per_token = per_token.expand(logp.shape).reshape(-1).index_add(0, index, penalty).view(logp.shape)
            with torch.no_grad():
                stats["cov/top_mean"] = top_fraction_mean(cov, num_valid)
                key = "cov/clipped_tokens" if self.cov_control == "clip_cov" else "cov/penalised_tokens"
                stats[key] = keep.sum().to(dtype)

        agg = dict(lengths=lengths, num_tokens=num_valid.clamp(min=1.0) if num_tokens is None else num_tokens,
                   num_seqs=num_seqs, norm_constant=self.norm_constant)
        policy_loss = aggregate(per_token, policy_m, self.aggregation, **agg)
        loss = policy_loss
        stats["loss/policy"] = policy_loss.detach()

        if "ref_logp" in masked:
            logp_m = diff + torch.where(valid, old_logp.detach().to(dtype), 0.0)  # logp at valid tokens
            if self.requires_ref_logp:
                kl_term = kl_estimate(logp_m, masked["ref_logp"], self.kl_estimator, clamp)
                kl_loss = self.kl_coef * aggregate(kl_term, m, self.aggregation, **agg)
                loss = loss + kl_loss
                stats["loss/kl_ref"] = kl_loss.detach()
                kl_term = kl_term.detach()
            else:
                kl_term = kl_estimate(logp_m.detach(), masked["ref_logp"], self.kl_estimator, clamp)
            stats["kl/ref"] = (kl_term * m).sum() / num_valid.clamp(min=1.0)

        if "entropy" in masked:
            ent = masked["entropy"]
            stats["entropy/mean"] = ent.detach().sum() / num_valid.clamp(min=1.0)
            if self.requires_entropy:
                coef = self.entropy_coef if entropy_coef is None else entropy_coef
                entropy_loss = -coef * aggregate(ent, m, self.aggregation, **agg)
                loss = loss + entropy_loss
                stats["loss/entropy"] = entropy_loss.detach()
                stats["entropy/coef"] = torch.as_tensor(coef, dtype=dtype, device=logp.device).detach().clone()

        with torch.no_grad():
            self._ratio_stats(stats, term, rho, rho_value, adv, diff, log_ratio, m, valid, lengths, num_valid,
                              credit, dtype)
        return loss, stats

    # ------------------------------------------------------------------ internals
    def _ratio_stats(self, stats, term, rho, rho_value, adv, diff, log_ratio, m, valid, lengths, num_valid,
                     credit, dtype) -> None:
        n = num_valid.clamp(min=1.0)
        if term.low is not None and rho_value.shape == rho.shape:
            low, high = term.low, term.high  # token levels: the flags the loss used
        else:
            lower, upper = clip_bounds(self.trust_region, self.eps_low, self.eps_high, self.eps_pos, self.eps_neg)
            low, high = clip_activity(rho_value, adv, self.trust_region, lower, upper)
        # Sequence levels with per-sequence advantages count per non-empty sequence, all else per token.
        per_sequence = low.shape[-1] == 1
        weight = (lengths > 0).to(dtype).unsqueeze(-1) if per_sequence else m  # (B, 1) or (B, T)
        count = weight.sum().clamp(min=1.0) if per_sequence else n
        values = rho_value if rho_value.shape == weight.shape else rho_value.expand_as(weight)
        # ratios are positive and ≤ e^{20}: masked min/max/mean need no select
        weighted = values * weight
        empty = weight.sum() == 0  # no valid token: report ratio 1
        stats["ratio/mean"] = torch.where(empty, 1.0, weighted.sum() / count)
        stats["ratio/max"] = torch.where(empty, 1.0, weighted.amax())
        stats["ratio/min"] = torch.where(empty, 1.0, weighted.add_(weight.sub(1.0).mul_(-1e30)).amin())
        stats["ratio/clamped_tokens"] = (log_ratio != diff).sum().to(dtype)
        if per_sequence:
            stats["clip/low_frac"] = (low * weight).sum() / count
            stats["clip/high_frac"] = (high * weight).sum() / count
        else:  # bool ands are far cheaper than float products
            stats["clip/low_frac"] = (low & valid).sum().to(dtype) / count
            stats["clip/high_frac"] = (high & valid).sum().to(dtype) / count
        stats["clip/region_frac"] = stats["clip/low_frac"] + stats["clip/high_frac"]
        if self.dual_clip:
            dual = (adv < 0) & (values > self.dual_clip_c)
            stats["clip/dual_frac"] = (dual * weight).sum() / count
        if term.phi is not None:
            phi = term.phi if term.phi.shape == weight.shape else term.phi.expand_as(weight)
            stats["ptrw/phi_mean"] = (phi * weight).sum() / count
        # k3 estimate of KL(π_old‖π_θ) = E_old[e^{−r} + r − 1]: exactly 0 at the masked zeros (exp(0) = 1)
        stats["kl/behaviour_k3"] = (torch.exp(-log_ratio).add_(log_ratio).sub_(1.0)).sum() / n
        if credit is not None:
            stats["credit/max"] = credit.amax()
        stats["tokens/valid"] = num_valid.detach().clone()

    def _check_inputs(self, logp, old_logp, advantages, mask, ref_logp, entropy, token_grad_norm, num_tokens,
                      num_seqs, entropy_coef) -> torch.Tensor:
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
        for name, x, needed in (
            ("ref_logp", ref_logp, self.requires_ref_logp),
            ("entropy", entropy, self.requires_entropy),
            ("token_grad_norm", token_grad_norm, self.requires_token_grad_norm),
        ):
            if x is None:
                if needed:
                    raise ValueError(f"{name} is required by this objective ({self._why(name)}); pass {name}=(B, T).")
            else:
                check_tensor_shape(name, x, shape, "(B, T)")
        if self.adaptive_entropy and entropy_coef is None:
            raise ValueError(
                "adaptive_entropy=True: pass entropy_coef=controller.coef "
                "(controller = objective.make_entropy_controller(), updated once per optimizer step)."
            )
        for name, x in (("num_tokens", num_tokens), ("num_seqs", num_seqs)):
            if isinstance(x, (int, float)) and not x > 0:
                raise ValueError(f"{name}={x!r} must be positive (the global count over the optimizer step).")
        return mask if mask.dtype == torch.bool else mask != 0

    def _check_values(self, diff, adv, masked, mask, valid, logp, old_logp, advantages) -> None:
        """One cheap reduction per tensor the call computes anyway, a single host sync, then a slow report.

        A sum is non-finite iff some element is (inf − inf gives NaN), barring overflow of a sum of
        finite values, which needs magnitudes near 1e38 / (B·T) that log-probs never reach.
        """
        with torch.no_grad():
            sums = [diff.detach().sum(), adv.sum()] + [x.detach().sum() for x in masked.values()]
            flags = [torch.isfinite(torch.stack(sums)).all()]
            if mask.dtype != torch.bool:
                flags.append(((mask == 0) | (mask == 1)).all())
            ok = torch.stack(flags).tolist()  # the one host sync of the call
        if all(ok):
            return
        if mask.dtype != torch.bool and not ok[-1]:
            report_bad_mask(mask)
        report_nonfinite(
            {"logp": logp, "old_logp": old_logp, "advantages": advantages, **masked}, valid
        )
        raise ValueError("logp − old_logp overflowed at a valid token; check the scale of the log-probs.")

    def _why(self, name: str) -> str:
        if name == "ref_logp":
            return f"kl_coef={self.kl_coef}"
        if name == "entropy":
            return f"entropy_coef={self.entropy_coef}, adaptive_entropy={self.adaptive_entropy}"
        return f"credit={self.credit!r}, grad_norm_mode={self.grad_norm_mode!r}"
