"""Multi-turn training (``env`` section, ``lmpo.trainer.step.multiturn``): the trainer on episodes, zero gradient on the
environment's tokens at every importance level, truncation masking, and the refused combinations."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import SMALL_MODEL, train_killed_in_step

from lmpo.config import ConfigError
from lmpo.envs import ENVS, EpisodeBudget, GuessNumberEnv, GuessNumberTask, StepResult, make_env_task
from lmpo.envs.base import EnvSpec
from lmpo.envs.tools import format_tool_call
from lmpo.generation.episodes import run_episodes
from lmpo.models import build_chat_tokenizer, build_tiny_model
from lmpo.objectives import Objective, ObjectiveDriver
from lmpo.trainer import Trainer
from lmpo.trainer.config import config_from_dict, validate_config
from lmpo.trainer.step import stages
from lmpo.trainer.step.multiturn import episodes_to_rollout

ENV = "ToolArithmetic-v0"
BUDGET = {"max_turns": 3, "max_total_tokens": 120, "max_new_tokens_per_turn": 16}


def chat_model(seed: int = 0):
    tok = build_chat_tokenizer()
    return build_tiny_model(tok, seed=seed, **SMALL_MODEL), tok


def env_config(run_dir, env_id: str = ENV, **sections) -> dict:
    base = {
        "env": {"id": env_id, "budget": dict(BUDGET)},
        "task": {"eval_examples": 4},
        "rollout": {"completions_per_prompt": 3},
        "objective": {"preset": "grpo"},
        "optim": {"lr": 1e-2},
        "loop": {"steps": 3, "prompts_per_step": 2, "seqs_per_microbatch": 6, "seed": 0, "device": "cpu"},
        "eval": {"at_start": True}, "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(run_dir), "progress_bar": False, "tensorboard": False, "plots": False},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


def env_trainer(run_dir, env_id: str = ENV, **sections) -> Trainer:
    model, tok = chat_model()
    return Trainer(config_from_dict(env_config(run_dir, env_id, **sections)), model=model, tokenizer=tok,
                   log=lambda msg: None)


def capture_batches(trainer: Trainer) -> list:
    """Record the batch every ``update`` call trains on."""
    seen, real = [], trainer.update

    def update(step, batch):
        seen.append(batch)
        return real(step, batch)

    trainer.update = update
    return seen


@pytest.mark.parametrize("env_id", ["ToolArithmetic-v0", "GuessNumber-v0"])
def test_trainer_runs_episodes(tmp_path, env_id):
    trainer = env_trainer(tmp_path / "run", env_id)
    batches = capture_batches(trainer)
    result = trainer.train()
    assert result.steps_done == 3 and len(batches) == 3
    for row, batch in zip(result.history, batches):
        assert len(batch) == 2 * 3  # prompts_per_step × completions_per_prompt episodes
        for key in ("episodes/return_mean", "episodes/turns_mean", "episodes/success_rate", "loss/total",
                    "optim/grad_norm", "reward/mean", "mismatch/abs_logp_diff_max"):
            assert key in row and math.isfinite(row[key]), key
        # the sampler's log-probs are the trainer's on the tokens it sampled (token-exact episodes)
        assert row["mismatch/abs_logp_diff_max"] < 1e-4
        # the loss mask never covers padding, and within the attended tokens it is the policy's share
        T = batch.completion_ids.shape[1]
        attended = batch.attention_mask[:, -T:].bool()
        assert not (batch.loss_mask & ~attended).any()
    assert {"eval/accuracy", "eval/episodes/turns_mean"} <= set(result.eval_after)
    assert {"eval/accuracy", "eval/episodes/turns_mean"} <= set(result.eval_before)
    if env_id == "GuessNumber-v0":  # feedback games reach a second turn even from random weights
        assert any(row["episodes/env_tokens_mean"] > 0 for row in result.history)
        assert any(b.attention_mask[:, -b.completion_ids.shape[1]:].bool().logical_and(~b.loss_mask).any()
                   for b in batches)


def test_trainer_learns_from_a_rewarded_episode(tmp_path):
    """GuessNumber from random weights: some group has differing returns, so the update moves the weights."""
    trainer = env_trainer(tmp_path / "run", "GuessNumber-v0", loop={"steps": 4, "prompts_per_step": 4},
                          rollout={"completions_per_prompt": 4})
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = trainer.train()
    assert any(row["adv/zero_var_frac"] < 1 for row in result.history)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


class ParityEnv(GuessNumberEnv):
    """One turn, rewarded 1 when its text has an odd length: groups of an untrained model both differ and not."""

    def step(self, action):
        return StepResult([], float(len(action) % 2), True, False, {})


def test_dynamic_sampling_trains_on_groups_whose_returns_differ(tmp_path, monkeypatch):
    """DAPO's redraws on episodes: every trained group has differing returns and comes from the step's draws, the
    first draw is the plain run's, and the rollout/* counts add up."""
    from lmpo.trainer.step import multiturn as trainer_episodes

    monkeypatch.setitem(ENVS, "Parity-v0", EnvSpec("Parity-v0", ParityEnv, GuessNumberTask))

    draws, real = [], trainer_episodes.play_step

    def play_step(*args, **kwargs):
        played = real(*args, **kwargs)
        draws.append([tuple(e.completion_ids) for e in played.episodes])
        return played

    monkeypatch.setattr(trainer_episodes, "play_step", play_step)
    sections = dict(loop={"steps": 2, "prompts_per_step": 3}, rollout={"completions_per_prompt": 2})
    plain_rows = env_trainer(tmp_path / "plain", "Parity-v0", **sections).train().history
    plain_first, draws[:] = draws[0], []
    assert any(row["adv/zero_var_frac"] > 0 for row in plain_rows)  # the plain run trains on all-equal groups
    sections["rollout"] = {**sections["rollout"], "dynamic_sampling": True, "dynamic_sampling_max_draws": 30}
    trainer = env_trainer(tmp_path / "run", "Parity-v0", **sections)
    batches = capture_batches(trainer)
    result = trainer.train()
    assert draws[0] == plain_first and result.history[0]["rollout/draws"] > 1
    step0 = {ids for draw in draws[:int(result.history[0]["rollout/draws"])] for ids in draw}
    for row, batch in zip(result.history, batches):
        assert len(batch) == 3 * 2 and row["rollout/groups_kept"] == 3 and row["adv/zero_var_frac"] == 0.0
        assert row["rollout/groups_dropped"] + row["rollout/groups_kept"] + row["rollout/groups_surplus"] == \
            3 * row["rollout/draws"]
    T = batches[0].completion_ids.shape[1]
    pad = trainer.tokenizer.pad_token_id
    for row in batches[0].completion_ids.tolist():  # every trained episode was played in step 0's draws
        while row and row[-1] == pad:
            row.pop()
        assert any(ids[:len(row)] == tuple(row) and len(ids) <= T for ids in step0)


def _expert_batch(tok, device="cpu"):
    """Expert episodes of ToolArithmetic (a tool call, a tool observation, the answer) with one cut by the budget."""
    examples = make_env_task(ENV).eval_examples()[:3]
    full = run_episodes(None, tok, ENV, examples, expert=True,
                        budget=EpisodeBudget(max_turns=4, max_total_tokens=256, max_new_tokens_per_turn=96))
    cut = run_episodes(None, tok, ENV, examples[:1], expert=True,
                       budget=EpisodeBudget(max_turns=4, max_total_tokens=256, max_new_tokens_per_turn=10))
    assert all(len(e.policy_mask) > sum(e.policy_mask) for e in full)  # observations are there
    assert cut[0].truncated
    return episodes_to_rollout(full + cut, tok, torch.device(device))


@pytest.mark.parametrize("preset, level", [("grpo", "token"), ("gspo", "sequence"), ("gspo_token", "sequence_token")])
def test_environment_tokens_get_exactly_zero_gradient(preset, level):
    torch.manual_seed(0)
    model, tok = chat_model()
    rollout, batch, _ = _expert_batch(tok)
    objective = Objective.preset(preset, check_finite=False)
    assert objective.level == level
    driver = ObjectiveDriver(objective)
    B, T = batch.completion_ids.shape
    P = batch.input_ids.shape[1] - T
    # the head's input (final norm output): row p predicts token p + 1, and its gradient is the logits' one
    # through the head, so it is zero exactly where nothing in the loss depends on that prediction
    captured = {}

    def keep_grad(_module, _inputs, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = model.get_decoder().norm.register_forward_hook(keep_grad)
    try:
        settings = stages.LogprobSettings(temperature=1.0, group_size=None, seqs_per_microbatch=B)
        fwd = stages.logprobs(model, batch, settings=settings, with_grad=True, with_entropy=driver.needs.entropy)
    finally:
        handle.remove()
    logp = fwd.logp
    logp.retain_grad()
    gen = torch.Generator().manual_seed(1)
    # behaviour log-probs off the current ones, so that ratios and clipping are not trivially 1
    old = (logp.detach() + 0.3 * torch.randn(logp.shape, generator=gen)) * batch.loss_mask
    adv = torch.randn(B, generator=gen)
    loss = driver.loss(logp, old, adv, batch.loss_mask, weight=1.0, entropy=fwd.entropy,
                       rollout_logp=batch.rollout_logp if driver.needs.rollout_logp else None,
                       num_tokens=batch.loss_mask.sum(), num_seqs=B, generator=gen)
    loss.backward()
    masked = ~batch.loss_mask
    assert masked.any() and (masked & batch.attention_mask[:, P:].bool()).any()  # environment tokens exist
    assert torch.equal(logp.grad[masked], torch.zeros_like(logp.grad[masked]))
    assert logp.grad[batch.loss_mask].abs().sum() > 0
    hidden_grad = captured["hidden"].grad[:, P - 1:-1]  # (B, T, H): the predictions of the completion tokens
    assert torch.equal(hidden_grad[masked], torch.zeros_like(hidden_grad[masked]))
    assert hidden_grad[batch.loss_mask].abs().sum() > 0


def test_truncated_episodes_are_masked_whole(tmp_path):
    """objective.mask_truncated_completions: every truncated episode's loss mask is zero, the others untouched."""
    # random weights on ToolArithmetic: some turns stop (an answer), others run into the 16-token turn budget
    trainer = env_trainer(tmp_path / "run", objective={"mask_truncated_completions": True},
                          loop={"steps": 2, "prompts_per_step": 3})
    batches = capture_batches(trainer)
    played = []
    real_sample = trainer.sample

    def sample(step):
        got = real_sample(step)
        played.append((got.scored.rollout.truncated.clone(), got.played.batch.loss_mask.clone()))
        return got

    trainer.sample = sample
    result = trainer.train()
    assert len(batches) == len(played) and batches
    for batch, (truncated, unmasked) in zip(batches, played):
        assert truncated.any() and not truncated.all()
        assert not batch.loss_mask[truncated].any()
        assert torch.equal(batch.loss_mask[~truncated], unmasked[~truncated])
    for row in result.history:
        assert row["completion/truncated_masked_frac"] == pytest.approx(row["episodes/truncated_fraction"])


@pytest.mark.parametrize("sections, words", [
    ({"rollout": {"engine": "vllm"}}, "rollout.engine"),
    ({"rlvcr": {"enabled": True}}, "rlvcr.enabled"),
    ({"rewards": {"functions": ["exact_match"]}}, "rewards.functions"),
    ({"sft": {"steps": 5, "demonstrations": [{"fraction": 0.7}, {"fraction": 0.5}]}}, "sft.demonstrations"),
    ({"eval": {"samples_per_prompt": 2}}, "eval.samples_per_prompt"),
    ({"task": {"name": "hf", "hf_name": "x"}}, "task.name"),
    ({"env": {"id": "ToolArithmetc-v0"}}, "ToolArithmetic-v0"),
])
def test_unsupported_combinations_are_refused(tmp_path, sections, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        validate_config(config_from_dict(env_config(tmp_path, **sections)))


def test_env_fields_without_an_env_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"env\.budget"):
        validate_config(config_from_dict({"env": {"budget": {"max_turns": 2}}}))
    with pytest.raises(ConfigError, match=r"sft\.demonstrations"):
        validate_config(config_from_dict({"sft": {"demonstrations": [{"fraction": 0.5}]}}))


# ------------------------------------------------------------------------------------------------------
# the warm-up on the environment's expert episodes (sft.steps with env.id)
# ------------------------------------------------------------------------------------------------------


def test_demonstration_sources_spread_each_share_evenly():
    from lmpo.trainer.config import DemonstrationSource
    from lmpo.trainer.run.sft import demonstration_sources

    owner = demonstration_sources(10, [DemonstrationSource(0.6)])
    assert owner == [1, 0, 1, 0, 1, 1, 0, 1, 0, 1]  # rows round(linspace(0, 9, 6)): 6 of 10, both ends
    owner = demonstration_sources(100, [DemonstrationSource(0.5), DemonstrationSource(0.3)])
    assert [owner.count(k) for k in (0, 1, 2)] == [20, 50, 30]
    for k in (1, 2):  # spread over the pool, not bunched at one end
        rows = [i for i, o in enumerate(owner) if o == k]
        assert rows[0] < 10 and rows[-1] > 85
    assert demonstration_sources(3, []) == [0, 0, 0]


def test_mixed_demonstrations_train_on_the_experts_tokens_only():
    from lmpo.trainer.config import DemonstrationSource, EnvConfig
    from lmpo.trainer.run.sft import Demonstrations

    tok = build_chat_tokenizer()
    env = EnvConfig(id=ENV, budget=EpisodeBudget(4, 256, 96))
    examples = make_env_task(ENV).train_examples()[:10]
    demos = Demonstrations(tok, env, examples, [DemonstrationSource(0.6, {"expert": "memory"})], seed=0, sft_steps=1)
    rows = list(range(10))
    ids, attention, loss_mask = demos.batch(rows, torch.device("cpu"))
    assert [demos[r].num_turns for r in rows] == [1 if demos.owner[r] else 2 for r in rows]
    for r in rows:
        expert = [examples[r].answer] if demos.owner[r] else [
            format_tool_call("calculator", {"expression": examples[r].meta["expression"]}), examples[r].answer]
        # the loss covers the expert's turns and their stop tokens, nothing of the opening or the observations
        trained = ids[r][loss_mask[r]].tolist()
        assert trained == [t for text in expert for t in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
        assert attention[r][loss_mask[r]].all()
    assert demos.unsuccessful == 0 and len(demos.episodes) == 10


def test_the_trainer_warms_up_on_expert_episodes_before_rl(tmp_path):
    """GuessNumber's expert opens with 8 (the middle of 1..16): after the warm-up the greedy policy does too."""
    trainer = env_trainer(tmp_path / "run", "GuessNumber-v0",
                          env={"budget": {"max_turns": 6, "max_total_tokens": 200, "max_new_tokens_per_turn": 6}},
                          sft={"steps": 40, "lr": 1e-2, "seqs_per_step": 8, "max_examples": 32},
                          loop={"steps": 1}, eval={"at_start": True})
    result = trainer.train()
    assert len(result.sft_losses) == 40 and result.sft_losses[-1] < result.sft_losses[0] / 4
    runner = trainer.episode_runner
    runner.sampler.temperature = 0.0
    from lmpo.trainer.step.multiturn import env_factory

    played = runner.run(env_factory(trainer.cfg.env), trainer.eval_examples[:3], 1, seed=0)
    assert [e.messages[1]["content"] for e in played] == ["8"] * 3


def test_estimator_needing_a_greedy_baseline_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="remax"):
        env_trainer(tmp_path / "run", objective={"advantage_estimator": "remax"})


def test_resume_equals_uninterrupted_multiturn_run(tmp_path):
    """Episodes are seeded by (loop.seed, step): a run killed after step 2 and resumed ends where the
    uninterrupted one does, bit for bit (weights and logged metrics)."""
    from lmpo.trainer.run.metrics import read_jsonl
    from lmpo.trainer.run.state import list_checkpoints

    sections = {"loop": {"steps": 4, "prompts_per_step": 4}, "rollout": {"completions_per_prompt": 4},
                "checkpoint": {"every_steps": 2, "keep_last": 0}, "eval": {"every_steps": 2}}
    full = env_trainer(tmp_path / "full", "GuessNumber-v0", **sections)
    initial = {k: v.clone() for k, v in full.model.state_dict().items()}
    full.train()
    assert any(not torch.equal(initial[k], v) for k, v in full.model.state_dict().items())  # it learned something
    part = env_trainer(tmp_path / "part", "GuessNumber-v0", **sections)
    train_killed_in_step(part, 3)
    assert [p.name for p in list_checkpoints(tmp_path / "part")] == ["step_00000002"]
    model, tok = chat_model(seed=123)  # other initial weights: the checkpoint's must win
    resumed = Trainer(config_from_dict(env_config(tmp_path / "part", "GuessNumber-v0", **sections)), model=model,
                      tokenizer=tok, log=lambda msg: None)
    resumed.train(resume="auto")
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k

    def rows(run):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))}
                for r in read_jsonl(tmp_path / run / "metrics.jsonl")]

    assert rows("part") == rows("full")


def test_turn_advantages_by_hand():
    from lmpo.objectives.advantages import make_estimator
    from lmpo.trainer.step.multiturn import turn_advantages

    # group 0: ep0 rewards [0, 1], ep1 [0.5, 0]; group 1: ep2 [1] (one turn), ep3 [0, 0]; γ = 0.5
    # returns-to-go: ep0 [0.5, 1], ep1 [0.5, 0], ep2 [1], ep3 [0, 0]
    # RLOO (no scale), turn 0: ep0 0.5 − 0.5 = 0, ep1 0, ep2 1 − 0 = 1, ep3 −1
    #                  turn 1: ep0 1 − 0 = 1, ep1 −1, ep3 alone in its group: 0
    rewards = torch.tensor([[0.0, 1.0], [0.5, 0.0], [1.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    turn_ids = torch.tensor([[0, 0, -1, 1, 1], [0, -1, 1, -1, -1], [0, 0, 0, -1, -1], [0, -1, -1, 1, 1]])
    groups = torch.tensor([0, 0, 1, 1])
    adv = turn_advantages(make_estimator("rloo"), rewards, mask, turn_ids, groups, gamma=0.5)
    expected = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, -1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0],
                             [-1.0, 0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_turn_advantages_reduce_to_episode_advantages():
    """γ = 1, rewards only at the last turn, equal turn counts: every token gets the episode-return advantage."""
    from lmpo.objectives.advantages import make_estimator
    from lmpo.trainer.step.multiturn import turn_advantages

    gen = torch.Generator().manual_seed(0)
    B, K = 8, 3
    final = torch.randint(0, 2, (B,), generator=gen).float()
    rewards = torch.zeros(B, K)
    rewards[:, -1] = final
    groups = torch.arange(B) // 4
    turn_ids = torch.tensor([[0, 0, -1, 1, -1, 2, 2]] * B)
    estimator = make_estimator("grpo")
    adv = turn_advantages(estimator, rewards, torch.ones(B, K, dtype=torch.long), turn_ids, groups, gamma=1.0)
    episode = estimator(final, groups)[0]
    torch.testing.assert_close(adv, episode[:, None].expand(B, 7) * (turn_ids >= 0), rtol=0, atol=0)


def test_trainer_with_turn_discount(tmp_path):
    """Per-turn credit in the trainer: (B, T) advantages, zero on the environment's tokens; turn penalties make
    earlier turns' returns differ from the episode's."""
    trainer = env_trainer(tmp_path / "run", "GuessNumber-v0", env={"turn_discount": 0.9,
                                                                   "options": {"turn_penalty": 0.1}},
                          loop={"steps": 2, "prompts_per_step": 4}, rollout={"completions_per_prompt": 4})
    batches = capture_batches(trainer)
    result = trainer.train()
    assert len(batches) == 2 and all(math.isfinite(r["loss/total"]) for r in result.history)
    for b in batches:
        assert b.advantages.shape == b.completion_ids.shape
        assert not b.advantages[~b.loss_mask & b.attention_mask[:, -b.completion_ids.shape[1]:].bool()].any()
    assert any(b.advantages[b.loss_mask].abs().sum() > 0 for b in batches)


def test_turn_discount_refuses_estimators_with_inputs(tmp_path):
    with pytest.raises(ConfigError, match="turn_discount"):
        env_trainer(tmp_path / "run", env={"turn_discount": 0.9},
                    objective={"advantage_estimator": "reinforce_plus_plus"})


def test_lmpo_eval_plays_a_multiturn_runs_held_out_episodes_as_the_trainer_did(tmp_path):
    """`lmpo eval RUN` on an episode run: the held-out success the trainer logged last, and the same episodes."""
    from lmpo.errors import InputError
    from lmpo.eval.command import evaluate_model

    result = env_trainer(tmp_path / "run", "GuessNumber-v0", loop={"steps": 1}).train()
    evaluated = evaluate_model(str(tmp_path / "run"), None, device="cpu", samples_per_prompt=2)
    assert evaluated.n == 4 and evaluated.accuracy == result.eval_after["eval/accuracy"]
    for key in ("turns_mean", "policy_tokens_mean", "truncated_fraction"):
        assert evaluated.episodes[f"episodes/{key}"] == result.eval_after[f"eval/episodes/{key}"]
    assert {"pass@1", "pass@2", "avg@2"} <= set(evaluated.passk) and "success " in evaluated.summary()
    with pytest.raises(InputError, match="--max-new-tokens"):
        evaluate_model(str(tmp_path / "run"), None, max_new_tokens=8)
