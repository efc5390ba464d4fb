"""A lean CPU decode step for Llama-family causal LMs (Hugging Face ``LlamaForCausalLM``, ``Qwen2ForCausalLM``).

One decode step of ``HFRollout``'s loop (one token per row, keys/values in the loop's buffers) computed with
a fixed, short sequence of ATen calls per layer instead of the Hugging Face module stack::

    x = embed[ids]                                                    (b, d)
    per layer:  h = rmsnorm(x) · w₁;  [q k v] = h W_qkvᵀ (+ bias)       one GEMM, the three weights concatenated
                q, k ← rope(q, k) at each row's position               (the cos/sin rows gathered once per step)
                K[:, :, s] = k;  V[:, :, s] = v                         in place, at the step's cache slot s
                a = softmax(q Kᵀ · scale, blocked → −inf) V             the query heads grouped under their kv head
                x += a W_oᵀ;  h = rmsnorm(x) · w₂;  [g u] = h W_guᵀ     one GEMM for gate and up
                x += (silu(g) · u) W_downᵀ
    logits = rmsnorm(x) · w W_headᵀ                                    (b, V), into a buffer the sampler reads

Every operation is the one Hugging Face's modules run, in the same order and dtype (``rotate_half`` written into
a buffer, RMSNorm as ATen's fused ``rms_norm``, which computes it bit for bit; a fused GEMM gives each output
column what its own GEMM gives), so the logits equal the module stack's bit for bit on the configurations
``tests/generation/test_lean_decode.py`` builds (the presets, a Llama with grouped-query heads and biases, a
Qwen2): greedy tokens equal ``model.generate``'s and sampled tokens the generic loop's, seed for seed.

The Hugging Face stack runs about twice as many ATen calls per layer, each with module dispatch and Python
around it, on (128, 128)-sized operands where that overhead is comparable to the arithmetic; this step runs
~23 calls per layer into preallocated buffers. ``benchmarks/decode_bound.py`` measures both against the time
of the step's GEMMs and attention products alone. The concatenated weights are copied again at every
``generate`` call (the weights change between RL steps; the copy is a millisecond for the presets).

``unsupported(model)`` names why a model cannot take this path (another architecture, hooks on
a module, adapters in place of ``nn.Linear``, a rope that depends on the sequence length, sliding-window
attention, a dtype other than float32); ``HFRollout`` then decodes through the model's own forward.
"""

from __future__ import annotations

import torch
from torch import nn

# Model classes whose forward is: embedding, pre-norm decoder layers of (RMSNorm, rope attention, RMSNorm,
# SiLU-gated MLP), a final RMSNorm and a linear head — the computation the step above reproduces.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
# Rope variants whose inverse frequencies do not depend on the sequence length (a table per call is exact).
_STATIC_ROPE = ("default", "linear", "llama3")


def unsupported(model: nn.Module) -> str | None:
    """Why ``model`` cannot be decoded by ``LeanDecoder`` (one clause), or None when it can."""
    name = type(model).__name__
    if name not in SUPPORTED_ARCHITECTURES:
        return f"architecture {name} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}"
    config = model.config
    if next(model.parameters()).dtype != torch.float32:
        return f"dtype {next(model.parameters()).dtype} (the lean step is float32 only)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (the lean step computes SiLU)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return f"pretraining_tp={config.pretraining_tp}"
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ())):
        return "sliding-window attention layers"
    rope = model.model.rotary_emb
    if getattr(rope, "rope_type", "default") not in _STATIC_ROPE:
        return f"rope type {rope.rope_type!r} (inverse frequencies that change with the length)"
    for mod_name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return f"forward hooks on {mod_name or 'the model'}"
    if (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks):
        return "global forward hooks"
    for layer in model.model.layers:
        linears = (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                   layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        if any(type(m) is not nn.Linear for m in linears):
            return "projections that are not plain nn.Linear (adapters or quantized layers)"
    if type(model.lm_head) is not nn.Linear or model.lm_head.bias is not None:
        return "a head that is not a bias-free nn.Linear"
    return None


class _Layer:
    """One decoder layer's weights as the step reads them (the fused ones concatenated along the output axis)."""

    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.norm2, self.eps2 = layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.qkv_t = torch.cat([p.weight for p in projections]).t()  # (d, q + 2 kv), a transposed view
        biases = [p.bias for p in projections]
        self.qkv_bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else p.weight.new_zeros(p.out_features) for b, p in zip(biases, projections)])
        self.o_t, self.o_bias = attn.o_proj.weight.t(), attn.o_proj.bias
        self.gu_t = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t()  # (d, 2 ff)
        gb, ub = mlp.gate_proj.bias, mlp.up_proj.bias
        self.gu_bias = None if gb is None and ub is None else torch.cat(
            [gb if gb is not None else mlp.gate_proj.weight.new_zeros(mlp.gate_proj.out_features),
             ub if ub is not None else mlp.up_proj.weight.new_zeros(mlp.up_proj.out_features)])
        self.down_t, self.down_bias = mlp.down_proj.weight.t(), mlp.down_proj.bias
        self.scaling = attn.scaling


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """``F.linear`` into ``out``: the same BLAS call (``addmm`` with a bias, ``mm`` without)."""
    if bias is None:
        return torch.mm(x, weight_t, out=out)
    return torch.addmm(bias, x, weight_t, out=out)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm`` in float32, ``weight · (x · rsqrt(mean(x²) + eps))``: ATen's fused ``rms_norm`` computes
    the module's five operations bit for bit (``tests/generation/test_lean_decode.py`` checks it)."""
    return torch.rms_norm(x, (x.shape[-1],), weight, eps)


class LeanDecoder:
    """The lean decode step of one model (see the module docstring); ``refresh`` re-reads its weights.

    ``step`` reads the loop's key/value buffers (B, kv heads, L, head dim) per layer, as ``HFRollout``'s
    ``_BufferLayer`` cache holds them (also after it drops finished rows).
    """

    def __init__(self, model: nn.Module) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanDecoder cannot decode this model: {reason}")
        self.model = model
        config = model.config
        first = model.model.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = first.q_proj.out_features // self.head_dim
        self.kv_heads = first.k_proj.out_features // self.head_dim
        self.hidden = config.hidden_size
        self._buffers: dict | None = None
        self._rope: torch.Tensor | None = None

    def refresh(self) -> None:
        """Concatenate the fused weights from the parameters as they are now (at every ``generate`` call).

        One copy of the q/k/v and gate/up weights (a millisecond for the presets): no version counter to trust,
        which a write through ``.data`` (the rollout worker's weight loads) or from another process bypasses."""
        inner = self.model.model
        with torch.no_grad():
            self.layers = [_Layer(layer) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight
        self.final_norm, self.final_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.head_t = self.model.lm_head.weight.t()

    def rope_table(self, positions: int) -> torch.Tensor:
        """(positions, 2, head dim): cos and sin of every position as the model's rotary embedding computes
        them (``cat(f, f).cos() · attention_scaling`` with ``f = inv_freq · position``)."""
        if self._rope is None or self._rope.shape[0] < positions:
            rotary = self.model.model.rotary_emb
            pos = torch.arange(positions, dtype=torch.float32, device=rotary.inv_freq.device)
            freqs = pos[:, None] * rotary.inv_freq.float()[None, :]  # (P, hd/2): exact, as HF's K=1 matmul
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope = torch.stack((emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling),
                                     dim=1)
        return self._rope

    def _buffers_for(self, rows: int) -> dict:
        if self._buffers is None or self._buffers["rows"] != rows:
            w = self.layers[0]
            new = self.embed.new_empty
            qkv, gu = w.qkv_t.shape[1], w.gu_t.shape[1]
            hd, H, Hkv = self.head_dim, self.heads, self.kv_heads
            self._buffers = {
                "rows": rows, "x": new(rows, self.hidden),
                "qkv": new(rows, qkv), "qk": new(rows, H + Hkv, hd), "rot": new(rows, H + Hkv, hd),
                "attn": new(rows, H * hd), "o": new(rows, self.hidden), "gu": new(rows, gu),
                "m": new(rows, gu // 2), "logits": new(rows, self.embed.shape[0]),
            }
        return self._buffers

    def step(self, ids: torch.Tensor, position_ids: torch.Tensor, slot: int, blocked: torch.Tensor,
             caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One token per row -> (b, V) next-token logits (a buffer: read it before the next step).

        ids: (b,) token ids; position_ids: (b, 1) their rope positions; slot: the cache position they are
        written at (the same for every row); blocked: (b, 1, 1, slot + 1) bool, True where a row must not
        attend; caches: per layer the (b, kv heads, L >= slot + 1, head dim) key and value buffers.
        """
        # inference mode: no version counters or autograd keys to maintain per call (~6% of a step of the presets);
        # the buffers made here are inference tensors, read outside it only by operations that make new ones
        with torch.inference_mode():
            return self._step(ids, position_ids, slot, blocked, caches)

    def _step(self, ids, position_ids, slot, blocked, caches) -> torch.Tensor:
        b = ids.shape[0]
        s = self._buffers_for(b)
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        group, q_width, kv_width = H // Hkv, H * hd, Hkv * hd
        half = hd // 2
        x, qkv, qk, rot = s["x"], s["qkv"], s["qk"], s["rot"]
        attn, o, gu, m = s["attn"], s["o"], s["gu"], s["m"]
        ff = m.shape[1]
        length = slot + 1
        cos_sin = self.rope_table(int(position_ids.max()) + 1).index_select(0, position_ids.view(-1))
        cos, sin = cos_sin[:, None, 0], cos_sin[:, None, 1]  # (b, 1, hd): broadcast over heads
        torch.index_select(self.embed, 0, ids, out=x)
        for w, (keys, values) in zip(self.layers, caches):
            h = _rms_norm(x, w.norm1, w.eps1)
            _linear(h, w.qkv_t, w.qkv_bias, qkv)
            raw = qkv[:, : q_width + kv_width].view(b, H + Hkv, hd)  # q and k heads side by side
            # rope on q and k at once: q·cos + rotate_half(q)·sin, rotate_half(q) = cat(−q₂, q₁)
            torch.neg(raw[..., half:], out=rot[..., :half])
            rot[..., half:].copy_(raw[..., :half])
            torch.mul(raw, cos, out=qk)
            qk.add_(rot.mul_(sin))
            keys[:, :, slot].copy_(qk[:, H:])
            values[:, :, slot].copy_(qkv[:, q_width + kv_width:].view(b, Hkv, hd))
            q = qk[:, :H].view(b, Hkv, group, hd)  # query heads grouped under their key/value head
            scores = torch.matmul(q, keys[:, :, :length].transpose(-1, -2))  # (b, Hkv, group, L)
            scores.mul_(w.scaling).masked_fill_(blocked, float("-inf"))
            probs = scores.softmax(-1)
            torch.matmul(probs, values[:, :, :length], out=attn.view(b, Hkv, group, hd))
            _linear(attn, w.o_t, w.o_bias, o)
            x.add_(o)
            h = _rms_norm(x, w.norm2, w.eps2)
            _linear(h, w.gu_t, w.gu_bias, gu)
            gate = torch.nn.functional.silu(gu[:, :ff], inplace=True)
            torch.mul(gate, gu[:, ff:], out=m)
            _linear(m, w.down_t, w.down_bias, o)
            x.add_(o)
        return torch.mm(_rms_norm(x, self.final_norm, self.final_eps), self.head_t, out=s["logits"])
