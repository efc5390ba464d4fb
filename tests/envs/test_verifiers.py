"""The verifiers adapter with the real package: a ``vf.MultiTurnEnv`` and a ``vf.ToolEnv`` written with verifiers'
own classes (tests/envs/verifiers_envs.py), their datasets as lmpo tasks, their ``env_response`` / stop conditions
/ ``Rubric`` as lmpo's environment and reward, played end to end and trained on."""

from __future__ import annotations

import re

import pytest

from episode_helpers import ScriptedSampler, train_two_env_steps
from lmpo.envs import EpisodeBudget, check_env, make_env, make_env_task
from lmpo.envs.tools import format_tool_call
from lmpo.errors import InputError
from lmpo.generation.episodes import run_episodes
from lmpo.models import build_chat_tokenizer

vf = pytest.importorskip("verifiers")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip("the adapter needs verifiers' classic API (0.2 / 0.3)", allow_module_level=True)

# importing verifiers' classic stack and building the first environment takes ~10 s of CPU
pytestmark = pytest.mark.slow

ENV = "verifiers/Environment-v0"
GUESS = "verifiers_envs:load_higher_lower"
ADDER = "verifiers_envs:load_adder"
BUDGET = EpisodeBudget(max_turns=6, max_total_tokens=1500, max_new_tokens_per_turn=80)


@pytest.fixture(scope="module")
def tok():
    return build_chat_tokenizer()


def bisect(context: str, turn: int) -> str:
    low, high = 1, 16
    for guess, hint in re.findall(r"assistant\n(\d+)<\|im_end\|>\n<\|im_start\|>user\n(Higher|Lower)", context):
        low, high = (int(guess) + 1, high) if hint == "Higher" else (low, int(guess) - 1)
    return str((low + high) // 2)


@pytest.mark.parametrize("environment", [GUESS, ADDER])
def test_check_env(environment):
    task = make_env_task(ENV, environment=environment)
    check_env(make_env(ENV), task.eval_examples()[:3])
    check_env(make_env(ENV, environment=environment))  # rows the env draws itself


def test_task_splits_are_the_environments_datasets():
    task = make_env_task(ENV, environment=GUESS, num_eval=4)
    held_out, train = task.eval_examples(), task.train_examples()
    assert len(held_out) == 4 and len(train) == 30
    assert not {e.prompt for e in held_out} & {e.prompt for e in train}
    assert held_out[0].prompt == "Answer with one number.\nGame 0: guess my number between 1 and 16."


def test_multiturn_env_with_feedback_and_rubric(tok):
    examples = make_env_task(ENV, environment=GUESS, num_eval=5).eval_examples()
    episodes = run_episodes(ScriptedSampler(tok, bisect), tok, ENV, examples, completions_per_example=2, budget=BUDGET)
    for e in episodes:
        secret = e.example.answer
        assert e.messages[:2] == [{"role": "system", "content": "Answer with one number."},
                                  {"role": "user", "content": e.example.prompt.split("\n")[1]}]
        guesses = [m["content"] for m in e.messages if m["role"] == "assistant"]
        # the rubric, on the last turn only: found (weight 1) - 0.1 per assistant turn
        assert e.rewards[-1] == pytest.approx(float(secret in guesses) - 0.1 * len(guesses)) and sum(e.rewards[:-1]) == 0
        if secret in guesses[:4]:
            assert e.end_reason == "terminated" and e.messages[-1]["content"] == "Correct!"
            assert e.infos[-1]["stop_condition"] == "has_final_env_response"
        else:  # the env's max_turns=5 stop condition fires before env_response answers a fifth guess
            assert e.end_reason == "env_truncated" and e.infos[-1]["stop_condition"] == "max_turns_reached"
            assert len(guesses) == 5
    assert sum(e.end_reason == "terminated" for e in episodes) >= 6


def test_tool_env_runs_its_tools_and_scores_the_answer(tok):
    examples = make_env_task(ENV, environment=ADDER).eval_examples()

    def use_the_tool(context: str, turn: int) -> str:
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", context)[0])
        return format_tool_call("add", {"a": a, "b": b}) if turn == 0 else re.findall(r"tool\n(\d+)", context)[-1]

    env = make_env(ENV, environment=ADDER)
    assert [s["function"]["name"] for s in env.tool_schemas] == ["add"]
    assert env.tool_schemas[0]["function"]["parameters"]["required"] == ["a", "b"]
    episodes = run_episodes(ScriptedSampler(tok, use_the_tool), tok, ENV, examples, budget=BUDGET)
    for e in episodes:
        assert e.messages[2] == {"role": "tool", "name": "add", "content": e.example.answer}
        assert e.end_reason == "terminated" and e.rewards == [0.0, 1.0]
        assert e.infos[-1]["stop_condition"] == "no_tools_called"
        assert e.infos[-1]["metrics"]["add_calls"] == 1.0


def test_malformed_tool_calls_get_verifiers_error_text():
    env = make_env(ENV, environment=ADDER)
    env.reset(seed=0)
    result = env.step('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>')
    assert result.observation[0]["role"] == "tool" and "Expecting" in result.observation[0]["content"]
    result = env.step(format_tool_call("subtract", {"a": 1, "b": 2}))
    assert result.observation == [{"role": "tool", "name": "subtract", "content": "'subtract'"}]  # vf's KeyError text


def test_bad_environments_are_named():
    with pytest.raises(InputError, match="cannot be loaded"):
        make_env(ENV, environment="verifiers_envs:no_such_loader")
    with pytest.raises(InputError, match=r"group-level reward functions \['best_of_group'\]"):
        make_env(ENV, environment=GUESS, env_args={"group_reward": True})
    with pytest.raises(InputError, match="env.options.environment"):
        make_env(ENV).reset(seed=0)


def test_trainer_trains_on_a_verifiers_env(tmp_path):
    train_two_env_steps(tmp_path, ENV, {"environment": GUESS, "num_eval": 2}, 6)
