"""Peak memory and time of the selective log-softmax against the naive ``log_softmax().gather()``.

    python benchmarks/logprob_memory.py                      # V = 32k and 152k, B×T = 8×1024, CPU
    python benchmarks/logprob_memory.py --vocab 32000 --modes forward --repeats 5

What is measured, for each vocabulary size V and mode, all launched side by side from this one run:

- inputs: logits (B, T, V) in ``--dtype`` (default: float32 at V ≤ 64k, bfloat16 above, the dtype a
  Qwen-size model produces; float32 at 152k would need 5 GB per copy), token ids (B, T), upstream grad (B, T);
- ``peak extra``: (each variant in a fresh subprocess, so that one variant's freed memory cannot hide
  another's peak) peak resident memory during the first call minus the resident memory with the inputs already
  allocated (CPU: ``ru_maxrss`` delta; CUDA: ``max_memory_allocated`` delta). In ``train`` mode it includes
  the logits gradient that backward leaves in ``logits.grad`` — unless the variant writes it in place;
- ``time``: best of ``--repeats`` warm calls (forward, or forward + backward in ``train`` mode), all variants
  interleaved round-robin in one further subprocess so that load from other processes hits them alike.

Modes: ``forward`` = under ``no_grad`` (behaviour / reference log-probs); ``train`` = forward + backward;
``head`` = forward + backward from the head's inputs: hidden states (B, T, ``--hidden``) and a linear head
(V, ``--hidden``) are the inputs, so the logits the head produces count in the peak — ``naive`` and
``selective_inplace`` run ``linear`` then their log-softmax, ``fused`` is ``lmpo.generation.logprobs.head_log_softmax``
(the trainer's path for large vocabularies: logits one float32 block at a time, never (B, T, V)). Every
variant there also allocates the (V, H) weight gradient.
Variants: ``naive`` = ``torch.log_softmax(logits, -1).gather(-1, ids)`` (in the logits' dtype: for bf16
logits its log-probs carry bf16 rounding, ~1e-2 at |log p| ~ 10); ``naive_fp32`` (bf16 forward only) =
``torch.log_softmax(logits.float(), -1).gather(-1, ids)``, the naive formula at selective's precision; ``selective`` =
``lmpo.generation.selective_log_softmax`` (chunked, new gradient buffer); ``selective_inplace`` = the
same with ``inplace_backward=True`` (gradient written into the logits' storage, as ``sequence_logprobs``
does with the logits it gets from ``lm_head``). Targets: selective ≤ 25 % of naive peak, ≤ 1.2× its time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

VARIANTS = ("naive", "naive_fp32", "selective", "selective_inplace", "fused")


def _rss_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _fill(logits: torch.Tensor, seed: int) -> None:
    """Random-looking logits without a (B, T, V) temporary: a 64-row random block copied over the rows."""
    vocab = logits.shape[-1]
    block = 4.0 * torch.randn(64, vocab, generator=torch.Generator().manual_seed(seed)).to(logits.dtype)
    flat = logits.view(-1, vocab)
    for start in range(0, flat.shape[0], 64):
        rows = min(64, flat.shape[0] - start)
        flat[start : start + rows].copy_(block[:rows].to(flat.device))


def _call(variant: str, logits, index: torch.Tensor, grad_out: torch.Tensor | None):
    from lmpo.generation import selective_log_softmax
    from lmpo.generation.logprobs import head_log_softmax

    if isinstance(logits, tuple):  # head mode: (hidden, head)
        hidden, head = logits
        if variant == "fused":
            out, _ = head_log_softmax(hidden, head, index)
            out.backward(grad_out.to(out.dtype))
            return out
        logits = head(hidden)
    if variant == "naive":
        out = torch.log_softmax(logits, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    elif variant == "naive_fp32":
        out = torch.log_softmax(logits.float(), dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    elif variant == "selective":
        out = selective_log_softmax(logits, index)
    else:
        out = selective_log_softmax(logits, index, inplace_backward=True)
    if grad_out is not None:
        out.backward(grad_out.to(out.dtype))
    return out


def _inputs(args, vocab: int, dtype: torch.dtype, train: bool):
    device = torch.device(args.device)
    if args.mode == "head":
        gen = torch.Generator().manual_seed(0)
        head = torch.nn.Linear(args.hidden, vocab, bias=False)
        with torch.no_grad():
            head.weight.normal_(0.0, 0.02, generator=gen)
        head = head.to(device=device, dtype=dtype)
        hidden = torch.randn(args.batch, args.seq, args.hidden, generator=gen).to(device=device, dtype=dtype)
        hidden.requires_grad_(True)
        index = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)
        grad_out = torch.randn(args.batch, args.seq, generator=torch.Generator().manual_seed(2)).to(device)
        return (hidden, head), index, grad_out
    shape = (args.batch, args.seq, vocab)
    logits = torch.empty(shape, dtype=dtype, device=device)
    _fill(logits, 0)
    logits.requires_grad_(train)
    index = torch.randint(0, vocab, shape[:2], generator=torch.Generator().manual_seed(1)).to(device)
    grad_out = (
        torch.randn(shape[:2], generator=torch.Generator().manual_seed(2)).to(device) if train else None
    )
    return logits, index, grad_out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def child_memory(args) -> None:
    """Peak extra memory of the very first call of one variant, in a process of its own."""
    train = args.mode in ("train", "head")
    logits, index, grad_out = _inputs(args, args.vocab, getattr(torch, args.dtype), train)
    _sync(args.device)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_peak_bytes()
    with torch.enable_grad() if train else torch.no_grad():
        out = _call(args.variant, logits, index, grad_out)
    _sync(args.device)
    peak = (torch.cuda.max_memory_allocated() if cuda else _rss_peak_bytes()) - base
    print(json.dumps({"peak_extra_bytes": peak, "checksum": float(out.double().sum())}))


def child_time(args) -> None:
    """Best-of-``repeats`` time of every variant, interleaved round-robin in one process so that load from
    other processes on the machine hits all variants alike."""
    train = args.mode in ("train", "head")
    logits, index, grad_out = _inputs(args, args.vocab, getattr(torch, args.dtype), train)
    variants = args.variants.split(",")
    best = dict.fromkeys(variants, float("inf"))
    for round_index in range(args.repeats + 1):  # round 0 is a warm-up
        for variant in variants:
            if isinstance(logits, tuple):
                logits[0].grad = logits[1].weight.grad = None
            elif train:  # the in-place variant overwrites the logits: refill them (outside the timer) for all
                logits.grad = None
                with torch.no_grad():
                    _fill(logits, 0)
            _sync(args.device)
            t0 = time.perf_counter()
            with torch.enable_grad() if train else torch.no_grad():
                out = _call(variant, logits, index, grad_out)
            _sync(args.device)
            elapsed = time.perf_counter() - t0
            del out
            if round_index > 0:
                best[variant] = min(best[variant], elapsed)
    print(json.dumps(best))


def _run(args, extra: list[str], vocab: int, mode: str, dtype: str) -> dict:
    cmd = [
        sys.executable, os.path.abspath(__file__), "--mode", mode, "--vocab", str(vocab),
        "--batch", str(args.batch), "--seq", str(args.seq), "--hidden", str(args.hidden), "--dtype", dtype,
        "--device", args.device,
        "--repeats", str(args.repeats), *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(extra)} V={vocab} {mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, or auto (float32 if V ≤ 64k)")
    parser.add_argument("--modes", nargs="+", default=["forward", "train", "head"], choices=["forward", "train", "head"])
    parser.add_argument("--hidden", type=int, default=896, help="hidden size H of the head mode (Qwen2.5-0.5B: 896)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-child", dest="variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--time-child", dest="variants", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["forward", "train", "head"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant or args.variants:
        args.vocab = args.vocab[0]
        child_memory(args) if args.variant else child_time(args)
        return

    print(f"B×T = {args.batch}×{args.seq}, device {args.device}, torch threads {torch.get_num_threads()}")
    header = f"{'V':>7} {'dtype':>9} {'mode':>8} {'variant':>18} {'peak extra MB':>14} {'time s':>8} {'mem/naive':>10} {'time/naive':>11}"
    print(header)
    results = []
    for vocab in args.vocab:
        dtype = args.dtype if args.dtype != "auto" else ("float32" if vocab <= 65536 else "bfloat16")
        logits_mb = args.batch * args.seq * vocab * torch.finfo(getattr(torch, dtype)).bits / 8 / 2**20
        for mode in args.modes:
            variants = ["naive", "selective"]
            if dtype != "float32" and mode == "forward":
                # same float32 precision as selective (forward only: its backward needs 4 float32 copies)
                variants.insert(1, "naive_fp32")
            if mode == "train":
                variants.append("selective_inplace")  # in-place only changes the backward
            if mode == "head":
                variants = ["naive", "selective_inplace", "fused"]
            rows = {v: _run(args, ["--memory-child", v], vocab, mode, dtype) for v in variants}
            times = _run(args, ["--time-child", ",".join(variants)], vocab, mode, dtype)
            for v in variants:
                rows[v]["time_s"] = times[v]
            naive = rows["naive"]
            for v in variants:
                r = rows[v]
                mem_ratio = r["peak_extra_bytes"] / max(naive["peak_extra_bytes"], 1)
                time_ratio = r["time_s"] / naive["time_s"]
                print(
                    f"{vocab:>7} {dtype:>9} {mode:>8} {v:>18} {r['peak_extra_bytes'] / 2**20:>14.0f} "
                    f"{r['time_s']:>8.3f} {mem_ratio:>10.3f} {time_ratio:>11.3f}"
                )
                results.append({"vocab": vocab, "dtype": dtype, "mode": mode, "variant": v, **r,
                                "mem_ratio": mem_ratio, "time_ratio": time_ratio})  # fmt: skip
            ours = rows["fused" if mode == "head" else "selective"]
            rel = abs(ours["checksum"] - naive["checksum"]) / max(abs(naive["checksum"]), 1.0)
            print(f"{'':>7} (logits {logits_mb:.0f} MB; ours vs naive log-prob sum rel. diff {rel:.1e})")
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
