"""Supervised warm-up (the usual SFT → RL pipeline): on a task's reference answers, or on an environment's expert
episodes.

Each step draws ``seqs_per_step`` examples with a seeded generator, builds ``prompt ‖ answer ‖ EOS``
(left-padded, like generation) and minimises the mean token cross-entropy of the answer tokens only::

    L = − Σ_{b,t} m_{b,t} log π(y_{b,t} | x_b, y_{b,<t}) / Σ m          m = 1 on answer tokens and EOS

On an environment (``env.id``) the sequence is a demonstration episode played by the environment's expert
(``expert_action``) through the episode driver, ``opening ‖ turn 0 ‖ observation 0 ‖ turn 1 ‖ …``, token for token
what a sampled episode of the same turns would be, and m = 1 on the expert's tokens (its turns and their stop
tokens), 0 on the opening and the observations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lmpo.errors import InputError
from lmpo.generation import position_ids_from_mask
from lmpo.tasks import Example, Task
from lmpo.trainer.config import SFTConfig


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``prompt ‖ completion ‖ EOS`` batches.

    Returns input_ids (B, L), attention_mask (B, L) and loss_mask (B, L), the last 1 on completion tokens
    and EOS (the positions whose token is predicted by the previous position).
    """
    seqs, lossm = [], []
    for p, c in zip(prompts, completions):
        p_ids = tokenizer(p)["input_ids"]
        c_ids = tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p_ids + c_ids)
        lossm.append([0] * len(p_ids) + [1] * len(c_ids))
    L = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    lm = torch.zeros((len(seqs), L), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(seqs, lossm)):
        ids[i, L - len(s):] = torch.tensor(s)
        attn[i, L - len(s):] = 1
        lm[i, L - len(s):] = torch.tensor(m, dtype=torch.bool)
    return ids.to(device), attn.to(device), lm.to(device)


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions of ``loss_mask`` (B, L)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits
    logits = logits[:, :-1]  # (B, L-1, V): position t predicts token t+1
    target = input_ids[:, 1:]
    m = loss_mask[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits[m].float(), target[m])
    return ce


def supervised_warmup(model, tokenizer, task: Task, examples: list[Example], cfg: SFTConfig, *, seed: int,
                      device: torch.device, log=None, accuracy_check=None) -> list[float]:
    """Train ``model`` in place for up to ``cfg.steps`` steps; returns the loss of each step.

    ``accuracy_check()`` (greedy accuracy on training prompts) is called every ``cfg.check_every_steps`` when
    ``cfg.stop_at_accuracy > 0``; the warm-up stops as soon as it reaches that accuracy.
    """
    pool = examples[: cfg.max_examples] if cfg.max_examples > 0 else examples

    def batch(rows: list[int]):
        chosen = [pool[i] for i in rows]
        return encode_pairs(tokenizer, [e.prompt for e in chosen], [task.reference_completion(e) for e in chosen],
                            device)

    return train_steps(model, cfg, len(pool), batch, seed=seed, log=log, accuracy_check=accuracy_check)


def train_steps(model, cfg: SFTConfig, pool_size: int, batch: Callable[[list[int]], tuple], *, seed: int, log=None,
                accuracy_check=None) -> list[float]:
    """The warm-up loop: ``cfg.steps`` AdamW steps, each on ``batch(rows)`` for ``cfg.seqs_per_step`` rows drawn
    uniformly from ``range(pool_size)`` with a seeded generator; ``batch`` returns ``(input_ids, attention_mask,
    loss_mask)``, each (B, L). Learning rate ``cfg.lr × min(1, (s + 1) / warmup_steps) [× (1 − s / steps)]`` at
    step s (the second factor under ``schedule: linear``). Returns the loss of each step."""
    if cfg.steps <= 0:
        return []
    gen = torch.Generator().manual_seed(seed + 7_919)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(cfg, s))
    model.train()
    losses = []
    for step in range(cfg.steps):
        rows = torch.randint(pool_size, (cfg.seqs_per_step,), generator=gen).tolist()
        loss = sft_loss(model, *batch(rows))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if log is not None and (step + 1) % max(1, cfg.steps // 5) == 0:
            log(f"sft step {step + 1}/{cfg.steps}: loss {losses[-1]:.4f}")
        if accuracy_check is not None and cfg.stop_at_accuracy > 0 and (step + 1) % cfg.check_every_steps == 0:
            acc = accuracy_check()
            model.train()
            if acc >= cfg.stop_at_accuracy:
                if log is not None:
                    log(f"sft step {step + 1}: training-prompt greedy accuracy {acc:.3f} >= "
                        f"{cfg.stop_at_accuracy}; warm-up done")
                break
    return losses


def _lr_factor(cfg: SFTConfig, step: int) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
    return warm * (1 - step / cfg.steps) if cfg.schedule == "linear" else warm


# ----------------------------------------------------------------------------------------------------
# multi-turn: expert episodes
# ----------------------------------------------------------------------------------------------------


def demonstration_sources(n: int, sources: Sequence) -> list[int]:
    """Which source demonstrates each of ``n`` examples: 0 for ``env.options`` as they are, k for
    ``sources[k − 1]`` (a ``DemonstrationSource``). Source k takes ``round(fraction · n)`` of the examples not yet
    taken, spread evenly over them (so that every source covers the whole range of the pool)."""
    owner = [0] * n
    free = list(range(n))
    for k, source in enumerate(sources, 1):
        count = min(len(free), round(source.fraction * n))
        if count <= 0:
            continue
        picked = {free[p] for p in torch.linspace(0, len(free) - 1, count).round().long().tolist()}
        for row in picked:
            owner[row] = k
        free = [row for row in free if row not in picked]
    return owner


class Demonstrations:
    """Expert episodes of an environment section's examples, played on first use and kept: source, token-exact
    rendering and budgets as in ``lmpo.trainer.step.multiturn`` (``EpisodeRunner(expert=True)``).

    A demonstration that a budget cuts raises InputError naming ``env.budget.<field>``, its value and what the
    expert needed (:func:`lmpo.envs.checker.expert_budget_problem`); ``unsuccessful`` counts those that ended
    without success.
    """

    def __init__(self, tokenizer, env, examples: Sequence[Example], sources: Sequence = (), *, seed: int,
                 sft_steps: int = 0) -> None:
        from lmpo.generation.episodes import EpisodeRunner
        from lmpo.trainer.step.multiturn import env_factory

        self.env, self.examples, self.seed, self.sft_steps = env, list(examples), seed, sft_steps
        self.owner = demonstration_sources(len(self.examples), sources)
        self.factories = [env_factory(env)] + [env_factory(env, source.options) for source in sources]
        self.runner = EpisodeRunner(None, tokenizer, env.budget, chat_template=env.chat_template,
                                    step_timeout_s=env.step_timeout_s)
        self.tokenizer = tokenizer
        self.episodes: dict[int, object] = {}
        self.unsuccessful = 0

    def __getitem__(self, row: int):
        if row not in self.episodes:
            self.episodes[row] = self._play(row)
        return self.episodes[row]

    def _play(self, row: int):
        from lmpo.envs.checker import episode_succeeded, expert_budget_problem
        from lmpo.generation.episodes import play_expert

        source = self.owner[row]
        episode, needed = play_expert(self.runner, self.factories[source], self.examples[row], self.seed + row)
        problem = expert_budget_problem(episode, self.env.budget, needed, prefix="env.budget", require_success=False)
        if problem is not None:
            where = "env.options" if source == 0 else f"sft.demonstrations[{source - 1}]"
            raise InputError(f"`sft.steps` = {self.sft_steps} warms up on expert episodes of `env.id` = "
                             f"{self.env.id!r}, and the demonstration of training example {row} (the expert of "
                             f"{where}) is no demonstration: {problem}.")
        if not episode_succeeded(episode.rewards, episode.infos):
            self.unsuccessful += 1
        return episode

    def batch(self, rows: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask, loss_mask)`` (B, P + T) of the demonstrations of ``rows``: loss on the
        expert's tokens only (the tokens a sampled episode's policy mask covers)."""
        from lmpo.generation.episodes import collate_episodes

        eb = collate_episodes([self[r] for r in rows], self.tokenizer.pad_token_id)
        loss_mask = torch.cat([torch.zeros_like(eb.prompt_mask), eb.loss_mask], dim=1).bool()
        return eb.input_ids.to(device), eb.full_attention_mask.to(device), loss_mask.to(device)


def episode_warmup(model, tokenizer, env, examples: list[Example], cfg: SFTConfig, *, seed: int,
                   device: torch.device, log=None, accuracy_check=None) -> list[float]:
    """The warm-up of a multi-turn run (``env``: its ``env`` section): ``cfg.steps`` steps of cross-entropy on the
    expert's tokens of demonstration episodes (:class:`Demonstrations`) of ``examples`` (the first
    ``cfg.max_examples``), mixed as ``cfg.demonstrations`` says; the loop and early stop of
    :func:`train_steps`. Returns the loss of each step."""
    pool = examples[: cfg.max_examples] if cfg.max_examples > 0 else examples
    demos = Demonstrations(tokenizer, env, pool, cfg.demonstrations, seed=seed, sft_steps=cfg.steps)
    losses = train_steps(model, cfg, len(pool), lambda rows: demos.batch(rows, device), seed=seed, log=log,
                         accuracy_check=accuracy_check)
    if log is not None and demos.episodes:
        shares = ", ".join(f"{sum(demos.owner[r] == k for r in demos.episodes)} from "
                           f"{'env.options' if k == 0 else f'sft.demonstrations[{k - 1}]'}"
                           for k in range(len(demos.factories)))
        log(f"sft: {len(demos.episodes)} demonstrations played ({shares}); {demos.unsuccessful} ended without "
            "success")
    return losses
