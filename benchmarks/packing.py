"""Time and peak memory of the packed (padding-free) training forward against the padded one, mixed lengths.

    python benchmarks/packing.py                          # tiny-wide, 32 sequences, CPU
    python benchmarks/packing.py --model tiny --seqs 64 --max-completion 256 --repeats 5

The batch: ``--seqs`` sequences with prompt lengths uniform in [4, ``--max-prompt``] and completion lengths drawn
from a long-tailed mix (most short, a few near ``--max-completion``), left-padded prompts and right-padded
completions as the rollout engines return them. Each variant computes the completion log-probs with their entropy
and runs the backward of their masked sum (the trainer's training forward):

- ``padded``: :func:`lmpo.generation.policy_logprobs` on the (B, P + T) batch (plain forward, no prefix sharing);
- ``packed``: :func:`lmpo.generation.packing.packed_policy_logprobs`, one row of the N real tokens.

``peak extra``: each variant in a fresh subprocess, peak resident memory of one forward + backward minus the
resident memory with the model and batch in place (CPU ``ru_maxrss``; CUDA ``max_memory_allocated``).
``time``: best of ``--repeats`` warm calls, the variants interleaved round-robin in one further subprocess so
that load from other processes hits both alike. Ratios are packed / padded, printed side by side.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

VARIANTS = ("padded", "packed")


def _batch(args, tokenizer_size: int):
    g = torch.Generator().manual_seed(args.seed)
    B = args.seqs
    prompt = torch.randint(4, args.max_prompt + 1, (B,), generator=g)
    # long-tailed completion lengths: 3/4 short (up to an eighth of the budget), 1/4 anywhere up to the budget
    short = torch.randint(1, max(2, args.max_completion // 8) + 1, (B,), generator=g)
    long = torch.randint(1, args.max_completion + 1, (B,), generator=g)
    completion = torch.where(torch.rand(B, generator=g) < 0.75, short, long)
    P, T = int(prompt.max()), int(completion.max())
    ids = torch.randint(4, tokenizer_size, (B, P + T), generator=g)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for b in range(B):
        attn[b, P - int(prompt[b]):P + int(completion[b])] = 1
    ids = torch.where(attn.bool(), ids, 0)
    return ids, attn, ids[:, P:], attn[:, P:].bool()


def _setup(args):
    from lmpo.models import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args.model, device=args.device)
    model.train()
    ids, attn, completion, mask = _batch(args, len(tok))
    return model, [t.to(args.device) for t in (ids, attn, completion, mask)]


def _call(variant: str, model, ids, attn, completion, mask) -> None:
    from lmpo.generation import policy_logprobs
    from lmpo.generation.packing import packed_policy_logprobs

    fn = policy_logprobs if variant == "padded" else packed_policy_logprobs
    out = fn(model, ids, attn, completion, with_entropy=True, with_grad=True)
    ((out.logp * mask).sum() + (out.entropy * mask).sum()).backward()
    model.zero_grad(set_to_none=True)


def _peak(args) -> None:
    model, batch = _setup(args)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _call(args.variant, model, *batch)
    after = (torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps({"peak_extra_bytes": after - before}))


def _times(args) -> None:
    model, batch = _setup(args)
    best = dict.fromkeys(VARIANTS, float("inf"))
    for variant in VARIANTS:  # warm-up
        _call(variant, model, *batch)
    for _ in range(args.repeats):
        for variant in VARIANTS:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _call(variant, model, *batch)
            if args.device == "cuda":
                torch.cuda.synchronize()
            best[variant] = min(best[variant], time.perf_counter() - t0)
    ids, attn, completion, mask = batch
    print(json.dumps({"times": best, "padded_positions": int(ids.numel()), "real_tokens": int(attn.sum()),
                      "completion_tokens": int(mask.sum())}))


def _child(args, role: str, variant: str = "") -> dict:
    argv = [sys.executable, __file__, "--role", role, "--variant", variant] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("role", "variant")]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-wide", help="a built-in preset or a Hugging Face model path")
    p.add_argument("--seqs", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=48)
    p.add_argument("--max-completion", type=int, default=192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--role", default="main", choices=["main", "peak", "times"], help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "peak":
        return _peak(args)
    if args.role == "times":
        return _times(args)
    peaks = {v: _child(args, "peak", v)["peak_extra_bytes"] for v in VARIANTS}
    timing = _child(args, "times")
    times = timing["times"]
    print(f"packing benchmark: model {args.model}, {args.seqs} sequences, {args.device}, {args.threads} thread(s); "
          f"{timing['padded_positions']} padded positions hold {timing['real_tokens']} real tokens "
          f"({timing['completion_tokens']} completion tokens)")
    print(f"{'variant':<8} {'time (s)':>10} {'peak extra (MiB)':>18}")
    for v in VARIANTS:
        print(f"{v:<8} {times[v]:>10.3f} {peaks[v] / 2**20:>18.1f}")
    print(f"packed / padded: time {times['packed'] / times['padded']:.2f}x, peak memory "
          f"{peaks['packed'] / max(1, peaks['padded']):.2f}x, positions "
          f"{timing['real_tokens'] / timing['padded_positions']:.2f}x")


if __name__ == "__main__":
    main()
