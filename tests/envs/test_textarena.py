"""The TextArena adapter, end to end with the real package: a game nobody here wrote, played through the episode
driver by a scripted policy and by the tiny model."""

from __future__ import annotations

import random
import re

import pytest
import torch

from episode_helpers import EosBias, ScriptedSampler
from lmpo.envs import ENVS, EpisodeBudget, check_env, make_env, make_env_task
from lmpo.errors import InputError
from lmpo.generation.episodes import HFTurnSampler, collate_episodes, episode_metrics, run_episodes
from lmpo.models import build_chat_tokenizer, build_tiny_model

textarena = pytest.importorskip("textarena")

GAME = "textarena/GuessTheNumber-v0"


@pytest.fixture(scope="module")
def tokenizer():
    return build_chat_tokenizer()


def bisect(context: str, turn: int) -> str:
    """Play GuessTheNumber (1..20) by halving the interval, reading the game's hints from the conversation."""
    low, high = 1, 20
    guesses = [int(g) for g in re.findall(r"assistant\n\[(\d+)\]", context)]
    hints = re.findall(r"The target number is (higher|lower)", context)
    for guess, hint in zip(guesses, hints):
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return f"[{(low + high) // 2}]"


@pytest.mark.parametrize("game", [g for g in sorted(ENVS) if g.startswith("textarena/")])
def test_registered_games_pass_check_env(game):
    check_env(make_env(game), make_env_task(game, num_eval=2).eval_examples())


def test_scripted_bisection_wins_every_held_out_game(tokenizer):
    examples = make_env_task(GAME, num_eval=8).eval_examples()
    random.seed(123)
    expected_next = random.random()
    random.seed(123)
    sampler = ScriptedSampler(tokenizer, bisect)
    episodes = run_episodes(sampler, tokenizer, GAME, examples,
                            budget=EpisodeBudget(max_turns=8, max_total_tokens=2000, max_new_tokens_per_turn=16))
    assert random.random() == expected_next  # the games ran on their own random state
    for e in episodes:
        assert e.end_reason == "terminated" and e.rewards[-1] == 1.0, (e.example, e.messages)
        assert e.num_turns <= 5 and e.infos[-1]["game_info"]["reason"].startswith("Congratulations")
        assert all(r == 0.0 for r in e.rewards[:-1])
        assert tokenizer.decode(e.prompt_ids).startswith("<|im_start|>user\nYou are Player 0. You are playing Guess The Number.")
    for e in episodes:  # every turn was sampled from a prefix of its episode's sequence and is kept as sampled
        sequence = e.prompt_ids + e.completion_ids
        for k in range(e.num_turns):
            start = e.turn_ids.index(k)
            context = sequence[: len(e.prompt_ids) + start]
            assert tokenizer.decode(e.completion_ids[start:]).startswith(bisect(tokenizer.decode(context), k))
            assert context in sampler.contexts
    assert sum(len(e.policy_token_ids()) for e in episodes) == sum(len(t.token_ids) for t in sampler.turns)
    metrics = episode_metrics(episodes)
    assert metrics["episodes/return_mean"] == 1.0 and metrics["episodes/end_terminated"] == 1.0


def test_game_seed_fixes_the_instance_and_differs_across_examples(tokenizer):
    def secret(seed):
        env = make_env(GAME)
        env.reset(make_env_task(GAME).example(seed))
        return env._env.state.game_state["game_number"]

    assert secret(4) == secret(4)
    assert len({secret(s) for s in range(10)}) > 3


def test_tiny_model_plays_a_textarena_game(tokenizer):
    model = EosBias(build_tiny_model(tokenizer, seed=0), tokenizer.eos_token_id, 4.0)
    episodes = run_episodes(HFTurnSampler(model, tokenizer), tokenizer, GAME,
                            make_env_task(GAME, num_eval=2).eval_examples(), completions_per_example=2,
                            budget=EpisodeBudget(max_turns=3, max_total_tokens=1200, max_new_tokens_per_turn=8),
                            generator=torch.Generator().manual_seed(0))
    batch = collate_episodes(episodes, tokenizer.pad_token_id)
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    for e in episodes:  # garbage guesses: TextArena answers with invalid-move notices or ends the game
        assert e.end_reason in ("terminated", "max_turns", "max_new_tokens_per_turn")
        assert len(e.prompt_ids) + len(e.completion_ids) <= 1200
        if e.num_turns > 1:
            assert "invalid move" in e.messages[2]["content"] or "target number" in e.messages[2]["content"]


def test_unknown_game():
    from lmpo.envs.adapters.textarena import TextArenaEnv

    with pytest.raises(InputError, match="no game 'NoSuchGame-v0'"):
        TextArenaEnv("NoSuchGame-v0")


def test_guess_the_number_expert_wins_and_only_wins_count_as_success(tokenizer):
    """The bisection expert (the warm-up's demonstrations) wins every held-out game within five guesses; a lost
    game that earns the closeness reward is not a success."""
    examples = make_env_task(GAME, num_eval=20).eval_examples()
    budget = EpisodeBudget(max_turns=6, max_total_tokens=2000, max_new_tokens_per_turn=16)
    won = run_episodes(None, tokenizer, GAME, examples, budget=budget, expert=True)
    assert all(e.infos[-1]["correct"] and e.rewards[-1] == 1.0 and e.num_turns <= 5 for e in won)
    lost = run_episodes(ScriptedSampler(tokenizer, lambda context, k: "[1]" if k == 0 else "[2]"), tokenizer, GAME,
                        [e for e in examples if e.meta["seed"] in (0, 1)], budget=budget)
    for e in lost:  # the secret is neither 1 nor 2 there, and the repeated guess ends the game
        assert e.done and 0 < e.episode_return < 1 and not e.infos[-1]["correct"]
    assert episode_metrics(lost)["episodes/success_rate"] == 0.0
    with pytest.raises(NotImplementedError, match="no expert"):
        env = make_env("textarena/TowerOfHanoi-v0")
        env.reset(None, seed=0)
        env.expert_action()
