"""pass@k and avg@k from n sampled completions per problem, with 95% intervals over problems.

For a problem with n samples of which c are correct, the unbiased estimator of pass@k (the probability that at
least one of k samples drawn without replacement is correct; Chen et al. 2021, "Evaluating Large Language Models
Trained on Code", arXiv 2107.03374, §2.1) is

    pass@k = 1 − C(n − c, k) / C(n, k)  =  1 − Π_{i = n−c+1}^{n} (1 − k / i)        (k ≤ n)

(the product form is the paper's numerically stable one). avg@n is the mean per-sample accuracy c / n (pass@1 with
n samples). Both are averaged over the P problems; the interval is the central-limit one over problems,
``mean ± 1.96·s/√P`` with s the sample standard deviation of the per-problem values (Miller 2024, "Adding Error
Bars to Evals", arXiv 2411.00640), clipped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from lmpo.eval.greedy import Z_95, judge
from lmpo.tasks import Example


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (``1 ≤ k ≤ n``)."""
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in [1, n={n}]: pass@k needs at least k samples per problem")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_interval(values: Sequence[float], z: float = Z_95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of per-problem values and its central-limit interval, clipped to [0, 1]."""
    P = len(values)
    if P == 0:
        raise ValueError("mean_interval needs at least one problem")
    mean = sum(values) / P
    if P == 1:
        return mean, 0.0, 1.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (P - 1))
    half = z * sd / math.sqrt(P)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def default_ks(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, … below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def pass_at_k_metrics(correct: Sequence[Sequence[bool]], ks: Sequence[int] | None = None,
                      prefix: str = "eval/") -> dict[str, float]:
    """Metrics of P problems with n judged samples each (``correct[p][j]``): for each k, ``pass@k`` with
    ``pass@k_low`` / ``pass@k_high``, and ``avg@n`` with its interval."""
    n = len(correct[0]) if correct else 0
    if n == 0 or any(len(row) != n for row in correct):
        raise ValueError("every problem needs the same number n >= 1 of samples")
    counts = [sum(bool(x) for x in row) for row in correct]
    out: dict[str, float] = {}
    for k in ks or default_ks(n):
        mean, lo, hi = mean_interval([pass_at_k(n, c, k) for c in counts])
        out.update({f"{prefix}pass@{k}": mean, f"{prefix}pass@{k}_low": lo, f"{prefix}pass@{k}_high": hi})
    mean, lo, hi = mean_interval([c / n for c in counts])
    out.update({f"{prefix}avg@{n}": mean, f"{prefix}avg@{n}_low": lo, f"{prefix}avg@{n}_high": hi})
    return out


def sampled_correct(model, tokenizer, examples: Sequence[Example], accuracy_fn: Callable, *, samples_per_prompt: int,
                    max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                    prompts_per_batch: int = 32, success_threshold: float = 1.0) -> tuple[list[list[bool]], list[str]]:
    """Sample ``samples_per_prompt`` completions per example (seeded) and judge them: ``(correct[p][j], texts)``."""
    from lmpo.generation import HFRollout

    n = samples_per_prompt
    engine = HFRollout(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    correct: list[list[bool]] = []
    texts: list[str] = []
    for start in range(0, len(examples), prompts_per_batch):
        batch = list(examples[start:start + prompts_per_batch])
        ro = engine.generate([e.prompt for e in batch], n, seed=seed + start)
        judged = judge([e for e in batch for _ in range(n)], ro.completions, accuracy_fn, success_threshold)
        correct.extend(judged[i * n:(i + 1) * n] for i in range(len(batch)))
        texts.extend(ro.completions)
    return correct, texts


def sampled_metrics(model, tokenizer, examples: Sequence[Example], accuracy_fn: Callable, *, samples_per_prompt: int,
                    max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                    prompts_per_batch: int = 32, success_threshold: float = 1.0) -> dict[str, float]:
    """``eval/pass@k`` (k = 1, 2, 4, … n) and ``eval/avg@n`` with their 95% intervals, from n sampled completions
    per example (the trainer's periodic evaluation with ``eval.samples_per_prompt`` = n)."""
    with torch.no_grad():
        correct, _ = sampled_correct(model, tokenizer, examples, accuracy_fn, samples_per_prompt=samples_per_prompt,
                                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                     prompts_per_batch=prompts_per_batch, success_threshold=success_threshold)
    return pass_at_k_metrics(correct)


__all__ = ["default_ks", "mean_interval", "pass_at_k", "pass_at_k_metrics", "sampled_correct", "sampled_metrics"]
