"""Steps per second of ``CharTextEnv`` with every reward on, on one CPU core, and where the time goes.

    .venv/bin/python benchmarks/textenv.py [CORPUS] [--steps 50000] [--pretrain-steps 300]

CORPUS defaults to ``../shared/data/lunyu.simplified.json`` (relative to the repository). The agent
plays uniformly random legal actions (mask → ``flatnonzero`` → random index, included in the timing,
as any agent must read the mask). Reported, all measured in this one run:

1. steps/s with all rewards on (coverage, InfoNCE, bigram bonus, garble, illegal, EMA standardisation,
   potential shaping), target ≥ 5,000;
2. the share of step time per component, from ``perf_counter`` wrappers around the component calls
   (a second, instrumented run; the wrappers' own overhead lands in "env core");
3. steps/s with each reward switched off in turn (ablation), as ratios to the all-on figure.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from lmpo.textagent.env import CharTextEnv, EnvConfig

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "lunyu.simplified.json"


def run(env: CharTextEnv, steps: int, seed: int = 0) -> float:
    """Steps per second of a random-legal-action loop (auto-reset on episode end)."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        legal = np.flatnonzero(obs["legal_mask"])
        obs, _, terminated, truncated, _ = env.step(int(legal[rng.integers(len(legal))]))
        if terminated or truncated:
            obs, _ = env.reset()
    return steps / (time.perf_counter() - t0)


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr)
        acc = self.seconds
        acc.setdefault(name, 0.0)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            acc[name] += time.perf_counter() - t
            return out

        setattr(obj, attr, timed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "corpus", nargs="?", default=str(DEFAULT_CORPUS), help="corpus path (.txt/.json/directory)"
    )
    p.add_argument("--steps", type=int, default=50_000, help="environment steps per measurement")
    p.add_argument(
        "--pretrain-steps", type=int, default=300, help="InfoNCE encoder training steps before timing"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    base_kwargs = dict(nce_pretrain_steps=args.pretrain_steps, potential_coef=0.1)
    t = time.perf_counter()
    env = CharTextEnv(text=args.corpus, config=EnvConfig(**base_kwargs))
    build_s = time.perf_counter() - t
    print(
        f"corpus {args.corpus}: {len(env.chapters)} train chapters, {sum(map(len, env.chapters))} characters, "
        f"A = {len(env.alphabet)} actions, lexicon {len(env.lexicon)} bigrams; env built in {build_s:.2f} s "
        f"(InfoNCE pretraining {args.pretrain_steps} steps included)"
    )
    run(env, 2_000)  # warm-up: caches of reference keys, first-call overheads
    all_on = run(env, args.steps)
    print(
        f"\nall rewards on, 1 thread: {all_on:,.0f} steps/s  (target >= 5,000: {'met' if all_on >= 5000 else 'NOT met'})"
    )

    timer = _Timer()
    timer.wrap(env._coverage, "push", "coverage")
    timer.wrap(env._scorer, "score", "infonce")
    timer.wrap(env.norm_cov, "update", "ema standardisation")
    timer.wrap(env.norm_nce, "update", "ema standardisation")
    timer.wrap(env, "_update_mask", "legal mask")
    timer.wrap(env, "_obs", "observation")
    t0 = time.perf_counter()
    instrumented = run(env, args.steps)
    total = time.perf_counter() - t0
    print(f"\nshare of loop time (instrumented run, {instrumented:,.0f} steps/s):")
    parts = dict(timer.seconds)
    parts["env core + bonus + garble + info + action sampling"] = total - sum(parts.values())
    for name, sec in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<52s} {sec / total:6.1%}  ({sec / args.steps * 1e6:6.1f} µs/step)")

    print("\nablation (one reward off at a time; ratio to all-on measured above):")
    for flag in ("use_infonce", "use_coverage", "use_bigram_bonus", "use_normalisation"):
        cfg = EnvConfig(**base_kwargs, **{flag: False})
        e = CharTextEnv(text=args.corpus, config=cfg, lexicon=env.lexicon, encoder=env.encoder)
        run(e, 2_000)
        sps = run(e, args.steps)
        print(f"  {flag}=False: {sps:,.0f} steps/s  ({sps / all_on:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
