"""The reasoning-gym adapter with the real package: its generators as single-turn tasks (``task.name:
reasoning_gym/<dataset>``, its ``score_answer`` as the reward) and as the retry environment, played end to end."""

from __future__ import annotations

import math
import re

import pytest

from episode_helpers import ScriptedSampler, train_two_env_steps
from lmpo.config import ConfigError
from lmpo.envs import EpisodeBudget, check_env, make_env, make_env_task
from lmpo.errors import InputError
from lmpo.generation.episodes import episode_metrics, run_episodes
from lmpo.models import build_chat_tokenizer, build_tiny_model
from lmpo.rewards import get_reward_fn
from lmpo.tasks import make_task
from lmpo.trainer import Trainer
from lmpo.trainer.config import config_from_dict

rg = pytest.importorskip("reasoning_gym")

ENV = "reasoning_gym/Feedback-v0"
SMALL_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def reward_of(task, examples, completions):
    fn = get_reward_fn(task.default_rewards[0][0])
    meta = {k: [e.meta[k] for e in examples] for k in examples[0].meta}
    return fn([e.prompt for e in examples], completions, [e.answer for e in examples], **meta)


def test_any_dataset_is_a_task_scored_by_its_own_score_answer():
    for dataset in ("chain_sum", "letter_counting", "spell_backward"):
        task = make_task(f"reasoning_gym/{dataset}", num_train=30, num_eval=10)
        held_out, train = task.eval_examples(), task.train_examples(seed=1)
        assert len(held_out) == 10 and len(train) == 30
        assert not {e.prompt for e in held_out} & {e.prompt for e in train}
        assert held_out == make_task(f"reasoning_gym/{dataset}", num_train=30, num_eval=10).eval_examples()
        generator = rg.create_dataset(dataset, size=10, seed=0)
        assert [e.prompt for e in held_out] == [generator[i]["question"] for i in range(10)]
        assert reward_of(task, held_out, [e.answer for e in held_out]) == [1.0] * 10
        assert reward_of(task, held_out, [f"<think>hmm</think> <answer>{e.answer}</answer>" for e in held_out]) == [1.0] * 10
        wrong = reward_of(task, held_out, ["no idea"] * 10)
        assert wrong == [generator.score_answer("no idea", generator[i]) for i in range(10)] and max(wrong) < 1
    assert task.accuracy_reward == task.default_rewards[0][0]


def test_prompt_template_and_config_reach_the_generator():
    task = make_task("reasoning_gym/chain_sum", num_train=5, num_eval=5, prompt_template="{metadata[expression]} =",
                     config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    for e in task.eval_examples():
        assert re.fullmatch(r"\d [+-] \d =", e.prompt), e.prompt
        assert eval(e.prompt[:-2]) == int(e.answer)  # noqa: S307 - two one-digit terms written by reasoning-gym


def test_bad_task_options_are_named():
    with pytest.raises(InputError, match="no dataset 'chain_summ'. Did you mean 'chain_sum'"):
        make_task("reasoning_gym/chain_summ")
    with pytest.raises(InputError, match="prompt_template"):
        make_task("reasoning_gym/chain_sum", num_eval=1, prompt_template="{metadata[nope]}").eval_examples()
    with pytest.raises(InputError, match="rejects the config"):
        make_task("reasoning_gym/chain_sum", num_eval=1, config={"no_such_option": 1}).eval_examples()


def test_config_accepts_the_family():
    config_from_dict({"task": {"name": "reasoning_gym/chain_sum"}}).task.validate()
    with pytest.raises(ConfigError, match="task.name"):
        config_from_dict({"task": {"name": "reasoning_gymm/chain_sum"}}).task.validate()


def test_missing_extra_says_how_to_install(monkeypatch):
    import dataclasses

    from lmpo.tasks import TASK_FAMILIES

    family = TASK_FAMILIES["reasoning_gym"]
    monkeypatch.setitem(TASK_FAMILIES, "reasoning_gym", dataclasses.replace(family, requires="lmpo_no_such_module"))
    with pytest.raises(ConfigError, match=r"pip install 'lmpo\[lmpo_no_such_module\]'"):
        config_from_dict({"task": {"name": "reasoning_gym/chain_sum"}}).task.validate()


def test_trainer_trains_on_a_reasoning_gym_task(tmp_path):
    tok = build_chat_tokenizer()
    model = build_tiny_model(tok, seed=0, **SMALL_MODEL)
    cfg = config_from_dict({
        "task": {"name": "reasoning_gym/chain_sum", "eval_examples": 4,
                 "options": {"num_train": 20, "num_eval": 4, "prompt_template": "{metadata[expression]}=",
                             "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}},
        "rollout": {"completions_per_prompt": 3, "max_new_tokens": 3},
        "objective": {"preset": "grpo"}, "optim": {"lr": 1e-2},
        "loop": {"steps": 2, "prompts_per_step": 2, "seed": 0, "device": "cpu"},
        "eval": {"at_start": True}, "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(tmp_path / "run"), "progress_bar": False, "tensorboard": False, "plots": False},
    })
    result = Trainer(cfg, model=model, tokenizer=tok, log=lambda msg: None).train()
    assert result.steps_done == 2
    for row in result.history:
        assert math.isfinite(row["loss/total"]) and 0 <= row["reward/mean"] <= 1
    assert 0 <= result.eval_after["eval/accuracy"] <= 1


# ------------------------------------------------------------------------------------------------------
# the multi-turn environment
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["chain_sum", "letter_counting"])
def test_feedback_env_passes_check_env(dataset):
    check_env(make_env(ENV, dataset=dataset))
    check_env(make_env(ENV), make_env_task(ENV, dataset=dataset, num_train=3, num_eval=3).eval_examples())


def test_wrong_answer_gets_feedback_and_a_retry():
    tok = build_chat_tokenizer()
    examples = make_env_task(ENV, num_train=3, num_eval=4, prompt_template="{metadata[expression]} =").eval_examples()
    answers = {e.prompt: e.answer for e in examples}

    def wrong_then_right(context: str, turn: int) -> str:
        question = next(p for p in answers if p in context)
        return "<answer>oops</answer>" if turn == 0 else f"<answer>{answers[question]}</answer>"

    episodes = run_episodes(ScriptedSampler(tok, wrong_then_right), tok, ENV, examples, completions_per_example=2,
                            budget=EpisodeBudget(max_turns=4, max_total_tokens=600, max_new_tokens_per_turn=40))
    for e in episodes:
        assert e.end_reason == "terminated" and e.num_turns == 2
        assert e.rewards == [0.0, 0.5]  # the retry's full score, discounted once (retry_discount 0.5)
        assert e.messages[2] == {"role": "user", "content": "Your answer 'oops' is not correct (score 0.00). Try again: "
                                 "2 attempts left."}
        assert [i["score"] for i in e.infos] == [0.0, 1.0]
    assert episode_metrics(episodes)["episodes/return_mean"] == 0.5


def test_attempts_run_out_and_the_expert_answers():
    env = make_env(ENV, max_attempts=2, retry_discount=1.0)
    example = make_env_task(ENV, num_eval=1).eval_examples()[0]
    env.reset(example)
    assert not env.step("wrong").terminated
    last = env.step("still wrong")
    assert last.terminated and not last.truncated and last.reward == 0.0 and last.info["correct"] is False
    env.reset(example)
    assert env.expert_action() == example.answer
    assert env.step(env.expert_action()) == (([], 1.0, True, False, {"score": 1.0, "attempt": 1, "correct": True}))
    with pytest.raises(InputError, match="max_attempts=0"):
        make_env(ENV, max_attempts=0)


def test_trainer_trains_on_the_feedback_env(tmp_path):
    history = train_two_env_steps(tmp_path, ENV, {"dataset": "chain_sum", "num_train": 10, "num_eval": 2,
                                                  "prompt_template": "{metadata[expression]} ="}, 4)
    for row in history:
        assert 0 <= row["episodes/return_mean"] <= 1
