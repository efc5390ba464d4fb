"""Speed of every objective preset relative to ``grpo``, against the peers' own losses, and of the vectorised
EMA against a Python loop.

    .venv/bin/python benchmarks/objectives.py            # B=64, T=4096 on CPU
    .venv/bin/python benchmarks/objectives.py --quick    # small shapes, a smoke run

Targets: forward+backward of every preset ≤ 2.0× ``grpo`` measured in the same run; lmpo's ``cispo`` / ``sapo``
/ ``gmpo`` ≤ 1.1× verl's own ``cispo`` / ``sapo`` / ``geo_mean``, ``gspo`` ≤ 0.9× TRL's sequence-level loss
(``GRPOTrainer._compute_loss`` with ``importance_sampling_level="sequence"``) and ``grpo`` ≤ 0.5× verl's
``vanilla``, each pair configured alike and fed the same tensors; the vectorised ``token_ema`` scan ≥ 50×
faster than the naive loop over T. Repetitions of all presets (and, separately, of all peer pairs) are
interleaved (order shuffled each round) and medians are reported, so background load affects every entry
alike. The naive EMA loop runs on all B rows (no scaling: its per-step cost is mostly
dispatch overhead that does not grow with rows, so scaling a few-row timing up would flatter the scan).
The EMA comparison is reported twice: forward only (the ``local`` mode the ``ema`` preset uses runs the
scan without autograd) and forward+backward through the recurrence (``full`` mode vs the loop under
autograd). Default 1 torch thread: on a shared machine, thread hand-offs add more noise than speed.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import random
import statistics
import time

import torch

from lmpo.objectives import PRESETS, Objective
from lmpo.objectives.parts.levels import ema_loop, ema_scan


def steady_state_malloc() -> bool:
    """Keep freed heap memory mapped (glibc ``mallopt``), as a long-running training process does.

    With glibc defaults every (B, T) temporary above the mmap threshold is a fresh mapping whose pages
    fault in on first touch, and the cost of those faults (not the arithmetic) then decides the timings;
    which preset "wins" depends on the order of allocations. Raising the mmap and trim thresholds lets
    every preset reuse memory, so the ratios compare the computations. Returns False where unavailable.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(
            libc.mallopt(m_trim_threshold, 1024 * 1024 * 1024)
        )
    except (OSError, AttributeError):
        return False


def make_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(batch, length, generator=g) * 4.0
    old = logp + 0.2 * torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, generator=g) * 2.0
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {
        "logp": logp,
        "old": old,
        "adv": adv,
        "mask": mask,
        "entropy": torch.rand(batch, length, generator=g) * 2.0,
        "token_grad_norm": torch.rand(batch, length, generator=g) * 5.0,
    }


def step_fn(obj: Objective, data: dict[str, torch.Tensor]):
    kw = {}
    if "entropy" in obj.needs:
        kw["entropy"] = data["entropy"]
        if obj.adaptive_entropy:
            kw["entropy_coef"] = 0.01
    if "token_grad_norm" in obj.needs:
        kw["token_grad_norm"] = data["token_grad_norm"]

    def run() -> None:
        logp = data["logp"].clone().requires_grad_()
        loss, _stats = obj(logp, data["old"], data["adv"], data["mask"], generator=torch.Generator().manual_seed(0),
                           **kw)
        loss.backward()

    return run


def time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved_medians(fns: dict[str, object], rounds: int, seed: int = 0) -> dict[str, float]:
    """Median seconds of each function: one warm-up call each, then ``rounds`` rounds in a shuffled order, so
    that background load affects every function alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(fns)
        rng.shuffle(order)
        for name in order:
            times[name].append(time_once(fns[name]))
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_presets(batch: int, length: int, rounds: int, names: list[str] | None = None) -> dict[str, float]:
    data = make_inputs(batch, length)
    names = ["grpo"] + [n for n in (names or PRESETS) if n != "grpo"]
    return interleaved_medians({name: step_fn(Objective.preset(name), data) for name in names}, rounds)


def _trl_sequence_loss(data: dict[str, torch.Tensor]):
    """TRL 1.16's own ``GRPOTrainer._compute_loss`` (``loss_type="grpo"``, ``importance_sampling_level="sequence"``,
    GSPO's ε) on a stub ``self`` that supplies the log-probs, as tests/objectives/test_obj_trl_crosscheck.py does."""
    import types
    from collections import defaultdict

    from trl.trainer.grpo_trainer import GRPOTrainer

    batch, length = data["logp"].shape
    accelerator = types.SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                        reduce=lambda x, reduction="sum": x, sync_gradients=True)
    inputs = {"prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
              "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
              "completion_ids": torch.zeros(batch, length, dtype=torch.long),
              "completion_mask": data["mask"].long(), "advantages": data["adv"],
              "old_per_token_logps": data["old"], "num_items_in_batch": data["mask"].sum()}

    def loss(logp: torch.Tensor) -> torch.Tensor:
        stub = types.SimpleNamespace(
            _get_per_token_logps_and_entropies=lambda model, *a, **k: (logp, torch.zeros_like(logp), None),
            top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="sequence",
            beta=0.0, loss_type="grpo", epsilon_low=3e-4, epsilon_high=4e-4,
            args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
            use_vllm=False, vllm_importance_sampling_correction=False, model=types.SimpleNamespace(training=True),
            current_gradient_accumulation_steps=1, max_completion_length=length, accelerator=accelerator,
            _entropy_bonus_enabled=False, aux_loss_enabled=False,
            _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
        return GRPOTrainer._compute_loss(stub, None, inputs)

    return loss


def peer_pairs(data: dict[str, torch.Tensor]) -> dict[str, tuple[Objective, object, float, str]]:
    """name → (lmpo objective, the peer's loss as a function of logp, target ratio, peer function), every pair
    configured alike (the cross-check tests show each pair computes the same loss and gradient)."""
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    batch, length = data["logp"].shape
    adv_bt = data["adv"][:, None].expand(batch, length)  # verl takes (B, T) advantages
    mask = data["mask"]

    def verl_fn(name: str, mode: str, **config):
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=mode, **config)
        fn = getattr(core_algos, f"compute_policy_loss_{name}")
        return lambda logp: fn(data["old"], logp, adv_bt, mask, mode, cfg)[0]

    clip = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28)
    return {
        "cispo": (Objective.preset("cispo", eps_low=0.2, eps_high=0.28), verl_fn("cispo", "token-mean", **clip), 1.1,
                  "verl compute_policy_loss_cispo"),
        "sapo": (Objective.preset("sapo"), verl_fn("sapo", "seq-mean-token-mean", tau_pos=1.0, tau_neg=1.05), 1.1,
                 "verl compute_policy_loss_sapo"),
        "gmpo": (Objective.preset("gmpo"), verl_fn("geo_mean", "token-mean", clip_ratio=0.4, clip_ratio_low=0.4,
                                                    clip_ratio_high=0.4), 1.1, "verl compute_policy_loss_geo_mean"),
        "gspo": (Objective.preset("gspo"), _trl_sequence_loss(data), 0.9,
                 "TRL GRPOTrainer._compute_loss, sequence level"),
        "grpo": (Objective.preset("grpo"), verl_fn("vanilla", "seq-mean-token-mean", clip_ratio=0.2), 0.5,
                 "verl compute_policy_loss_vanilla"),
    }


def bench_peers(batch: int, length: int, rounds: int) -> dict[str, tuple[float, float, float, str]] | None:
    """Median seconds of each lmpo objective and its peer's loss, all interleaved: name → (lmpo, peer, target,
    peer). None when TRL or verl is not installed."""
    try:
        data = make_inputs(batch, length)
        pairs = peer_pairs(data)
    except ImportError:
        return None
    fns = {}
    for name, (objective, peer, _, _) in pairs.items():
        fns[f"lmpo {name}"] = step_fn(objective, data)

        def run_peer(peer=peer) -> None:
            peer(data["logp"].clone().requires_grad_()).backward()

        fns[f"peer {name}"] = run_peer
    medians = interleaved_medians(fns, rounds, seed=1)
    return {name: (medians[f"lmpo {name}"], medians[f"peer {name}"], target, peer)
            for name, (_, _, target, peer) in pairs.items()}


def bench_ema(batch: int, length: int, rounds: int, beta: float) -> dict[str, float]:
    """Median seconds: scan vs naive loop, forward only and forward+backward (full gradient)."""
    data = make_inputs(batch, length)
    w = torch.exp(data["logp"] - data["old"])
    valid = data["mask"]
    cot = torch.randn(batch, length, generator=torch.Generator().manual_seed(1))

    def fwd_bwd(fn):
        def run() -> None:
            leaf = w.clone().requires_grad_()
            fn(leaf, valid, beta).backward(cot)

        return run

    def fwd(fn):
        def run() -> None:
            with torch.no_grad():
                fn(w, valid, beta)

        return run

    cases = {
        "scan_fwd": (fwd(ema_scan), rounds),
        "loop_fwd": (fwd(ema_loop), 3),
        "scan_fwd_bwd": (fwd_bwd(ema_scan), rounds),
        "loop_fwd_bwd": (fwd_bwd(ema_loop), 3),
    }
    out = {}
    for name, (fn, reps) in cases.items():
        fn()
        out[name] = statistics.median(time_once(fn) for _ in range(reps))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="sequences B")
    parser.add_argument("--length", type=int, default=4096, help="response tokens T")
    parser.add_argument("--rounds", type=int, default=41, help="interleaved repetitions per preset")
    parser.add_argument("--quick", action="store_true", help="B=8, T=512, 5 rounds")
    parser.add_argument("--presets", nargs="*", default=None, help="only these presets (grpo always runs)")
    parser.add_argument("--skip-ema", action="store_true", help="skip the EMA scan-vs-loop comparison")
    parser.add_argument("--skip-peers", action="store_true", help="skip the comparison with TRL's and verl's losses")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 by default: on a shared machine, thread hand-offs "
                             "between busy cores add noise that swamps the ratios)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="keep glibc's default mmap/trim thresholds (page faults then dominate; noisier)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steady = False if args.default_malloc else steady_state_malloc()
    if args.quick:
        args.batch, args.length, args.rounds = 8, 512, 5
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={args.batch}, T={args.length}, "
          f"{args.rounds} interleaved rounds, forward+backward, float32 CPU, "
          f"{'steady-state malloc (mmap/trim thresholds raised)' if steady else 'default malloc'}")
    medians = bench_presets(args.batch, args.length, args.rounds, args.presets)
    base = medians["grpo"]
    print("\n| preset | median ms | ratio to grpo | ≤ 2.0× |\n|---|---|---|---|")
    worst = 0.0
    for name, t in medians.items():
        ratio = t / base
        worst = max(worst, ratio)
        print(f"| `{name}` | {t * 1e3:.1f} | {ratio:.2f} | {'yes' if ratio <= 2.0 else 'NO'} |")
    print(f"\nworst preset ratio: {worst:.2f} (target ≤ 2.0: {'met' if worst <= 2.0 else 'NOT met'})")
    if not args.skip_peers:
        peers = bench_peers(args.batch, args.length, args.rounds)
        if peers is None:
            print("\npeer comparison skipped: install TRL and verl (pip install 'lmpo[trl,verl]')")
        else:
            print("\nlmpo vs the peers' own losses on the same tensors (forward+backward, interleaved)")
            print("| lmpo | peer | lmpo ms | peer ms | lmpo / peer | target | met |\n|---|---|---|---|---|---|---|")
            for name, (ours, theirs, target, peer) in peers.items():
                ratio = ours / theirs
                print(f"| `{name}` | {peer} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ratio:.2f} | ≤ {target} | "
                      f"{'yes' if ratio <= target else 'NO'} |")
    if args.skip_ema:
        return
    beta = Objective.preset("ema").ema_beta
    ema = bench_ema(args.batch, args.length, max(5, args.rounds), beta)
    print(f"\nEMA scan vs naive Python loop over T, β={beta}, B={args.batch}, T={args.length} (loop on all rows)")
    print("| pass | vectorised scan ms | naive loop ms | speed-up | ≥ 50× |\n|---|---|---|---|---|")
    for label, key in (("forward (local mode)", "fwd"), ("forward+backward (full mode)", "fwd_bwd")):
        fast, slow = ema[f"scan_{key}"], ema[f"loop_{key}"]
        print(f"| {label} | {fast * 1e3:.1f} | {slow * 1e3:.1f} | {slow / fast:.0f}× | "
              f"{'yes' if slow / fast >= 50 else 'NO'} |")


if __name__ == "__main__":
    main()
