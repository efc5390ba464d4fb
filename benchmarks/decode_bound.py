"""How close lmpo's CPU phases run to the machine's arithmetic limit: decode step, log-prob forward, update.

Per model and completion length T, on one torch thread, the batch of the trainer benchmark
(``--prompts`` 16 prompts × ``--group`` 8 completions = 128 rows, addition prompts, fixed-length completions):

decode step  ``HFRollout.generate`` with the generic decode (``lean_decode=False``, the model's forward per
             token: *before*) and with the lean decode step (``lmpo.generation.lean``: *after*), alternating
             which goes first, ``--rounds`` pairs; time per generated token (the prefill and the sampling
             included). Its work per step (b rows, L attended positions, L̄ = P + T/2 on average), per layer:
             GEMMs 2·b·d·(q + 2kv) + 2·b·q·d + 2·b·d·2ff + 2·b·ff·d, attention 4·b·H·hd·L; plus the head 2·b·d·V.
log-prob     one forward over the (128, P + T) rollout (``sequence_logprobs``, no grad) — what the trainer's
             log-prob stage runs: GEMMs 2·N·(layer parameters + head) for N = 128·(P + T) tokens, attention
             4·B·H·hd·L(L+1)/2 (the causal half).
update       the same forward with grad, backward and an AdamW step: 3× the forward's arithmetic (the backward
             computes two GEMMs per forward GEMM).

The bound of a phase is what its arithmetic takes at the throughput this machine reaches on one core at the
phase's own shapes, measured in the same run, in every round, next to the phase:

- the decode step's *kernel bound* is the time of its GEMMs ((b, d) × (d, n), ``torch.mm``) and its two
  attention products at L̄ (``q Kᵀ`` and ``p V``) alone, in step order over every layer's own weights and
  (b, kv heads, P + T, hd) key/value cache, nothing else in between; the attention
  products read every cached key and value once per step (2 FLOPs per 4 bytes), so they run at the memory
  bandwidth, not at the GEMM rate — the *FLOP bound* (all FLOPs at the projection GEMMs' rate) is printed
  beside it and is not reachable;
- log-prob and update: GEMM FLOPs at the rate of ``torch.mm`` on (4096, d) × (d, n) blocks of the phase's
  projection shapes, attention FLOPs at the rate of ``torch.bmm`` on (B·H, L, hd) × (hd, L).

Times are CPU seconds of the calling thread (``time.thread_time``; all the work runs on it with one torch
thread), so that other jobs on a shared machine add their cache and memory-bandwidth pressure but not their
time slices. Each line gives medians over the rounds with their interquartile range; "fraction" is bound / measured (1.0 =
at the limit). The last lines say whether the decode step is within 2× its kernel bound.

    .venv/bin/python benchmarks/decode_bound.py --models tiny tiny-wide --lengths 64 256
    .venv/bin/python benchmarks/decode_bound.py --lengths 64 --rounds 3 --train-rounds 0   # decode only
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from trainer_vs_trl import build_model, prompts, quartiles

# CPU seconds of this thread: on a machine shared with other jobs, a wall clock counts their time slices too
_clock = time.thread_time


def _time(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = _clock()
        fn()
        times.append(_clock() - t0)
    return statistics.median(times)


def _shapes(model) -> dict:
    config = model.config
    attn = model.model.layers[0].self_attn
    hd = attn.head_dim
    return {"d": config.hidden_size, "q": attn.q_proj.out_features, "kv": attn.k_proj.out_features,
            "ff": model.model.layers[0].mlp.gate_proj.out_features, "V": model.lm_head.out_features,
            "H": attn.q_proj.out_features // hd, "Hkv": attn.k_proj.out_features // hd, "hd": hd,
            "layers": config.num_hidden_layers}


def _gemms(s: dict) -> list[tuple[int, int, int]]:
    """(inner, outer, count) of the decode step's GEMMs: (b, inner) × (inner, outer), ``count`` times per step."""
    n = s["layers"]
    return [(s["d"], s["q"] + 2 * s["kv"], n), (s["q"], s["d"], n), (s["d"], 2 * s["ff"], n),
            (s["ff"], s["d"], n), (s["d"], s["V"], 1)]


def decode_flops(s: dict, rows: int, length: float) -> tuple[float, float]:
    """(GEMM FLOPs, attention FLOPs) of one decode step of ``rows`` rows attending over ``length`` positions."""
    gemm = sum(2 * rows * i * o * c for i, o, c in _gemms(s))
    attention = s["layers"] * 4 * rows * s["H"] * s["hd"] * length
    return gemm, attention


def decode_bound(s: dict, rows: int, length: int, cache_len: int, repeats: int = 10) -> dict:
    """The decode step's GEMMs and attention products alone, in step order over every layer's own weights and
    (rows, kv heads, cache_len, hd) cache (one thread): the kernel bound, and the two parts' rates."""
    n, g = s["layers"], s["H"] // s["Hkv"]
    gemms = []
    for inner, outer, count in _gemms(s):
        for _ in range(count):
            gemms.append((torch.randn(rows, inner), torch.randn(outer, inner).t(), torch.empty(rows, outer)))
    caches = [(torch.randn(rows, s["Hkv"], cache_len, s["hd"])[:, :, :length],
               torch.randn(rows, s["Hkv"], cache_len, s["hd"])[:, :, :length]) for _ in range(n)]
    q = torch.randn(rows, s["Hkv"], g, s["hd"])
    p = torch.randn(rows, s["Hkv"], g, length).softmax(-1)

    def gemm_pass():
        for x, w, out in gemms:
            torch.mm(x, w, out=out)

    def attention_pass():
        for keys, values in caches:
            torch.matmul(q, keys.transpose(-1, -2))
            torch.matmul(p, values)

    def step_pass():  # per layer: its four GEMMs, then its attention; the head last
        for i, (keys, values) in enumerate(caches):
            for x, w, out in gemms[i::n][:4]:
                torch.mm(x, w, out=out)
            torch.matmul(q, keys.transpose(-1, -2))
            torch.matmul(p, values)
        x, w, out = gemms[-1]
        torch.mm(x, w, out=out)

    gemm_s, attn_s = _time(gemm_pass, repeats), _time(attention_pass, repeats)
    gemm_flops, attn_flops = decode_flops(s, rows, length)
    kv_bytes = n * 2 * caches[0][0].numel() * caches[0][0].element_size()
    return {"kernel_s": _time(step_pass, repeats), "gemm_rate": gemm_flops / gemm_s, "kv_rate": kv_bytes / attn_s,
            "flop_s": (gemm_flops + attn_flops) / (gemm_flops / gemm_s), "flops": gemm_flops + attn_flops}


def forward_flops(s: dict, batch: int, length: int) -> tuple[float, float]:
    """(GEMM FLOPs, causal attention FLOPs) of one forward over (batch, length) tokens."""
    tokens = batch * length
    per_token = sum(2 * i * o * c for i, o, c in _gemms(s))
    attention = s["layers"] * 4 * batch * s["H"] * s["hd"] * length * (length + 1) / 2
    return tokens * per_token, attention


def forward_bound(s: dict, batch: int, length: int, repeats: int = 3) -> float:
    """Seconds one forward's arithmetic takes at the measured throughput of its shapes (one thread)."""
    rows = min(4096, batch * length)
    gemm_s = 0.0
    for inner, outer, count in _gemms(s):
        x, w = torch.randn(rows, inner), torch.randn(outer, inner)
        gemm_s += count * _time(functools.partial(torch.mm, x, w.t()), repeats) * (batch * length / rows)
    heads = min(64, batch * s["H"])
    q, k = torch.randn(heads, length, s["hd"]), torch.randn(heads, s["hd"], length)
    bmm_rate = 2 * heads * length * length * s["hd"] / _time(lambda: torch.bmm(q, k), repeats)
    return gemm_s + forward_flops(s, batch, length)[1] / bmm_rate


def _update(model, optimizer, ids, mask, T: int) -> None:
    from lmpo.generation import sequence_logprobs

    out = sequence_logprobs(model, ids, mask, T)
    (-out.logprobs.mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_cell(name: str, T: int, args) -> dict:
    from lmpo.generation import HFRollout, sequence_logprobs

    model, tok = build_model(name)
    s = _shapes(model)
    batch = [r["prompt"] for r in prompts(args.prompts)]
    kwargs = dict(max_new_tokens=T, temperature=1.0, ignore_eos=True)
    engines = {"before": HFRollout(model, tok, lean_decode=False, **kwargs), "after": HFRollout(model, tok, **kwargs)}
    for engine in engines.values():
        engine.generate(batch, args.group, seed=0)
    assert engines["after"].decode_mode == "lean", engines["after"].decode_mode
    rollout = engines["after"].generate(batch, args.group, seed=0)
    ids, mask = rollout.input_ids, rollout.attention_mask
    rows, P = ids.shape[0], rollout.prompt_ids.shape[1]
    mean_len = round(P + T / 2)
    per_token = {"before": [], "after": []}
    bounds = []
    for r in range(args.rounds):
        for key in (("before", "after") if r % 2 == 0 else ("after", "before")):
            t0 = _clock()
            engines[key].generate(batch, args.group, seed=r)
            per_token[key].append((_clock() - t0) / T)
        bounds.append(decode_bound(s, rows, mean_len, P + T))
    out = {"model": name, "T": T, "rows": rows, "per_token": per_token, "bounds": bounds,
           "flops": bounds[0]["flops"]}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    train = {"logp": [], "update": [], "bound": []}
    for _ in range(args.train_rounds):
        with torch.no_grad():
            t0 = _clock()
            sequence_logprobs(model, ids, mask, T)
            train["logp"].append(_clock() - t0)
        model.train()
        t0 = _clock()
        _update(model, optimizer, ids, mask, T)
        train["update"].append(_clock() - t0)
        model.eval()
        train["bound"].append(forward_bound(s, rows, ids.shape[1]))
    out["train"] = train
    out["train_flops"] = sum(forward_flops(s, rows, ids.shape[1]))
    return out


def _iqr(values) -> str:
    q1, med, q3 = quartiles(list(values))
    return f"{med:7.2f} [{q1:.2f}-{q3:.2f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "tiny-wide"])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--prompts", type=int, default=16, help="prompts per call")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--rounds", type=int, default=5, help="before/after generation pairs per cell")
    p.add_argument("--train-rounds", type=int, default=3, help="log-prob forward + update timings per cell (0: none)")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"one torch thread; {args.prompts} prompts x {args.group} completions; torch {torch.__version__}; "
          f"medians [IQR] over {args.rounds} interleaved rounds", flush=True)
    print(f"{'model':>10} {'T':>4} {'GFLOP/step':>10} {'GEMM GF/s':>9} {'KV GB/s':>8} {'FLOP bd ms':>10} "
          f"{'kernel bd ms':>12} {'before ms/token':>21} {'after ms/token':>21} {'speedup':>18} "
          f"{'after/bound':>18}", flush=True)
    results = []
    for name in args.models:
        for T in args.lengths:
            r = run_cell(name, T, args)
            results.append(r)
            b, a = r["per_token"]["before"], r["per_token"]["after"]
            bd = r["bounds"]
            r["ratio"] = [x / y["kernel_s"] for x, y in zip(a, bd)]
            print(f"{name:>10} {T:4d} {r['flops'] / 1e9:10.3f} "
                  f"{statistics.median(x['gemm_rate'] for x in bd) / 1e9:9.1f} "
                  f"{statistics.median(x['kv_rate'] for x in bd) / 1e9:8.1f} "
                  f"{statistics.median(x['flop_s'] for x in bd) * 1e3:10.2f} "
                  f"{statistics.median(x['kernel_s'] for x in bd) * 1e3:12.2f} "
                  f"{_iqr(x * 1e3 for x in b):>21} {_iqr(x * 1e3 for x in a):>21} "
                  f"{_iqr(x / y for x, y in zip(b, a)):>17}x {_iqr(r['ratio']):>17}x", flush=True)
            tr = r["train"]
            for phase in ("logp", "update") if tr["logp"] else ():
                scale = 1 if phase == "logp" else 3
                fractions = [scale * bd / t for bd, t in zip(tr["bound"], tr[phase])]
                print(f"{'':>10} {'':>4} {phase:>7}: {scale * r['train_flops'] / 1e9:8.1f} GFLOP, bound "
                      f"{scale * statistics.median(tr['bound']):6.3f} s, measured {_iqr(tr[phase])} s, "
                      f"fraction of the bound {_iqr(fractions)}", flush=True)
    worst = max(statistics.median(r["ratio"]) for r in results)
    print(f"decode step / kernel bound, worst cell: {worst:.2f}x (target <= 2x: "
          f"{'met' if worst <= 2 else 'NOT met'})", flush=True)


if __name__ == "__main__":
    main()
