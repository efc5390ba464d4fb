"""Steps per second of a toy RL loop with generation in a worker process (``AsyncRollout``) against the same loop
generating in process, side by side in one run on the same cores.

    PYTHONPATH=src .venv/bin/python benchmarks/async_rollout.py [--model tiny] [--tokens 64] [--rounds 5]

One step: N prompts × G completions of ``--tokens`` tokens (EOS ignored, so every setting does the same work),
then a training step of the policy on them: a no-grad forward (the behaviour log-probs), a forward and backward
of a clipped-ratio loss on group-normalised rewards, an AdamW step. Settings, run in turn ``--rounds`` times
(each round ``--steps`` timed steps per setting; the engines and their workers are made once, warmed up, and kept):

- ``sync 2 threads``: generation and training in this process, torch on both cores (today's loop);
- ``sync 1 thread``:  the same on one core;
- ``async k=0``:      generation in the worker (1 thread), training here (1 thread), one after the other: the cost
  of the process boundary and of the weight push;
- ``async k=1``:      the same with step t generated on the weights of step t − 1 while step t − 1 trains: the overlap
  (each timed block pays the pipeline fill of its first step, which a real run pays once).

Prints steps/s per setting (median over rounds, with min–max) and the ratios of async k=1 to each synchronous
setting; the last line is the ratio async k=1 / sync 2 threads.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from lmpo.generation import HFRollout, policy_logprobs
from lmpo.generation.worker import AsyncRollout
from lmpo.models import load_model_and_tokenizer


def prompts_of(step: int, n: int) -> list[str]:
    return [f"{(7 * step + 3 * i) % 90 + 10}+{(5 * step + 11 * i) % 90 + 10}=" for i in range(n)]


def train_step(model, optimizer, ro, group: int) -> None:
    """A clipped-ratio policy-gradient step on the rollout (the work of a trainer step after generation)."""
    reward = torch.tensor([sum(c.isdigit() for c in text) / max(len(text), 1) for text in ro.completions])
    grouped = reward.view(-1, group)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1, 1)
    mask = ro.completion_mask.float()
    old = policy_logprobs(model, ro.input_ids, ro.attention_mask, ro.completion_ids, with_grad=False).logp
    model.train()
    logp = policy_logprobs(model, ro.input_ids, ro.attention_mask, ro.completion_ids).logp
    ratio = torch.exp(logp - old)
    loss = -(torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


class SyncLoop:
    def __init__(self, name: str, model, tokenizer, threads: int, args) -> None:
        self.name, self.model, self.threads, self.args = name, model, threads, args
        self.engine = HFRollout(model, tokenizer, max_new_tokens=args.tokens, ignore_eos=True)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.step = 0

    def run(self, steps: int) -> float:
        torch.set_num_threads(self.threads)
        t0 = time.perf_counter()
        for _ in range(steps):
            ro = self.engine.generate(prompts_of(self.step, self.args.prompts), self.args.group, seed=self.step)
            train_step(self.model, self.optimizer, ro, self.args.group)
            self.step += 1
        return steps / (time.perf_counter() - t0)

    def close(self) -> None:
        pass


class AsyncLoop:
    """The training loop's use of ``AsyncRollout``: prefetch k + 1 steps, then result → train → push → submit.

    Each timed block fills the pipeline itself (submits its first k + 1 steps) and leaves nothing submitted, so no
    generation happens outside the block's own time (while another setting runs): a block of S steps pays the
    k-step fill that a real run pays once, a conservative measure of the overlap.
    """

    def __init__(self, name: str, model, staleness: int, args) -> None:
        self.name, self.model, self.k, self.args = name, model, staleness, args
        factory = functools.partial(load_model_and_tokenizer, args.model)
        self.engine = AsyncRollout(factory, model, staleness=staleness, threads=1, max_new_tokens=args.tokens,
                                   ignore_eos=True)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.step = 0
        self.wait_share: list[float] = []  # per timed block: the share of its time spent waiting for the worker

    def _request(self, step: int) -> tuple[list[str], int, int]:
        return prompts_of(step, self.args.prompts), self.args.group, step

    def run(self, steps: int) -> float:
        torch.set_num_threads(1)
        waited = self.engine.wait_s
        last = self.step + steps - 1
        t0 = time.perf_counter()
        for _ in range(steps):
            ro = self.engine.rollout_for(self.step, self._request, last_step=last)
            train_step(self.model, self.optimizer, ro, self.args.group)
            self.engine.push_weights(self.model)
            self.step += 1
        elapsed = time.perf_counter() - t0
        self.wait_share.append((self.engine.wait_s - waited) / elapsed)
        return steps / elapsed

    def close(self) -> None:
        self.engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="built-in model preset")
    p.add_argument("--tokens", type=int, default=64, help="completion tokens (max_new_tokens, EOS ignored)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (N)")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    p.add_argument("--steps", type=int, default=6, help="timed steps per setting and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per setting first")
    args = p.parse_args()

    def model():
        return load_model_and_tokenizer(args.model, seed=0)

    loops = []
    m, tok = model()
    loops.append(SyncLoop("sync 2 threads", m, tok, 2, args))
    m, tok = model()
    loops.append(SyncLoop("sync 1 thread", m, tok, 1, args))
    loops.append(AsyncLoop("async k=0", model()[0], 0, args))
    loops.append(AsyncLoop("async k=1", model()[0], 1, args))
    try:
        for loop in loops:
            loop.run(args.warmup)
        rates: dict[str, list[float]] = {loop.name: [] for loop in loops}
        for _ in range(args.rounds):
            for loop in loops:
                rates[loop.name].append(loop.run(args.steps))
    finally:
        for loop in loops:
            loop.close()

    print(f"model {args.model}, {args.prompts} prompts x {args.group} completions x {args.tokens} tokens, "
          f"{args.rounds} rounds x {args.steps} steps per setting (median, min-max)")
    med = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"  {name:15s} {med[name]:6.3f} steps/s  ({min(r):.3f}-{max(r):.3f})")
    for loop in loops:
        if isinstance(loop, AsyncLoop):
            shares = loop.wait_share[1:]  # (the first block is the warm-up)
            print(f"  {loop.name}: the trainer waited for the worker {100 * statistics.median(shares):.0f}% of "
                  "the time")
    print(f"async k=0 / sync 1 thread: {med['async k=0'] / med['sync 1 thread']:.2f}")
    print(f"async k=1 / sync 1 thread: {med['async k=1'] / med['sync 1 thread']:.2f}")
    print(f"async k=1 / sync 2 threads: {med['async k=1'] / med['sync 2 threads']:.2f}")


if __name__ == "__main__":
    main()
