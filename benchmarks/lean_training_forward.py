"""Does a lean training forward pay on CPU? The trainer's log-prob forward and backward, paired with a fused one.

The trainer's update runs the model's own forward (Hugging Face modules; each prompt once per group with its
keys/values reused by the G completions, ``shared_prefix_logits``), the selective log-softmax and the backward.
The candidate is the lean decode step's recipe (``lmpo.generation.lean``) applied to training: one GEMM for the
concatenated q/k/v weights and one for gate/up (the concatenation inside the autograd graph, so the gradients
reach the parameters), ATen's fused ``rms_norm``, rope on q and k at once, the same SDPA call with the same mask.

Both run on the same (16 prompts × 8 completions, prompt + T tokens) batch of the trainer benchmark, alternating
which goes first, one torch thread, CPU seconds of this thread (``time.thread_time``). The logits of the two are
compared bit for bit, the gradients by their largest relative difference (the backward of a fused GEMM sums
the three projections' input gradients in one product: a different rounding).

    .venv/bin/python benchmarks/lean_training_forward.py --models tiny tiny-wide --lengths 64 256 --rounds 5

Measured 2026-11-28 (2-core machine shared with five other jobs; docs/trainer.md): no gain outside the noise,
so the trainer keeps the model's own forward.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F

from lmpo.generation.logprobs import position_ids_from_mask, shared_prefix_logits, token_logprobs
from trainer_vs_trl import build_model, prompts, quartiles


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def lean_shared_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int, G: int) -> torch.Tensor:
    """(B, T, V) completion logits as ``shared_prefix_logits`` computes them (prompt once per group), through
    fused projections; the model's own parameters carry the gradient."""
    inner = model.model
    B, L = input_ids.shape
    P, N, Tc = L - T, B // G, T - 1
    first = inner.layers[0].self_attn
    hd = first.head_dim
    H, Hkv = first.q_proj.out_features // hd, first.k_proj.out_features // hd
    positions = position_ids_from_mask(attention_mask)
    rotary = inner.rotary_emb

    def cos_sin(pos):
        f = pos[..., None].float() * rotary.inv_freq.float()
        e = torch.cat((f, f), -1)
        return (e.cos() * rotary.attention_scaling)[:, None], (e.sin() * rotary.attention_scaling)[:, None]

    keys_ok = attention_mask[:, :L - 1].bool()
    i = torch.arange(P)
    mask_p = (i[None, :] <= i[:, None])[None, None] & keys_ok[::G, None, None, :P]
    q_pos, k_pos = torch.arange(P, L - 1), torch.arange(L - 1)
    mask_c = (k_pos[None, :] <= q_pos[:, None])[None, None] & keys_ok[:, None, None, :]
    parts = [(inner.embed_tokens(input_ids[::G, :P]), *cos_sin(positions[::G, :P]), N, P),
             (inner.embed_tokens(input_ids[:, P:L - 1]), *cos_sin(positions[:, P:L - 1]), B, Tc)]
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        w_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        w_gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
        qkv = []
        for x, cos, sin, n, t in parts:
            h = torch.rms_norm(x, (x.shape[-1],), n1.weight, n1.variance_epsilon)
            qk, v = F.linear(h, w_qkv).split([(H + Hkv) * hd, Hkv * hd], -1)
            q, k = _rope(qk.view(n, t, H + Hkv, hd).transpose(1, 2), cos, sin).split([H, Hkv], 1)
            qkv.append((q, k, v.view(n, t, Hkv, hd).transpose(1, 2)))
        (qp, kp, vp), (qc, kc, vc) = qkv
        outs = [F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask_p, scale=attn.scaling),
                F.scaled_dot_product_attention(qc, torch.cat([kp.repeat_interleave(G, 0), kc], 2),
                                               torch.cat([vp.repeat_interleave(G, 0), vc], 2), attn_mask=mask_c,
                                               scale=attn.scaling)]
        new = []
        for (x, cos, sin, n, t), a in zip(parts, outs):
            x = x + F.linear(a.transpose(1, 2).reshape(n, t, H * hd), attn.o_proj.weight)
            gate, up = F.linear(torch.rms_norm(x, (x.shape[-1],), n2.weight, n2.variance_epsilon), w_gu).chunk(2, -1)
            new.append((x + F.linear(F.silu(gate) * up, mlp.down_proj.weight), cos, sin, n, t))
        parts = new
    (xp, *_), (xc, *_) = parts
    last = torch.cat([xp[:, -1:].repeat_interleave(G, 0), xc], 1)
    return model.lm_head(torch.rms_norm(last, (last.shape[-1],), inner.norm.weight, inner.norm.variance_epsilon))


def _forward_backward(fn, *, model, ids, mask, completions, G):
    """Log-probs of ``completions`` through ``fn``'s logits, summed, backward: (logits, every parameter's grad)."""
    model.zero_grad(set_to_none=True)
    logits = fn(model, ids, mask, completions.shape[1], G)
    token_logprobs(logits, completions, 1.0, False, None)[0].sum().backward()
    return logits.detach(), [q.grad.clone() for q in model.parameters()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "tiny-wide"])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':>10} {'T':>4} {'model fwd+bwd':>14} {'lean fwd+bwd':>13} {'model/lean [IQR]':>20} "
          f"{'logits equal':>12} {'grad rel diff':>13}", flush=True)
    for name in args.models:
        model, tok = build_model(name)
        model.train()
        enc = tok([r["prompt"] for r in prompts(args.prompts)], padding=True, padding_side="left",
                  return_tensors="pt")
        G = args.group
        for T in args.lengths:
            comp = torch.randint(5, model.config.vocab_size, (args.prompts * G, T),
                                 generator=torch.Generator().manual_seed(0))
            ids = torch.cat([enc.input_ids.repeat_interleave(G, 0), comp], 1)
            mask = torch.cat([enc.attention_mask.repeat_interleave(G, 0), torch.ones_like(comp)], 1)

            step = functools.partial(_forward_backward, model=model, ids=ids, mask=mask, completions=comp, G=G)
            (ref_logits, ref_grads), (lean_logits, lean_grads) = step(shared_prefix_logits), step(lean_shared_logits)
            diff = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(ref_grads, lean_grads))
            times: dict[str, list[float]] = {"model": [], "lean": []}
            for r in range(args.rounds):
                order = [("model", shared_prefix_logits), ("lean", lean_shared_logits)]
                for key, fn in order if r % 2 == 0 else order[::-1]:
                    t0 = time.thread_time()
                    step(fn)
                    times[key].append(time.thread_time() - t0)
            q1, med, q3 = quartiles([a / b for a, b in zip(times["model"], times["lean"])])
            print(f"{name:>10} {T:4d} {sorted(times['model'])[len(times['model']) // 2]:13.3f}s "
                  f"{sorted(times['lean'])[len(times['lean']) // 2]:12.3f}s {med:8.3f}x [{q1:.3f}-{q3:.3f}] "
                  f"{str(torch.equal(ref_logits, lean_logits)):>12} {diff:13.2e}", flush=True)


if __name__ == "__main__":
    main()
