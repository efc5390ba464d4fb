"""Per-token log-probabilities and entropies without a float32 ``(B, T, V)`` log-softmax.

A naive ``logits.float().log_softmax(-1).gather(-1, index)`` writes a full ``(B, T, V)`` float32 tensor in
the forward pass and two more in the backward pass (the scattered gradient and the softmax gradient): at
``B·T = 8·1024`` and a Qwen-size ``V = 152k`` that is 5 GB each. Here rows are processed in chunks of
``chunk_rows``: the forward keeps only ``(N,)`` outputs, the backward recomputes each chunk's softmax and
writes its gradient straight into the one ``(N, V)`` gradient buffer autograd needs anyway — or, with
``inplace_backward``, into the logits' own storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from lmpo.objectives.grad_norms import GRAD_NORM_MODES, exact_grad_norm, lm_head_grad_norm, logits_grad_norm

# Elements per block (64 MB per float32 work buffer, at most three of them alive): large enough that the
# per-block fixed costs (kernel launches, thread fork/join, which are expensive on a busy CPU) vanish,
# small next to the (B, T, V) tensors that are avoided (4 GB float32 at 8×1024×128k).
_CHUNK_ELEMENTS = 1 << 24
# The fused head keeps four float32 blocks alive (logits, log-probs, probabilities, gradient): smaller blocks.
_FUSED_CHUNK_ELEMENTS = 1 << 23
# On a GPU, 8× larger blocks (~440 rows at V = 152k, ~1 GB of float32 work buffers): matrix products of a few
# dozen rows leave a GPU's tensor cores idle. Measured on an H100 (1.5B Qwen2 update, 8 × 1,024 tokens): 272 ms
# per update with these blocks, 352 ms with 2× the CPU's; the peak memory of a 0.5B step on 8 × 4,096 tokens
# was the same with either (3.06 GiB above the weights: the checkpointed activations and gradients set it).
_FUSED_CHUNK_ELEMENTS_CUDA = 1 << 26


def _chunk_rows(num_rows: int, vocab: int, chunk_rows: int | None) -> int:
    if chunk_rows is None:
        chunk_rows = max(1, _CHUNK_ELEMENTS // max(1, vocab))
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
    return min(chunk_rows, max(1, num_rows))


def _blocks(batch: int, length: int, chunk_rows: int):
    """(batch slice, time slice) pairs covering a (B, T) grid with about ``chunk_rows`` rows each.

    Whole sequences are grouped when ``chunk_rows >= T``, otherwise each sequence is cut along time: a
    block is then always a plain strided view of the (B, T, V) logits, even when those are a slice such
    as ``out.logits[:, :-1]`` that cannot be flattened to (B·T, V) without a copy.
    """
    if chunk_rows >= length:
        step = chunk_rows // length
        for b in range(0, batch, step):
            yield slice(b, min(b + step, batch)), slice(0, length)
    else:
        for b in range(batch):
            for t in range(0, length, chunk_rows):
                yield slice(b, b + 1), slice(t, min(t + chunk_rows, length))


class _Scratch:
    """Reusable (rows, V) work buffers for the blocks of one call.

    A fresh tens-of-MB temporary per block is returned to the OS and faulted back in at the next block (glibc
    serves such sizes with mmap): on CPU that page-fault traffic cost more than the arithmetic. Views of
    a few buffers allocated once per call avoid it.
    """

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rows, self.vocab, self.dtype, self.device = rows, vocab, dtype, device
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: torch.Size) -> torch.Tensor:
        if name not in self.buffers:
            self.buffers[name] = torch.empty(self.rows * self.vocab, dtype=self.dtype, device=self.device)
        return self.buffers[name][: shape.numel()].view(shape)

    def as_compute(self, block: torch.Tensor, inv_temperature: float) -> torch.Tensor:
        """``block.to(dtype) * inv_temperature`` in a buffer (``block`` itself when already right)."""
        if block.dtype == self.dtype and inv_temperature == 1.0:
            return block
        z = self.get("z", block.shape).copy_(block)
        return z.mul_(inv_temperature) if inv_temperature != 1.0 else z


def _max_block_rows(batch: int, length: int, chunk_rows: int) -> int:
    return (chunk_rows // length) * length if chunk_rows >= length else chunk_rows


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _TokenLogprobEntropy(torch.autograd.Function):
    """Rows ``z`` (N, V) of logits scaled by ``1/τ``; returns ``log p(index)`` (N,) and entropy ``H`` (N,).

    Forward:  log p = log_softmax(z),  logp = log p[index],  H = −Σ_v p_v log p_v.
    Backward: ∂logp/∂z = onehot(index) − p,   ∂H/∂z = −p ⊙ (log p + H),  both times 1/τ for the logits.

    Each chunk goes through PyTorch's fused ``log_softmax`` / ``softmax`` kernels (one read of the chunk
    instead of the several passes of ``logsumexp``), and nothing of size (N, V) is kept between the passes:
    the backward recomputes ``p`` chunk by chunk from the saved logits. With ``inplace`` the backward writes
    the gradient into the logits' own storage instead of a new ``(N, V)`` buffer (the memory trick of
    Liger-Kernel's fused cross-entropy).
    """

    @staticmethod
    def forward(
        ctx, logits, index, inv_temperature: float, with_entropy: bool, chunk_rows: int, inplace: bool
    ):
        batch, length, vocab = logits.shape  # (B, T, V), any strides with a contiguous V dim
        dtype = _compute_dtype(logits.dtype)
        logp = torch.empty(batch, length, dtype=dtype, device=logits.device)
        entropy = torch.empty(batch, length, dtype=dtype, device=logits.device) if with_entropy else None
        scratch = _Scratch(_max_block_rows(batch, length, chunk_rows), vocab, dtype, logits.device)
        for bs, ts in _blocks(batch, length, chunk_rows):
            z = scratch.as_compute(logits[bs, ts], inv_temperature)  # (b, t, V) in float32
            logp_all = torch._log_softmax(z, -1, False, out=scratch.get("logp", z.shape))  # (b, t, V)
            logp[bs, ts] = logp_all.gather(-1, index[bs, ts].unsqueeze(-1)).squeeze(-1)
            if with_entropy:
                p_logp = torch.exp(logp_all, out=scratch.get("p", z.shape)).mul_(logp_all)
                entropy[bs, ts] = -p_logp.sum(-1)
        ctx.save_for_backward(logits, index, entropy if with_entropy else logp)
        # an output nobody differentiates (entropies that are only reported) then arrives as None in backward,
        # not as zeros, and the backward keeps the fast path that ignores it
        ctx.set_materialize_grads(False)
        ctx.inv_temperature = inv_temperature
        ctx.with_entropy = with_entropy
        ctx.chunk_rows = chunk_rows
        ctx.inplace = inplace
        return (logp, entropy) if with_entropy else (logp, logp.new_zeros(0))

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, index, entropy = ctx.saved_tensors
        inv_t = ctx.inv_temperature
        dtype = _compute_dtype(logits.dtype)
        batch, length, _ = logits.shape
        # In place: each block's gradient overwrites the block of logits it was computed from (read first).
        # (A detached alias, not ``logits`` itself: autograd copies a gradient that *is* the leaf it is for.)
        grad = (
            logits.detach()
            if ctx.inplace
            else torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        )
        use_entropy = ctx.with_entropy and grad_entropy is not None
        if grad_logp is None:
            grad_logp = torch.zeros(batch, length, dtype=dtype, device=logits.device)
        fused_ok = logits.device.type in ("cpu", "cuda")  # softmax kernels known to allow out == input
        low_precision = logits.dtype != dtype  # bf16 / fp16 logits
        scratch = _Scratch(
            _max_block_rows(batch, length, ctx.chunk_rows), logits.shape[-1], dtype, logits.device
        )
        for bs, ts in _blocks(batch, length, ctx.chunk_rows):
            # 1/τ folded into the upstream gradients: saves a pass over the block
            g_lp = grad_logp[bs, ts].unsqueeze(-1).to(dtype) * inv_t  # (b, t, 1)
            idx = index[bs, ts].unsqueeze(-1)  # (b, t, 1)
            target = grad[bs, ts]  # (b, t, V)
            fused = fused_ok and target.is_contiguous() and not use_entropy
            if fused and low_precision and inv_t == 1.0:
                # bf16/fp16 logits: their gradient is stored in that dtype anyway, so the softmax is taken
                # by the low-precision kernel (float32 accumulation inside) straight into the buffer; a
                # float32 round trip would cost two extra passes and keep no extra precision. Not with
                # τ ≠ 1: scaling the logits in bf16 would perturb them before the exponential.
                g_low = g_lp.to(target.dtype)
                torch._softmax(logits[bs, ts], -1, False, out=target)
                target.mul_(-g_low).scatter_add_(-1, idx, g_low)
                continue
            z = scratch.as_compute(logits[bs, ts], inv_t)  # (b, t, V) in float32
            if use_entropy:
                logp_all = torch._log_softmax(z, -1, False, out=scratch.get("logp", z.shape))  # (b, t, V)
                p = torch.exp(logp_all, out=scratch.get("p", z.shape))
                g_h = grad_entropy[bs, ts].unsqueeze(-1).to(dtype) * inv_t
                # g_H · (−p ⊙ (log p + H))  −  g_logp · p, in place in logp_all
                block_grad = logp_all.add_(entropy[bs, ts].unsqueeze(-1)).mul_(p).mul_(-g_h)
                block_grad.sub_(p.mul_(g_lp)).scatter_add_(-1, idx, g_lp)
                target.copy_(block_grad)
            elif fused and not low_precision:
                # softmax written straight into the gradient buffer (no block temporary, no copy). When
                # in place with τ = 1, ``z`` *is* ``target``: these row-wise kernels read a row before
                # writing it, so the exact aliasing is safe on CPU and CUDA (tested against the naive form).
                torch._softmax(z, -1, False, out=target)
                target.mul_(-g_lp).scatter_add_(-1, idx, g_lp)
            else:
                block_grad = torch._softmax(z, -1, False, out=scratch.get("p", z.shape)).mul_(-g_lp)
                block_grad.scatter_add_(-1, idx, g_lp)
                target.copy_(block_grad)
        return grad, None, None, None, None, None


def _as_3d(logits: torch.Tensor, index: torch.Tensor | None):
    """(..., T, V) logits -> a (B, T, V) view (no copy for a (B, T, V) slice) and a (B, T) long index."""
    if logits.dim() < 2:
        raise ValueError(f"logits must have shape (..., V), got {tuple(logits.shape)}")
    lead = logits.shape[:-1]
    if index is not None and index.shape != lead:
        raise ValueError(
            f"index shape {tuple(index.shape)} must equal logits shape without the vocabulary dim {tuple(lead)}"
        )
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if logits.dim() == 2:
        logits3 = logits.unsqueeze(0)
    elif logits.dim() == 3:
        logits3 = logits
    else:
        logits3 = logits.reshape(-1, *logits.shape[-2:])
    index3 = index.reshape(logits3.shape[:2]).long() if index is not None else None
    return lead, logits3, index3


def selective_log_softmax(
    logits: torch.Tensor,
    index: torch.Tensor,
    chunk_rows: int | None = None,
    temperature: float = 1.0,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """Log-probabilities of the chosen tokens, ``log softmax(logits / τ)[index]``, chunked over rows.

    Equivalent to (but never materialising the float32 ``(B, T, V)`` tensor of)::

        torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)

    Args:
        logits: (B, T, V) (any leading dims), float32, bfloat16 or float16; computed in float32
            (float64 stays float64).
        index: (B, T) token ids.
        chunk_rows: rows per block; the default keeps each float32 work buffer at 64 MB.
        temperature: τ > 0, the sampling temperature the tokens were drawn with.
        inplace_backward: write the gradient into ``logits``' storage during backward instead of allocating
            a new ``(B, T, V)`` buffer. Only for logits that nothing else reads after the backward pass (the
            output of ``lm_head``, whose own backward needs its input and weight, not its output); another
            autograd node that saved the same tensor fails loudly (version counter), it is never silent.
    Returns:
        (B, T) float32 (float64 for float64 logits); differentiable with respect to ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 for log-probabilities")
    lead, logits3, index3 = _as_3d(logits, index)
    rows = _chunk_rows(lead.numel(), logits.shape[-1], chunk_rows)
    logp, _ = _TokenLogprobEntropy.apply(logits3, index3, 1.0 / temperature, False, rows, inplace_backward)
    return logp.view(lead)


def selective_log_softmax_with_entropy(
    logits: torch.Tensor,
    index: torch.Tensor,
    chunk_rows: int | None = None,
    temperature: float = 1.0,
    inplace_backward: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(selective_log_softmax(...), chunked_entropy(...))`` in one pass over the logits; shapes (B, T).

    Both outputs are differentiable; ``inplace_backward`` as for ``selective_log_softmax``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 for log-probabilities")
    lead, logits3, index3 = _as_3d(logits, index)
    rows = _chunk_rows(lead.numel(), logits.shape[-1], chunk_rows)
    logp, entropy = _TokenLogprobEntropy.apply(
        logits3, index3, 1.0 / temperature, True, rows, inplace_backward
    )
    return logp.view(lead), entropy.view(lead)


def chunked_entropy(
    logits: torch.Tensor, chunk_rows: int | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy of ``softmax(logits / τ)`` per position, chunked over rows.

    Equivalent to::

        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        -(logp.exp() * logp).sum(-1)

    Args:
        logits: (B, T, V). Returns: (B, T) float32, differentiable (∂H/∂z = −p ⊙ (log p + H) / τ).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    lead, logits3, _ = _as_3d(logits, None)
    rows = _chunk_rows(lead.numel(), logits.shape[-1], chunk_rows)
    dummy_index = torch.zeros(logits3.shape[:2], dtype=torch.long, device=logits.device)
    _, entropy = _TokenLogprobEntropy.apply(logits3, dummy_index, 1.0 / temperature, True, rows, False)
    return entropy.view(lead)


class _HeadLogprobEntropy(torch.autograd.Function):
    """Rows ``h`` (N, H) of hidden states through a linear head ``W`` (V, H), bias ``b`` (V,) or None, to
    ``log p(index)`` (N,) and entropy (N,) of ``softmax(z)``, ``z = (h Wᵀ + b) / τ`` — without the (N, V) logits.

    Forward and backward compute ``z`` block by block (``chunk_rows`` rows, float32) and drop it:
    ``∂ℓ/∂z = g_logp·(onehot(index) − p) + g_H·(−p ⊙ (log p + H))``, then ``∂ℓ/∂h = (∂ℓ/∂z / τ) W``,
    ``∂ℓ/∂W = Σ_rows (∂ℓ/∂z / τ)ᵀ h`` (accumulated in float32), ``∂ℓ/∂b = Σ_rows ∂ℓ/∂z / τ``. Memory: one
    block of logits and the (V, H) weight gradient that any backward through the head allocates.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, inv_temperature: float, with_entropy: bool, chunk_rows: int):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32) if with_entropy else None
        for s in range(0, n, chunk_rows):
            z = _head_block(hidden[s:s + chunk_rows], weight, bias, inv_temperature)  # (b, V) float32
            logp_all = z.log_softmax(-1)
            logp[s:s + chunk_rows] = logp_all.gather(-1, index[s:s + chunk_rows, None]).squeeze(-1)
            if with_entropy:
                entropy[s:s + chunk_rows] = -(logp_all.exp() * logp_all).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, index, entropy)
        ctx.inv_temperature, ctx.with_entropy, ctx.chunk_rows = inv_temperature, with_entropy, chunk_rows
        return logp, entropy if with_entropy else logp.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, index, entropy = ctx.saved_tensors
        inv_t, n = ctx.inv_temperature, hidden.shape[0]
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if (
            bias is not None and ctx.needs_input_grad[2]) else None
        # bf16/fp16 weights on a GPU: each block's weight-gradient product on the tensor cores (float32
        # accumulation inside, rounded to the weight's dtype once per block, summed in float32). A float32
        # product would run on the GPU's float32 units at a fraction of the speed, for precision that the
        # weight's own dtype then drops.
        low_precision = weight.is_cuda and weight.dtype in (torch.bfloat16, torch.float16)
        use_entropy = ctx.with_entropy and grad_entropy is not None
        for s in range(0, n, ctx.chunk_rows):
            rows = slice(s, s + ctx.chunk_rows)
            h = hidden[rows]
            logp_all = _head_block(h, weight, bias, inv_t).log_softmax(-1)  # (b, V)
            p = logp_all.exp()
            g_lp = (grad_logp[rows] if grad_logp is not None else torch.zeros_like(p[:, 0]))[:, None].float()
            g_z = p.mul(-g_lp)  # (b, V)
            if use_entropy:
                g_z.sub_(logp_all.add_(entropy[rows, None]).mul_(p).mul_(grad_entropy[rows, None].float()))
            g_z.scatter_add_(-1, index[rows, None], g_lp).mul_(inv_t)
            if grad_h is not None:
                grad_h[rows] = (g_z.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None and low_precision:
                grad_w.add_(torch.mm(g_z.t().to(weight.dtype), h.to(weight.dtype)))
            elif grad_w is not None:
                grad_w.addmm_(g_z.t(), h.float())
            if grad_b is not None:
                grad_b.add_(g_z.sum(0))
        return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
                grad_b.to(bias.dtype) if grad_b is not None else None, None, None, None, None)


def _head_block(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inv_t: float) -> torch.Tensor:
    """(b, H) hidden rows -> (b, V) float32 logits ``(h Wᵀ + b) / τ``."""
    z = torch.nn.functional.linear(h, weight, bias).float()
    return z.mul_(inv_t) if inv_t != 1.0 else z


def head_log_softmax(
    hidden: torch.Tensor,
    head: nn.Linear,
    index: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``index`` under ``softmax(head(hidden) / τ)``, never forming the logits.

    Equivalent to ``selective_log_softmax(head(hidden), index, temperature=τ)`` (plus ``chunked_entropy``),
    with the (B, T, V) logits — and their gradient — replaced by one (chunk_rows, V) float32 block at a time.

    Args:
        hidden: (B, T, H) inputs of the head; index: (B, T) token ids; head: a plain ``nn.Linear`` (V, H).
    Returns:
        (B, T) float32 log-probs and (B, T) entropies (None unless asked for); differentiable w.r.t.
        ``hidden`` and the head's parameters.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 for log-probabilities")
    lead = hidden.shape[:-1]
    if index.shape != lead:
        raise ValueError(f"index shape {tuple(index.shape)} must equal hidden shape without its last dim {tuple(lead)}")
    if chunk_rows is None:
        elements = _FUSED_CHUNK_ELEMENTS_CUDA if hidden.is_cuda else _FUSED_CHUNK_ELEMENTS
        chunk_rows = max(1, elements // head.out_features)
    rows = _chunk_rows(lead.numel(), head.out_features, chunk_rows)
    logp, entropy = _HeadLogprobEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), head.weight, head.bias,
                                              index.reshape(-1).long(), 1.0 / temperature, with_entropy, rows)
    return logp.view(lead), entropy.view(lead) if with_entropy else None


# Logits bigger than this (float32 bytes) go through the fused head (``head_log_softmax``) when the model allows.
_FUSED_HEAD_MIN_BYTES = 1 << 30
# On a GPU the fused head costs time (it recomputes the head's product in the backward pass): measured on an H100,
# a 1.5B update on 8 × 1,024 tokens (4.3 GB of float32 logits) took 272 ms fused and 234 ms with the logits
# materialised. There, only logits beyond 8 GiB go through it.
_FUSED_HEAD_MIN_BYTES_CUDA = 8 << 30
# Config attributes of models whose logits are not the head's plain output (softcapping, scaling).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def fused_head_applies(model: nn.Module, rows: int, vocab: int | None = None) -> bool:
    """True when the model's logits are a plain ``nn.Linear`` of its last hidden state and ``rows`` rows of
    float32 logits would take more than 1 GiB (8 GiB on a GPU): then the fused head saves that memory."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not nn.Linear or not hasattr(model, "get_decoder"):
        return False
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    threshold = _FUSED_HEAD_MIN_BYTES_CUDA if head.weight.is_cuda else _FUSED_HEAD_MIN_BYTES
    return rows * (vocab or head.out_features) * 4 > threshold


def avoid_cudnn_attention() -> bool:
    """Switch PyTorch's cuDNN attention kernel off for this process (on a machine with CUDA); True if it did.

    Measured on an H100 (torch 2.11, CUDA 13): under bfloat16 autocast, a left-padded batch — query rows at
    padding positions, whose keys are all masked — got NaN gradients from the cuDNN kernel's backward, while
    the memory-efficient and math kernels gave finite gradients that match float32's within bf16 rounding.
    Rollouts are left-padded, so the trainer calls this on CUDA. A process-wide switch rather than a
    ``sdpa_kernel`` context: gradient checkpointing re-runs the forward during the backward pass, outside any
    context the forward ran in.
    """
    if not torch.cuda.is_available():
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions that count only real tokens, so a left-padded prompt starts at position 0.

    ``cumsum(mask) − 1`` clamped at 0 (pad positions get 0; they are masked out of attention anyway).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


@dataclass
class SequenceLogprobs:
    """Output of ``sequence_logprobs``; every tensor covers the T response positions only.

    logprobs: (B, T) float32 log π(y_t | x, y_<t), differentiable when the model is.
    entropy:  (B, T) float32 entropy of π(· | x, y_<t), or None when not asked for.
    hidden:   (B, T, H) final hidden states feeding ``lm_head`` at the positions that predict the response
              tokens (for lm_head gradient norms), or None when not asked for.
    logits:   (B, T, V) ``logits / τ`` at those positions, detached (for gradient norms), or None.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    return_hidden: bool = False,
    chunk_rows: int | None = None,
    return_logits: bool = False,
    fused_head: bool | None = None,
) -> SequenceLogprobs:
    """Run a causal LM over ``prompt ‖ response`` and return log-probs of the response tokens only.

    Args:
        model: a Hugging Face causal LM (``AutoModelForCausalLM``, PEFT-wrapped ok).
        input_ids: (B, L) left-padded prompts followed by right-padded responses; L = P + T.
        attention_mask: (B, L) 1 for real tokens (prompt and response up to and including EOS).
        response_length: T, the number of final positions that are response tokens.
        temperature: τ used when sampling; log-probs are of softmax(logits / τ).
        with_entropy: also return per-position entropies (one extra pass over each chunk).
        return_hidden: also return the inputs of ``lm_head`` at the T predicting positions.
        return_logits: also return the scaled logits at those positions (detached).
        fused_head: take the log-probs from the decoder's hidden states through ``head_log_softmax`` (no
            (B, T, V) logits at all); None = when ``fused_head_applies`` (logits over 1 GiB). Not with
            ``return_hidden`` / ``return_logits``.
    Returns:
        ``SequenceLogprobs``; values at response padding positions are finite but meaningless (mask them).

    Only the logits of the T + 1 last positions are computed (``logits_to_keep``), position ids come
    from the attention mask so that left padding does not shift the prompt's positions, and the backward
    pass writes the logits' gradient into their own storage (``inplace_backward``).
    """
    batch, length = input_ids.shape
    if not 1 <= response_length < length:
        raise ValueError(f"response_length={response_length} must be in [1, {length - 1}] for L={length}")
    if fused_head is None:
        fused_head = not (return_hidden or return_logits) and fused_head_applies(model, batch * response_length)
    if fused_head:
        if return_hidden or return_logits:
            raise ValueError("fused_head=True computes no logits: return_hidden / return_logits need fused_head=False")
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                     position_ids=position_ids_from_mask(attention_mask),
                                     use_cache=False).last_hidden_state[:, -(response_length + 1):-1]  # (B, T, H)
        logprobs, entropy = head_log_softmax(hidden, model.get_output_embeddings(), input_ids[:, -response_length:],
                                             temperature, with_entropy, chunk_rows)
        return SequenceLogprobs(logprobs=logprobs, entropy=entropy)
    captured: dict[str, torch.Tensor] = {}
    handle = None
    if return_hidden:  # only the head's input, not every layer's hidden states (output_hidden_states)
        head = model.get_output_embeddings()
        handle = head.register_forward_hook(lambda mod, inp, out: captured.__setitem__("h", inp[0]))
    try:
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            logits_to_keep=response_length + 1,
            use_cache=False,
        )
    finally:
        if handle is not None:
            handle.remove()
    # The logit at position i predicts token i + 1: positions L−T−1 … L−2 score tokens L−T … L−1. The
    # (B, T+1, V) logits are used whole, with a dummy target for the last position (dropped below),
    # because slicing off that position would make reshape copy all B·T·V logits (and the slice's
    # backward allocate a zero-padded full-size gradient, undoing the in-place one).
    logits = outputs.logits  # (B, T+1, V), produced for us alone: safe to overwrite in backward
    targets = torch.cat([input_ids[:, -response_length:], input_ids[:, -1:]], dim=1)  # (B, T+1)
    logprobs, entropy = token_logprobs(logits, targets, temperature, with_entropy, chunk_rows)
    hidden = captured["h"][:, -(response_length + 1) : -1, :] if return_hidden else None  # (B, T, H)
    scaled = logits.detach()[:, :-1] / temperature if return_logits else None
    return SequenceLogprobs(
        logprobs=logprobs[:, :-1],
        entropy=entropy[:, :-1] if entropy is not None else None,
        hidden=hidden,
        logits=scaled,
    )


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool, chunk_rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T, V) logits made for this call alone -> log-probs (B, T) and entropies (B, T) or None.

    The backward pass overwrites ``logits`` with their gradient (``inplace_backward``): never pass logits
    that something else reads afterwards.
    """
    if with_entropy:
        return selective_log_softmax_with_entropy(logits, targets, chunk_rows, temperature, inplace_backward=True)
    return selective_log_softmax(logits, targets, chunk_rows, temperature, inplace_backward=True), None


def shared_prefix_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int, group_size: int,
    hidden: bool = False,
) -> torch.Tensor | None:
    """Completion logits (B, T, V) computing each group's shared prompt once instead of G times (with
    ``hidden``: the head's inputs (B, T, H) instead, run through the decoder alone).

    The G = ``group_size`` completions of a prompt are rows ``i·G … i·G+G−1`` with identical prompt tokens.
    The prompt is run once per group with the KV cache on (and its autograd graph kept), the cache is
    repeated G times along the batch, and the completions run on top of it: the same logits as the plain
    forward (up to float rounding of the attention kernels) for about (N·P + B·T) / (B·(P+T)) of its
    compute. Returns None (the caller runs the plain forward) when the rows are not whole groups of one
    prompt, or when gradient checkpointing is active (it drops the cache in training mode).
    """
    G, T = group_size, response_length
    B, L = input_ids.shape
    P = L - T
    if G < 2 or B % G or P < 1 or T < 2:
        return None
    if model.training and getattr(model, "is_gradient_checkpointing", False):
        return None
    N = B // G
    prompt, prompt_mask = input_ids[::G, :P], attention_mask[::G, :P]  # (N, P)
    same = torch.equal(input_ids[:, :P].view(N, G, P), prompt.unsqueeze(1).expand(N, G, P)) and torch.equal(
        attention_mask[:, :P].view(N, G, P), prompt_mask.unsqueeze(1).expand(N, G, P))
    if not same:
        return None
    positions = position_ids_from_mask(attention_mask)  # (B, L)
    net, key = (model.get_decoder(), "last_hidden_state") if hidden else (model, "logits")
    out_p = net(input_ids=prompt, attention_mask=prompt_mask, position_ids=positions[::G, :P], use_cache=True,
                **({} if hidden else {"logits_to_keep": 1}))
    cache = out_p.past_key_values
    cache.batch_repeat_interleave(G)  # (N, …) → (B, …), differentiable
    first = out_p[key][:, -1:, :].repeat_interleave(G, dim=0)  # (B, 1, ·): predicts completion token 0
    out_c = net(input_ids=input_ids[:, P:L - 1], attention_mask=attention_mask[:, :L - 1],
                position_ids=positions[:, P:L - 1], past_key_values=cache, use_cache=True)
    return torch.cat([first, out_c[key]], dim=1)  # (B, T, V) or (B, T, H)


class PolicyLogprobs(NamedTuple):
    """Output of ``policy_logprobs``: (B, T) tensors over the completion positions (mask the padding).

    logp:            float32 log π(y_t | x, y_<t) under softmax(logits / τ).
    entropy:         float32 entropy of that distribution, or None when not asked for.
    token_grad_norm: float32 ‖∇θ log π(y_t)‖ (detached) in the requested mode, or None.
    """

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    token_grad_norm: torch.Tensor | None = None


def policy_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    grad_norm_mode: str | None = None,
    group_size: int | None = None,
    with_grad: bool = True,
    seqs_per_microbatch: int | None = None,
    chunk_rows: int | None = None,
    fused_head: bool | None = None,
) -> PolicyLogprobs:
    """The policy's per-token log-probs of ``completion_ids``, with what an objective asks for besides.

    Args:
        model: a Hugging Face causal LM.
        input_ids: (B, L) left-padded prompts followed by the completions; L = P + T.
        attention_mask: (B, L) 1 on real tokens.
        completion_ids: (B, T) the completions (the last T columns of ``input_ids``).
        temperature: τ the completions were sampled with: log-probs are of softmax(logits / τ), as TRL's.
        with_entropy: also return per-token entropies (differentiable, for an entropy bonus).
        grad_norm_mode: also return per-token gradient norms ``‖∇θ log π(y_t)‖`` for gradient-adaptive credit:
            ``logits`` (w.r.t. the logits), ``lm_head`` (w.r.t. the output layer) or ``exact`` (every
            parameter, one backward per token: small models only); None = not needed.
        group_size: G when rows ``i·G … i·G+G−1`` share one prompt: each prompt then runs once with its KV
            cache reused by its G completions (``shared_prefix_logits``); None or 1 = plain forward.
        with_grad: False runs under ``no_grad`` in eval mode (behaviour / reference log-probs), in
            microbatches of ``seqs_per_microbatch`` rows; True keeps the graph for one backward (the caller
            microbatches, since each microbatch is followed by its own backward).
        chunk_rows: rows per block of the chunked log-softmax (default: 64 MB float32 blocks).
        fused_head: log-probs straight from the head's inputs (``head_log_softmax``), no (B, T, V) logits;
            None = when ``fused_head_applies`` (a plain linear head and logits over 1 GiB); never with
            ``grad_norm_mode``, which needs the logits.
    Returns:
        ``PolicyLogprobs(logp, entropy, token_grad_norm)``.

    Plain equivalent::

        logits = model(input_ids, attention_mask, position_ids=cumsum(mask) − 1).logits[:, -T-1:-1] / τ
        logp = log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None])[..., 0]

    but never with a float32 (B, T, V) log-softmax: the log-softmax is chunked and its backward writes into
    the logits' own storage.
    """
    if grad_norm_mode is not None and grad_norm_mode not in GRAD_NORM_MODES:
        raise ValueError(f"grad_norm_mode={grad_norm_mode!r} must be one of {GRAD_NORM_MODES} or None")
    if completion_ids.shape[0] != input_ids.shape[0] or completion_ids.shape[1] >= input_ids.shape[1]:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)} must be the last columns of input_ids "
                         f"{tuple(input_ids.shape)}")
    if with_grad:
        return _policy_forward(model, input_ids, attention_mask, completion_ids, temperature, with_entropy,
                               grad_norm_mode, group_size, chunk_rows, fused_head)
    if grad_norm_mode is not None:
        raise ValueError("grad_norm_mode needs with_grad=True (gradient norms are taken during training)")
    B = input_ids.shape[0]
    step = seqs_per_microbatch or B
    was_training = model.training
    model.eval()
    parts: list[PolicyLogprobs] = []
    try:
        with torch.no_grad():
            for s in range(0, B, step):
                rows = slice(s, s + step)
                parts.append(_policy_forward(model, input_ids[rows], attention_mask[rows], completion_ids[rows],
                                             temperature, with_entropy, None, group_size, chunk_rows, fused_head))
    finally:
        model.train(was_training)
    return PolicyLogprobs(
        logp=torch.cat([p.logp for p in parts]),
        entropy=torch.cat([p.entropy for p in parts]) if with_entropy else None,
    )


def _policy_forward(model, input_ids, attention_mask, completion_ids, temperature, with_entropy, grad_norm_mode,
                    group_size, chunk_rows, fused_head) -> PolicyLogprobs:
    B, T = completion_ids.shape
    if grad_norm_mode is not None:
        fused_head = False
    elif fused_head is None:
        fused_head = fused_head_applies(model, B * T)
    if grad_norm_mode is None and group_size:
        shared = shared_prefix_logits(model, input_ids, attention_mask, T, group_size, hidden=fused_head)
        if shared is not None and fused_head:
            return PolicyLogprobs(*head_log_softmax(shared, model.get_output_embeddings(), completion_ids,
                                                    temperature, with_entropy, chunk_rows))
        if shared is not None:
            return PolicyLogprobs(*token_logprobs(shared, completion_ids, temperature, with_entropy, chunk_rows))
    out = sequence_logprobs(model, input_ids, attention_mask, T, temperature=temperature, with_entropy=with_entropy,
                            return_hidden=grad_norm_mode == "lm_head", return_logits=grad_norm_mode is not None,
                            chunk_rows=chunk_rows, fused_head=fused_head)
    norm = None
    if grad_norm_mode is not None:
        norm = _token_grad_norm(model, grad_norm_mode, out, input_ids, attention_mask, completion_ids, temperature)
    return PolicyLogprobs(out.logprobs, out.entropy, norm)


def _token_grad_norm(model, mode, out: SequenceLogprobs, input_ids, attention_mask, completion_ids, temperature):
    """(B, T) ``‖∇θ log π(y_t)‖`` in ``mode`` (see ``lmpo.objectives.grad_norms``), for logits / τ."""
    if mode == "logits":
        return logits_grad_norm(out.logits, completion_ids)
    if mode == "lm_head":
        head = model.get_output_embeddings()
        return lm_head_grad_norm(out.hidden, out.logits, completion_ids,
                                 head_has_bias=getattr(head, "bias", None) is not None, logit_scale=1.0 / temperature)

    def call(ids, attention_mask=None):
        return model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
                     use_cache=False).logits * (1.0 / temperature)

    trainable = [p for p in model.parameters() if p.requires_grad]
    return exact_grad_norm(call, input_ids, completion_ids.shape[1], attention_mask=attention_mask,
                           parameters=trainable)
