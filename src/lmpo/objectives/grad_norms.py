"""Per-token gradient norms ``g_t = ‖∇_θ log π(y_t)‖₂`` for the ``gradient_adaptive`` credit part.

These need the model, so the caller computes them (the trainer, the TRL adapter) and passes the result to
the objective as ``token_grad_norm``; the objective only reads it. Three modes:

- ``exact_grad_norm``: full-parameter per-token norms by autograd, one backward per token. For small
  models and for verifying the cheap modes; O(B·T) backward passes.
- ``lm_head_grad_norm``: exact over the output-embedding parameters only. For logits ``z = s·(W h + b)``,
  ``∇_W log softmax(z)_y = s·(e_y − p) hᵀ`` so ``‖·‖_F = s·‖e_y − p‖₂·‖h‖₂``, and the bias adds
  ``s·‖e_y − p‖₂``: ``g = s·‖e_y − p‖₂·sqrt(‖h‖² + 1[bias])``.
- ``logits_grad_norm``: ``‖e_y − p‖₂``, the norm of the gradient with respect to the logits.

``‖e_y − p‖² = 1 − 2p_y + Σ_v p_v²`` is computed in row chunks so that no float32 (B, T, V) tensor exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

GRAD_NORM_MODES = ("exact", "lm_head", "logits")


@torch.no_grad()
def _residual_sq_norm(logits: torch.Tensor, tokens: torch.Tensor, chunk_rows: int) -> torch.Tensor:
    """‖e_y − softmax(z)‖² per row of logits (N, V), computed in float32 chunks of ``chunk_rows`` rows."""
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], chunk_rows):
        z = logits[start : start + chunk_rows].float()  # (n, V)
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        p = torch.exp(z - lse)
        p_y = torch.exp(z.gather(-1, tokens[start : start + chunk_rows].unsqueeze(-1)) - lse).squeeze(-1)
        out[start : start + chunk_rows] = (1.0 - 2.0 * p_y + (p * p).sum(-1)).clamp(min=0.0)
    return out


def logits_grad_norm(logits: torch.Tensor, tokens: torch.Tensor, *, chunk_rows: int = 1024) -> torch.Tensor:
    """``‖∇_z log softmax(z)_y‖₂ = ‖e_y − p‖₂``.

    Args:
        logits: (B, T, V) the logits the log-probs were computed from; tokens: (B, T) sampled ids.
    Returns:
        (B, T) float32, detached.
    """
    batch, length, vocab = logits.shape
    sq = _residual_sq_norm(logits.detach().reshape(-1, vocab), tokens.reshape(-1), chunk_rows)
    return sq.sqrt().view(batch, length)


def lm_head_grad_norm(
    hidden: torch.Tensor,
    logits: torch.Tensor,
    tokens: torch.Tensor,
    head_has_bias: bool = False,
    *,
    logit_scale: float = 1.0,
    chunk_rows: int = 1024,
) -> torch.Tensor:
    """Per-token gradient norm of ``log π(y_t)`` over the output head's parameters (weight, and bias).

    Args:
        hidden: (B, T, H) the hidden states fed into the head (after the final norm).
        logits: (B, T, V) the logits the log-probs were computed from (``logit_scale·(W h + b)``, e.g.
            ``logit_scale = 1/temperature`` when sampling logits are divided by a temperature).
        tokens: (B, T) sampled token ids.
        head_has_bias: whether the head has a bias vector.
    Returns:
        (B, T) float32 ``|s|·‖e_y − p‖₂·sqrt(‖h‖₂² + 1[bias])``, detached.
    """
    batch, length, vocab = logits.shape
    sq = _residual_sq_norm(logits.detach().reshape(-1, vocab), tokens.reshape(-1), chunk_rows)
    h_sq = hidden.detach().float().pow(2).sum(-1).reshape(-1)
    if head_has_bias:
        h_sq = h_sq + 1.0
    return (abs(logit_scale) * (sq * h_sq).sqrt()).view(batch, length)


def exact_grad_norm(
    model: Callable[..., object],
    input_ids: torch.Tensor,
    response_length: int,
    *,
    attention_mask: torch.Tensor | None = None,
    parameters: Iterable[torch.nn.Parameter] | None = None,
    logit_scale: float = 1.0,
) -> torch.Tensor:
    """Full-parameter per-token gradient norms ``‖∇_θ log π(y_t)‖₂`` by autograd (verification helper).

    One backward pass per token: use it on small models, to check the ``lm_head``/``logits`` modes, or
    as ground truth in experiments; never in a large-scale training loop.

    Args:
        model: called as ``model(input_ids, attention_mask=attention_mask)``; returns logits (B, L, V) or
            an object with ``.logits`` (Hugging Face causal LMs).
        input_ids: (B, L) prompt followed by ``response_length`` response tokens.
        response_length: T, the number of trailing tokens whose log-probs are differentiated.
        parameters: the parameters to take the norm over (default: ``model.parameters()`` that require
            grad; required when ``model`` is a plain function wrapping the model).
    Returns:
        (B, T) float32 norms, detached.
    """
    if parameters is None:
        if not hasattr(model, "parameters"):
            raise TypeError(
                f"exact_grad_norm: model {model!r} has no .parameters(); pass parameters=model.parameters() "
                f"when `model` is a wrapper function."
            )
        parameters = model.parameters()
    params = [p for p in parameters if p.requires_grad]
    if not params:
        raise ValueError("exact_grad_norm found no parameters that require grad; pass `parameters=`.")
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    with torch.enable_grad():
        out = model(input_ids, **kwargs)
        logits = out if isinstance(out, torch.Tensor) else out.logits  # (B, L, V)
        length = input_ids.shape[1]
        logits = logits[:, length - response_length - 1 : length - 1].float() * logit_scale  # (B, T, V)
        targets = input_ids[:, length - response_length :]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
        norms = torch.zeros(logp.shape, dtype=torch.float32)
        for b in range(logp.shape[0]):
            for t in range(logp.shape[1]):
                grads = torch.autograd.grad(logp[b, t], params, retain_graph=True, allow_unused=True)
                sq = sum(g.float().pow(2).sum() for g in grads if g is not None)
                norms[b, t] = float(sq) ** 0.5
    return norms.to(input_ids.device)
