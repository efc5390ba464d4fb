"""Named presets: bundles of part choices, each overridable field by field. Data only.

``PRESETS`` is the single registry: ``Objective.preset(name, **overrides)`` builds one, the README/docs
preset tables are rendered from it (``lmpo.objectives.reference``), ``lmpo train --help`` lists it, and the
verl adapter registers one loss per entry. Adding a preset is one ``Preset`` in the list below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .objective import _PRESETS, PRESETS, Objective

# GSPO paper §5.1: sequence-level ratios sit much closer to 1, so the clip range is tiny.
GSPO_EPS_LOW = 3e-4
GSPO_EPS_HIGH = 4e-4


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    """One line: what the preset does and when to use it."""
    formula: str
    """The per-sequence/per-token objective in one line (plain text / unicode)."""
    paper: str
    """Source: paper (arXiv id), peer implementation, or the lmpo docs section for lmpo's own variants."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Objective keywords that differ from the Objective defaults."""

    def build(self, **overrides: Any) -> Objective:
        """``Objective.preset(self.name, **overrides)``."""
        return Objective.preset(self.name, **overrides)


_GSPO = {"level": "sequence", "eps_low": GSPO_EPS_LOW, "eps_high": GSPO_EPS_HIGH,
         "aggregation": "seq_mean_token_mean"}

_PRESET_LIST = [
    Preset(
        "grpo",
        "Token-level PPO clip with group-normalised advantages; each sequence weighted equally.",
        "−1/B Σ_i 1/|y_i| Σ_t min(w_t A_i, clip(w_t, 1±0.2) A_i),  w_t = π/π_old",
        "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300); TRL loss_type='grpo'",
        {"level": "token", "trust_region": "ppo", "eps_low": 0.2, "aggregation": "seq_mean_token_mean"},
    ),
    Preset(
        "dapo",
        "GRPO with decoupled clip-higher (ε_low 0.2, ε_high 0.28) and a token-level mean: long answers count per token.",
        "−1/N Σ_i Σ_t min(w_t A_i, clip(w_t, 1−0.2, 1+0.28) A_i)",
        "Yu et al. 2025, DAPO (arXiv 2503.14476); TRL loss_type='dapo'",
        {"level": "token", "trust_region": "clip_higher", "eps_low": 0.2, "eps_high": 0.28,
         "aggregation": "token_mean"},
    ),
    Preset(
        "dr_grpo",
        "GRPO without length or std normalisation: token sums divided by B·L, advantages not divided by std.",
        "−1/(B·L) Σ_i Σ_t min(w_t A_i, clip(w_t, 1±0.2) A_i),  A_i = r_i − mean_g r",
        "Liu et al. 2025, Dr. GRPO (arXiv 2503.20783); TRL loss_type='dr_grpo'",
        {"level": "token", "trust_region": "ppo", "eps_low": 0.2, "aggregation": "seq_sum_norm",
         "advantage_scale": "none"},
    ),
    Preset(
        "gspo",
        "Sequence-level ratio (geometric mean of token ratios) clipped at 3e-4/4e-4; stable for long outputs and MoE.",
        "−1/B Σ_i min(s_i A_i, clip(s_i, 1−3e-4, 1+4e-4) A_i),  s_i = exp(mean_t log w_t)",
        "Zheng et al. 2025, GSPO (arXiv 2507.18071); TRL importance_sampling_level='sequence'",
        dict(_GSPO),
    ),
    Preset(
        "gspo_token",
        "GSPO whose value is s_i but whose gradient is per token (s_i·∇logπ_t); allows token-level advantages.",
        "−1/B Σ_i 1/|y_i| Σ_t min(ŝ_t A_it, clip(ŝ_t, 1−3e-4, 1+4e-4) A_it),  ŝ_t = sg[s_i]·π_t/sg[π_t]",
        "Zheng et al. 2025, GSPO-token (arXiv 2507.18071)",
        {**_GSPO, "level": "sequence_token"},
    ),
    Preset(
        "amic",
        "Sequence weight = arithmetic mean of token ratios (≥ GSPO's geometric mean), clipped like GSPO.",
        "−1/B Σ_i min(s'_i A_i, clip(s'_i, 1−3e-4, 1+4e-4) A_i),  s'_i = mean_t w_t",
        "lmpo variant: arithmetic-mean importance correction (docs/objectives.md, AMIC)",
        {**_GSPO, "level": "sequence_arith"},
    ),
    Preset(
        "ema",
        "Token ratios smoothed by an EMA over the sequence (β 0.2) to damp token-level ratio noise; PPO clip.",
        "−1/B Σ_i 1/|y_i| Σ_t min(w'_t A_i, clip(w'_t, 1±0.2) A_i),  w'_t = 0.8 w'_{t−1} + 0.2 w_t",
        "lmpo variant: EMA-smoothed token weights (docs/objectives.md, token_ema)",
        {"level": "token_ema", "ema_beta": 0.2, "ema_grad": "local", "trust_region": "ppo", "eps_low": 0.2},
    ),
    Preset(
        "ptrw",
        "Soft Gaussian trust region φ(s') on the AMIC sequence weight instead of a hard clip.",
        "−1/B Σ_i φ(s'_i) s'_i A_i,  φ(s) = exp(−(s−1)²/(2·0.5²)),  s'_i = mean_t w_t",
        "lmpo variant: Gaussian trust-region weighting on AMIC weights (docs/objectives.md, PTRW)",
        {"level": "sequence_arith", "trust_region": "gaussian", "ptrw_sigma": 0.5, "ptrw_grad": "full",
         "aggregation": "seq_mean_token_mean"},
    ),
    Preset(
        "decay",
        "GSPO with temporal-decay token credit γ^{t−1} (normalised to Σ = |y|): early tokens get more credit.",
        "∇: −1/B Σ_i 1/|y_i| Σ_t s_i A_i d_t ∇logπ_t,  d_t ∝ 0.999^{t−1},  Σ_t d_t = |y_i|",
        "lmpo variant: temporal-decay credit on GSPO (docs/objectives.md, temporal_decay)",
        {**_GSPO, "credit": "temporal_decay", "decay_gamma": 0.999, "decay_normalize": True},
    ),
    Preset(
        "grad_adaptive",
        "GSPO with token credit |y|·softmax(g_t/τ) from per-token gradient norms (lm_head mode by default).",
        "∇: −1/B Σ_i 1/|y_i| Σ_t s_i A_i c_t ∇logπ_t,  c_t = |y_i| softmax_t(‖∇logπ_t‖/τ)",
        "lmpo variant: gradient-adaptive credit on GSPO (docs/objectives.md, gradient_adaptive)",
        {**_GSPO, "credit": "gradient_adaptive", "grad_tau": 1.0, "grad_norm_mode": "lm_head"},
    ),
    Preset(
        "asym",
        "Sign-asymmetric clip: ε_pos 0.28 for A > 0 (bolder on successes), ε_neg 0.2 for A < 0.",
        "−1/B Σ_i 1/|y_i| Σ_t min(w_t A_i, clip(w_t, 1±ε(A_i)) A_i),  ε = 0.28 if A > 0 else 0.2",
        "lmpo variant: sign-asymmetric clipping (docs/objectives.md, sign_asym)",
        {"level": "token", "trust_region": "sign_asym", "eps_pos": 0.28, "eps_neg": 0.2},
    ),
    Preset(
        "clip_cov",
        "PPO clip plus Clip-Cov: zero the loss of max(1, ⌊2e-4·N⌋) random tokens with covariance in (1, 5) to slow entropy collapse.",
        "−1/N Σ_t (1 − 1[t ∈ I_clip]) min(w_t A_t, clip(w_t, 1±0.2) A_t),  I_clip: K of {t: 1 < cov_t < 5}, each w.p. K/C (systematic)",
        "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)",
        {"level": "token", "trust_region": "ppo", "eps_low": 0.2, "aggregation": "token_mean",
         "cov_control": "clip_cov"},
    ),
    Preset(
        "kl_cov",
        "Unclipped policy gradient plus |logp − old_logp| on the top 0.2 % covariance tokens (inert on-policy).",
        "−1/N Σ_t [w_t A_t − 1[t ∈ top-k cov]·|log w_t|],  k = 2e-3·N",
        "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)",
        {"level": "token", "trust_region": "none", "aggregation": "token_mean", "cov_control": "kl_cov",
         "kl_cov_frac": 2e-3, "kl_cov_coef": 1.0},
    ),
    Preset(
        "cispo",
        "Clipped, detached IS weight times A·log π: every token keeps its gradient (no token is dropped by a clip); weight capped at 5.",
        "−1/N Σ_i Σ_t sg(min(w_t, 5))·A_i·log π_t",
        "MiniMax 2025, MiniMax-M1 (arXiv 2506.13585); cap 5 from ScaleRL (arXiv 2510.13786); verl cispo; TRL loss_type='cispo'",
        {"level": "token", "trust_region": "cispo", "eps_high": 4.0, "aggregation": "token_mean"},
    ),
    Preset(
        "sapo",
        "Soft sigmoid gate instead of a hard clip, temperature 1.0 for A > 0 and 1.05 for A ≤ 0.",
        "−1/B Σ_i 1/|y_i| Σ_t σ(τ(w_t − 1))·4/τ·A_i,  τ = 1 if A_i > 0 else 1.05",
        "SAPO (arXiv 2511.20347); verl sapo; TRL loss_type='sapo'",
        {"level": "token", "trust_region": "sapo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05,
         "aggregation": "seq_mean_token_mean"},
    ),
    Preset(
        "gmpo",
        "Geometric mean of token ratios, each clipped in log space to ±0.4 in the direction its advantage pushes it.",
        "−1/B Σ_i A_i·exp(mean_t clip_sgn(A_i)(log w_t, −0.4, 0.4))",
        "GMPO (arXiv 2507.20673); verl loss_mode='geo_mean'",
        {"level": "sequence_clipped", "log_clip_low": 0.4, "log_clip_high": 0.4, "trust_region": "none",
         "aggregation": "seq_mean_token_mean"},
    ),
    Preset(
        "vespo",
        "Detached Gamma weight φ(w) = e^λ w^k e^{−λw} of the whole sequence ratio w = Π_t w_t times A·log π; soft, asymmetric.",
        "−1/N Σ_i Σ_t sg(φ(W_i))·A_i·log π_t,  W_i = Π_t w_t,  (k, λ) = (2, 3) if A_i ≥ 0 else (3, 2)",
        "VESPO (arXiv 2602.10693); TRL loss_type='vespo'",
        {"level": "token", "trust_region": "vespo", "aggregation": "token_mean"},
    ),
    Preset(
        "luspo",
        "GSPO with per-sequence token sums instead of token means: each sequence's term is scaled by its length.",
        "−1/B Σ_i |y_i|·min(s_i A_i, clip(s_i, 1−3e-4, 1+4e-4) A_i),  s_i = exp(mean_t log w_t)",
        "LUSPO (arXiv 2602.05261); TRL loss_type='luspo'",
        {**_GSPO, "aggregation": "seq_mean_token_sum"},
    ),
    Preset(
        "dppo_tv",
        "Trust region in probability space: mask tokens whose probability moved by more than 0.2 in A's direction; detached min(w, 20)·A·log π.",
        "−1/N Σ_i Σ_t sg(min(w_t, 20))·A_i·log π_t·1[±(π_t − π_old,t) ≤ 0.2]",
        "DPPO (arXiv 2602.04879), Binary-TV; verl loss_mode='dppo_tv'",
        {"level": "token", "trust_region": "dppo_tv", "dppo_low": 0.2, "dppo_high": 0.2, "dppo_is_cap": 20.0,
         "aggregation": "token_mean"},
    ),
    Preset(
        "dppo_kl",
        "DPPO with a binary-KL budget (0.2) on each token's probability instead of a TV budget.",
        "−1/N Σ_i Σ_t sg(min(w_t, 20))·A_i·log π_t·1[D_bin(π_old,t‖π_t) ≤ 0.2 or π moved against A]",
        "DPPO (arXiv 2602.04879), Binary-KL; verl loss_mode='dppo_kl'",
        {"level": "token", "trust_region": "dppo_kl", "dppo_low": 0.2, "dppo_high": 0.2, "dppo_is_cap": 20.0,
         "aggregation": "token_mean"},
    ),
    Preset(
        "dro",
        "Policy gradient with a quadratic log-ratio penalty ½β(log π − log π_old)², β = 0.1, instead of a clip.",
        "−1/N Σ_i Σ_t [A_i·log π_t − ½·0.1·(log π_t − log π_old,t)²]",
        "Richemond et al. 2024, DRO (arXiv 2405.19107); verl loss_mode='dro'",
        {"level": "token", "trust_region": "dro", "dro_beta": 0.1, "aggregation": "token_mean"},
    ),
    Preset(
        "adaptive_entropy",
        "Token-mean PPO with the Skywork-OR1 adaptive entropy bonus (target 0.2, step 0.005); needs entropies.",
        "−1/N Σ_t min(w_t A_t, clip(w_t, 1±0.2) A_t) − c_k·1[e_k ≤ 0.2]·H̄,  c_{k+1} = clip(c_k ± 0.005, 0, 1)",
        "He et al. 2025, Skywork-OR1 (arXiv 2505.22312)",
        {"level": "token", "trust_region": "ppo", "eps_low": 0.2, "aggregation": "token_mean",
         "adaptive_entropy": True, "entropy_target": 0.2, "entropy_delta": 0.005},
    ),
]

for _preset in _PRESET_LIST:
    if _preset.name in PRESETS:
        raise ValueError(f"preset {_preset.name!r} is defined twice")
    _PRESETS[_preset.name] = _preset

