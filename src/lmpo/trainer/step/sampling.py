"""DAPO's dynamic sampling and the masking of truncated completions, the trainer's side of both.

Dynamic sampling (Yu et al. 2025, arXiv:2503.14476, §3.2, eq. (11): ``0 < |{o_i : is_equivalent(a, o_i)}| < G``):
a group whose G completions all score the same carries no GRPO-style learning signal (every advantage is 0), so
the step draws batches of ``prompts_per_step`` prompts until ``prompts_per_step`` groups with non-zero variance
are in hand, and trains on exactly those (the first ones, in draw order; the surplus is dropped). Peer: verl
``RayPPOTrainer.fit`` with ``algorithm.filter_groups`` (trainer/ppo/ray_trainer.py, recipe/dapo): it keeps
groups whose metric (``acc`` in the DAPO recipe, or the sequence reward) has non-zero std, counts generation
batches, and raises once ``max_num_gen_batches`` (> 0) batches did not fill the batch (0 = no limit). lmpo
does the same: :func:`dynamic_sample` raises :class:`lmpo.errors.RunError` naming
``rollout.dynamic_sampling_max_draws``.

Masking truncated completions (TRL ``GRPOConfig.mask_truncated_completions``, trainer/grpo_trainer.py): a
completion that reached ``max_new_tokens`` without EOS keeps its reward and its place in its group's advantage
statistics, but its tokens get loss mask 0, so it contributes nothing to the loss nor to the token count of a
token-mean loss (DAPO §3.4 "overlong filtering").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lmpo.errors import RunError
from lmpo.generation import Rollout, concat_rollouts, select_rows
from lmpo.objectives.advantages import zero_variance_mask


def seed_for(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix-style), so nearby steps get unrelated streams."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h ^= (int(p) + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2)) & 0xFFFFFFFFFFFFFFFF
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


class PromptOrder:
    """The order prompts are drawn in: a seeded permutation of the training examples per data epoch, walked
    ``take(n)`` at a time; its position (``state_dict``) is saved in checkpoints, so a resumed run draws on."""

    def __init__(self, examples: Sequence, seed: int) -> None:
        self.examples, self.seed = examples, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed_for(self.seed, epoch, 4))
        return torch.randperm(len(self.examples), generator=gen).tolist()

    def take(self, n: int) -> list:
        """The next ``n`` examples (into the next data epoch's permutation when this one runs out)."""
        out = []
        while len(out) < n:
            if self.pos >= len(self._perm):
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            out.append(self.examples[self._perm[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._perm = self._permutation(self.epoch)


@dataclass
class ScoredRollout:
    """One draw: N prompts, their B = N·G completions and the completions' rewards.

    examples: N task examples (the rollout's group i is ``examples[i]``).
    rewards: (B,) total reward; per_fn: name → (B,) unweighted score; correct: (B,) float 0/1 accuracy.
    reward_errors: reward-function calls skipped (``rewards.on_error: skip``); reward_nonfinite: reward values that
    were NaN, infinite or out of range, scored as undefined (``rewards.on_error: skip``).
    """

    examples: list
    rollout: Rollout
    rewards: torch.Tensor
    per_fn: dict[str, torch.Tensor]
    correct: torch.Tensor
    reward_errors: float = 0.0
    reward_nonfinite: float = 0.0
    episodes: list | None = None  # multi-turn: the B episodes of the rows (kept through selection and concatenation)

    def select_groups(self, groups: torch.Tensor, completions_per_prompt: int) -> ScoredRollout:
        """The draw restricted to ``groups`` (K,) long group indices, in that order."""
        G = completions_per_prompt
        rows = (groups[:, None] * G + torch.arange(G, device=groups.device)).reshape(-1)
        r_rows = rows.to(self.rewards.device)
        listed = groups.tolist()
        return ScoredRollout(
            examples=[self.examples[i] for i in listed], rollout=select_rows(self.rollout, rows),
            rewards=self.rewards[r_rows], per_fn={k: v[rows.to(v.device)] for k, v in self.per_fn.items()},
            correct=self.correct[rows.to(self.correct.device)], reward_errors=self.reward_errors,
            reward_nonfinite=self.reward_nonfinite,
            episodes=None if self.episodes is None else [self.episodes[i] for i in rows.tolist()])


def concat_scored(parts: Sequence[ScoredRollout], pad_token_id: int) -> ScoredRollout:
    """Several draws as one batch, in order (groups renumbered)."""
    if len(parts) == 1:
        return parts[0]
    names = list(parts[0].per_fn)
    return ScoredRollout(
        examples=[e for p in parts for e in p.examples],
        rollout=concat_rollouts([p.rollout for p in parts], pad_token_id),
        rewards=torch.cat([p.rewards for p in parts]),
        per_fn={k: torch.cat([p.per_fn[k] for p in parts]) for k in names},
        correct=torch.cat([p.correct for p in parts]),
        reward_errors=sum(p.reward_errors for p in parts),
        reward_nonfinite=sum(p.reward_nonfinite for p in parts),
        episodes=None if any(p.episodes is None for p in parts) else [e for p in parts for e in p.episodes],
    )


def informative_groups(values: torch.Tensor, completions_per_prompt: int) -> torch.Tensor:
    """(N,) bool: group i (rows i·G … i·G+G−1 of ``values`` (B,)) has at least two different values."""
    G = completions_per_prompt
    group = torch.arange(values.numel() // G, device=values.device).repeat_interleave(G)
    return ~zero_variance_mask(values, group).view(-1, G)[:, 0]


def dynamic_sample(draw: Callable[[int], ScoredRollout], groups_wanted: int, completions_per_prompt: int, *,
                   metric: str = "reward", max_draws: int = 0, pad_token_id: int = 0
                   ) -> tuple[ScoredRollout, dict[str, float]]:
    """Call ``draw(k)`` (k = 0, 1, …) until ``groups_wanted`` groups of non-zero ``metric`` variance are in hand;
    returns exactly those groups (the first ones in draw order) and the ``rollout/*`` counts (``METRIC_DOCS``).

    metric: ``"reward"`` (the total reward) or ``"accuracy"`` (``correct``, as DAPO's paper and verl's recipe).
    max_draws: raise :class:`RunError` once this many draws did not fill the batch (0 = no limit, verl's
    ``max_num_gen_batches``).
    """
    if metric not in ("reward", "accuracy"):
        raise ValueError(f"metric={metric!r} must be 'reward' or 'accuracy'")
    G = completions_per_prompt
    kept: list[ScoredRollout] = []
    n_kept = n_dropped = n_drawn = draws = 0
    errors = nonfinite = 0.0  # reward-function calls skipped and values refused in every draw, kept or not
    while n_kept < groups_wanted:
        if max_draws and draws >= max_draws:
            raise RunError(
                f"dynamic sampling drew {draws} batches of prompts (`rollout.dynamic_sampling_max_draws` = "
                f"{max_draws}) and found only {n_kept} of the {groups_wanted} groups with non-zero "
                f"{metric} variance it needs ({n_dropped} of {n_drawn} groups drawn had all-equal values). The "
                "task is too hard or too easy for the policy, or the reward too coarse: raise "
                "rollout.dynamic_sampling_max_draws (0 = no limit), raise rollout.completions_per_prompt, use "
                "dynamic_sampling_metric: reward with a finer-grained reward, or turn rollout.dynamic_sampling off.")
        scored = draw(draws)
        draws += 1
        errors += scored.reward_errors
        nonfinite += scored.reward_nonfinite
        ok = informative_groups(scored.rewards if metric == "reward" else scored.correct, G)
        n_drawn += int(ok.numel())
        good = torch.nonzero(ok).squeeze(-1)
        n_dropped += int(ok.numel()) - int(good.numel())
        take = good[: groups_wanted - n_kept]
        if take.numel():
            kept.append(scored.select_groups(take, G))
            n_kept += int(take.numel())
    batch = concat_scored(kept, pad_token_id)
    batch.reward_errors, batch.reward_nonfinite = errors, nonfinite
    stats = {"rollout/draws": float(draws), "rollout/groups_kept": float(n_kept),
             "rollout/groups_dropped": float(n_dropped),
             "rollout/groups_surplus": float(n_drawn - n_dropped - n_kept),
             "rollout/zero_var_frac": n_dropped / max(n_drawn, 1)}
    return batch, stats


def mask_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask with truncated rows zeroed, fraction of rows zeroed)``; mask (B, T) bool, truncated (B,) bool."""
    truncated = truncated.to(mask.device)
    frac = truncated.float().mean() if truncated.numel() else mask.new_zeros((), dtype=torch.float32)
    return mask & ~truncated[:, None], frac
