"""Updates per second of the SAC critic + actor step: top-p candidates vs Q on every legal action.

Side by side in one process, same batch, same initial weights:
* ``top_p``: the soft backup and the policy loss evaluate Q only on the top-p set (p = 0.98, K_max = 64;
  the context part of the Q head is computed once per state, the action part once per candidate);
* ``full``: both evaluate Q on every legal action (the action part once for all states).
Equality check: with p = 1 and K_max = |Σ| the top-p path must give the same losses and the same
updated weights as the full path.

    .venv/bin/python benchmarks/sac_update.py                 # |Σ| = 1400 and 5000, batch 256
    .venv/bin/python benchmarks/sac_update.py --net cpu       # the CPU-preset network
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lmpo.textagent.sac.agent import SACAgent
from lmpo.textagent.sac.config import NetworkConfig, SACConfig
from lmpo.textagent.sac.replay import ReplaySample

NETS = {
    "default": NetworkConfig(),  # seed 004 §9: d = 128, GRU 256
    "cpu": NetworkConfig(embed_dim=64, gru_hidden=128, q_hidden=128, action_embed_dim=64),
}


def make_batch(A: int, B: int, M: int, seed: int) -> ReplaySample:
    g = torch.Generator().manual_seed(seed)
    legal = torch.rand(B, A, generator=g) > 0.02  # a few illegal actions per state
    legal[:, 1] = True
    nlegal = torch.rand(B, A, generator=g) > 0.02
    nlegal[:, 1] = True
    action = torch.randint(3, A, (B,), generator=g)
    legal[torch.arange(B), action] = True
    return ReplaySample(
        obs=torch.randint(3, A, (B, M), generator=g), legal=legal, action=action,
        reward=torch.randn(B, generator=g), next_obs=torch.randint(3, A, (B, M), generator=g),
        next_legal=nlegal, terminated=(torch.rand(B, generator=g) < 0.05).float(),
        truncated=torch.zeros(B), is_demo=torch.rand(B, generator=g) < 0.25, teacher_action=action,
        is_relabeled=torch.zeros(B, dtype=torch.bool),
    )


def make_agent(A: int, net: NetworkConfig, sac: SACConfig, peaked: bool = True) -> SACAgent:
    agent = SACAgent(A, 0, net, sac, seed=0)
    if peaked:
        # a trained policy is peaked: give the head a Zipf-like prior so the top-p set is realistic
        with torch.no_grad():
            ranks = torch.arange(1, A + 1, dtype=torch.float32)
            agent.policy.head[-1].bias.copy_(-1.5 * ranks.log() * 2)
    return agent


def time_interleaved(agents: list[SACAgent], batch: ReplaySample, repeats: int) -> tuple[list[float], list[dict]]:
    """Updates/s per agent from the median of ``repeats`` single updates, taken in turn (agent 1, 2, 3, 1, …)
    so that a load change on a shared machine hits every setting alike."""
    stats = [a.update(batch) for a in agents]  # warm-up
    times: list[list[float]] = [[] for _ in agents]
    for _ in range(repeats):
        for i, a in enumerate(agents):
            t0 = time.perf_counter()
            stats[i] = a.update(batch)
            times[i].append(time.perf_counter() - t0)
    return [1.0 / statistics.median(t) for t in times], stats


def equality_check(A: int, B: int, M: int, net: NetworkConfig) -> dict[str, float]:
    batch = make_batch(A, B, M, seed=1)
    common = dict(top_p_auto_raise=False, use_cql=True, cql_mode="sampled", cql_samples=16)
    a = make_agent(A, net, SACConfig(use_top_p=True, top_p=1.0, top_p_k_max=A, **common), peaked=True)
    b = make_agent(A, net, SACConfig(use_top_p=False, **common), peaked=True)
    sa, sb = a.update(batch), b.update(batch)
    pa = torch.cat([p.detach().flatten() for p in list(a.policy.parameters()) + list(a.critic.parameters())])
    pb = torch.cat([p.detach().flatten() for p in list(b.policy.parameters()) + list(b.critic.parameters())])
    def rel(key: str) -> float:
        return abs(float(sa[key] - sb[key])) / max(1e-12, abs(float(sb[key])))

    # (Adam's first step is ≈ lr·sign(g), so a float-rounding difference in a near-zero gradient moves a
    # weight by up to lr: the weight difference is bounded by lr, the losses agree to float precision)
    return {
        "critic_loss_rel_diff": rel("losses/critic"),
        "policy_loss_rel_diff": rel("losses/policy"),
        "next_v_rel_diff": rel("value/next_v_mean"),
        "param_max_abs_diff": float((pa - pb).abs().max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actions", default="1400,5000", help="|Σ| values, comma-separated")
    ap.add_argument("--batch", type=int, default=256, help="transitions per update")
    ap.add_argument("--window", type=int, default=32, help="observation window (characters)")
    ap.add_argument("--repeats", type=int, default=5, help="timed updates per setting (median)")
    ap.add_argument("--net", default="default", choices=sorted(NETS))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    net = NETS[args.net]
    print(f"net={args.net} ({net}), batch={args.batch}, window={args.window}, threads={torch.get_num_threads()}")
    print("top-p: p=0.98, K_max=64, peaked π (Zipf prior); top-p@128: flat π, so the K_max=128 cap binds")
    print(f"{'|Σ|':>6} {'top-p upd/s':>12} {'|P| mean':>9} {'coverage':>9} {'top-p@128 upd/s':>16} "
          f"{'full upd/s':>11} {'speed-up':>9} {'speed-up@128':>13}")
    for A in [int(x) for x in args.actions.split(",")]:
        batch = make_batch(A, args.batch, args.window, seed=0)
        sac_common = dict(top_p_auto_raise=False, cql_mode="sampled", cql_samples=64)
        top = make_agent(A, net, SACConfig(use_top_p=True, top_p=0.98, top_p_k_max=64, **sac_common), True)
        full = make_agent(A, net, SACConfig(use_top_p=False, **sac_common), True)
        flat = make_agent(A, net, SACConfig(use_top_p=True, top_p=0.98, top_p_k_max=128, **sac_common), False)
        (ups_top, ups_flat, ups_full), (st, _, _) = time_interleaved([top, flat, full], batch, args.repeats)
        print(f"{A:6d} {ups_top:12.3f} {float(st['policy/top_p_set_size']):9.1f} "
              f"{float(st['policy/top_p_coverage']):9.3f} {ups_flat:16.3f} {ups_full:11.3f} "
              f"{ups_top / ups_full:8.2f}x {ups_flat / ups_full:12.2f}x", flush=True)
    for A in [int(x) for x in args.actions.split(",")]:
        eq = equality_check(A, min(args.batch, 64), args.window, net)
        print(f"p=1, K_max=|Σ|={A} vs full (one update, same init): " + ", ".join(f"{k} {v:.2e}" for k, v in eq.items()))


if __name__ == "__main__":
    main()
