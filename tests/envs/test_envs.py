"""The environment protocol, registry and checker, and the built-in environments."""

from __future__ import annotations

import dataclasses

import pytest

from lmpo.envs import (
    CARD_SECTIONS,
    ENVS,
    EnvCheckError,
    EpisodeBudget,
    GuessNumberEnv,
    LMEnv,
    StepResult,
    check_env,
    env_card,
    make_env,
    make_env_task,
    register_env,
)
from lmpo.envs.tools import format_tool_call
from lmpo.errors import InputError


def needs_extra(env_id):
    """Skip an environment whose optional extra is not installed (its own test file runs it where it is)."""
    if not ENVS[env_id].available:
        pytest.skip(f"{env_id} needs the optional {ENVS[env_id].requires} package")


#: adapters that play an environment named in their options; their own test files check them on real ones
NEEDS_SOMETHING_TO_ADAPT = {
    "openenv/Remote-v0": "needs a running OpenEnv server: tests/envs/test_openenv.py checks it against one",
    "verifiers/Environment-v0": "needs a verifiers environment: tests/envs/test_verifiers.py checks two",
}


#: the environments lmpo registers (not those a test module registers when it is imported, tests/worker_env.py)
LMPO_ENVS = sorted(k for k, spec in ENVS.items() if getattr(spec.factory, "__module__", "").startswith("lmpo."))


@pytest.mark.parametrize("env_id", LMPO_ENVS)
def test_every_registered_env_passes_check_env(env_id):
    needs_extra(env_id)
    if env_id in NEEDS_SOMETHING_TO_ADAPT:
        pytest.skip(NEEDS_SOMETHING_TO_ADAPT[env_id])
    check_env(make_env(env_id))  # episodes the environment draws itself
    if ENVS[env_id].task is not None:
        check_env(make_env(env_id), make_env_task(env_id).eval_examples()[:3])


@pytest.mark.parametrize("env_id", LMPO_ENVS)
def test_every_registered_env_has_a_card(env_id):
    card = env_card(ENVS[env_id].factory)  # read without building the environment: no extra needed
    assert list(card)[: len(CARD_SECTIONS)] == list(CARD_SECTIONS)
    assert f"v{ENVS[env_id].version}:" in card["Version"]


def test_registry_errors():
    with pytest.raises(InputError, match="Did you mean 'GuessNumber-v0'"):
        make_env("GuessNumber-v1")
    with pytest.raises(InputError, match="bad options"):
        make_env("GuessNumber-v0", colour="red")
    with pytest.raises(ValueError, match="Name-vN"):
        register_env("no-version")
    with pytest.raises(ValueError, match="already registered"):
        register_env("GuessNumber-v0")(GuessNumberEnv)


def test_missing_extra_says_how_to_install(monkeypatch):
    spec = ENVS["textarena/GuessTheNumber-v0"]
    monkeypatch.setitem(ENVS, spec.env_id, dataclasses.replace(spec, requires="lmpo_no_such_module"))
    with pytest.raises(InputError, match=r"pip install 'lmpo\[lmpo_no_such_module\]'"):
        make_env(spec.env_id)


def test_budget_is_validated():
    with pytest.raises(InputError, match="max_turns"):
        EpisodeBudget(max_turns=0)
    assert EpisodeBudget(max_turns=3).max_turns == 3


# ------------------------------------------------------------------------------------------------------
# the checker finds each kind of broken environment
# ------------------------------------------------------------------------------------------------------

CARD = """A test environment.

    ## Description
    Echo.

    ## Observations
    One user message.

    ## Actions
    Any text.

    ## Rewards
    None.

    ## Episode End
    After two turns.

    ## Version
    v0: first version.
    """


class Echo(LMEnv):
    __doc__ = CARD
    env_id = "Echo-v0"

    def reset(self, example=None, seed=None):
        super().reset(example, seed)
        self.turns = 0
        return [{"role": "user", "content": f"say something {self.np_random.integers(100)}"}], {}

    def step(self, action):
        if self.turns is None:
            raise RuntimeError("reset first")
        self.turns += 1
        done = self.turns >= 2
        if done:
            self.turns = None
        return StepResult([{"role": "user", "content": action[:10] or "?"}], 0.0, done, False, {})


def test_checker_accepts_a_correct_env():
    check_env(Echo())


class NoCard(Echo):
    """Echo without a card."""


class WrongVersion(Echo):
    __doc__ = CARD.replace("v0: first", "v1: second")


class NotDeterministic(Echo):
    def reset(self, example=None, seed=None):
        messages, info = super().reset(example, None)
        return messages, info


class ToolRoleOpening(Echo):
    def reset(self, example=None, seed=None):
        super().reset(example, seed)
        return [{"role": "tool", "content": "x"}], {}


class StringReward(Echo):
    def step(self, action):
        return super().step(action)._replace(reward="1")


class NanReward(Echo):
    def step(self, action):
        return super().step(action)._replace(reward=float("nan"))


class SilentMidEpisode(Echo):
    def step(self, action):
        return super().step(action)._replace(observation=[])


class AssistantObservation(Echo):
    def step(self, action):
        return super().step(action)._replace(observation=[{"role": "assistant", "content": "x"}])


class CrashesOnGarbage(Echo):
    def step(self, action):
        if "<tool_call>" in action:
            raise KeyError("name")
        return super().step(action)


class StepsAfterEnd(Echo):
    def step(self, action):
        self.turns = self.turns or 0
        return super().step(action)


class EndlessWithExpert(Echo):
    def step(self, action):
        return StepResult([{"role": "user", "content": "more"}], 0.0, False, False, {})

    def expert_action(self):
        return "x"


class SilentExpert(Echo):
    def expert_action(self):
        return None


@pytest.mark.parametrize("env, message", [
    (EndlessWithExpert(), "expert's episode did not end within 64 steps"),
    (SilentExpert(), "an action must be text, got NoneType"),
    (NoCard(), "lacks the card section"),
    (WrongVersion(), "no 'v0: …' entry"),
    (NotDeterministic(), "not deterministic"),
    (ToolRoleOpening(), "role 'tool'"),
    (StringReward(), "finite number"),
    (NanReward(), "finite number"),
    (SilentMidEpisode(), "no observation"),
    (AssistantObservation(), "role 'assistant'"),
    (StepsAfterEnd(), "after the episode ended must raise"),
])
def test_checker_rejects(env, message):
    with pytest.raises(EnvCheckError, match=message):
        check_env(env)


class CrashesOnReset(Echo):
    def reset(self, example=None, seed=None):
        raise ConnectionError("server down")


def test_checker_turns_exceptions_into_the_rule_they_break():
    with pytest.raises(EnvCheckError, match=r"step\('<tool_call>.*raised KeyError: 'name'; an environment must "
                                            "answer any text") as info:
        check_env(CrashesOnGarbage())
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(EnvCheckError, match=r"reset\(example, seed=0\) raised ConnectionError: server down"):
        check_env(CrashesOnReset())


class WrongExpert(GuessNumberEnv):
    def expert_action(self):  # one below the bisection point: it loses some games
        return str(int(super().expert_action()) - 1)


def test_checker_fails_an_expert_that_does_not_succeed():
    examples = make_env_task("GuessNumber-v0").eval_examples()
    with pytest.raises(EnvCheckError, match="expert's episode .* ended without success"):
        check_env(WrongExpert(max_guesses=2), examples)


def test_checker_plays_the_expert_under_the_budget_and_names_the_field_that_cuts_it():
    from lmpo.models import build_chat_tokenizer

    tokenizer = build_chat_tokenizer()
    env, examples = make_env("ToolArithmetic-v0"), make_env_task("ToolArithmetic-v0").eval_examples()[:2]
    from lmpo.generation.episodes import check_expert_budget

    check_env(env, examples)
    check_expert_budget(env, examples, EpisodeBudget(4, 256, 96), tokenizer)  # the documented budget fits
    call = format_tool_call("calculator", {"expression": examples[0].meta["expression"]})
    need = len(tokenizer(call, add_special_tokens=False)["input_ids"]) + 1
    with pytest.raises(EnvCheckError, match=rf"expert's turn 0 was cut by `budget.max_new_tokens_per_turn` = "
                                            rf"{need - 1} \(it needs {need} tokens\)"):
        check_expert_budget(make_env("ToolArithmetic-v0"), examples, EpisodeBudget(4, 256, need - 1), tokenizer)
    with pytest.raises(EnvCheckError, match=r"did not end within `budget.max_turns` = 1 turns"):
        check_expert_budget(make_env("ToolArithmetic-v0"), examples, EpisodeBudget(1, 256, 96), tokenizer)
    with pytest.raises(EnvCheckError, match=r"cut at turn \d by `budget.max_total_tokens` = 60"):
        check_expert_budget(make_env("ToolArithmetic-v0"), examples, EpisodeBudget(4, 60, 96), tokenizer)
    from lmpo.generation.episodes import run_episodes

    with pytest.warns(UserWarning, match="2 of 2 expert episodes were cut by the budget's max_new_tokens_per_turn = 40"):
        run_episodes(None, tokenizer, "ToolArithmetic-v0", examples, expert=True, budget=EpisodeBudget(4, 256, 40))


# ------------------------------------------------------------------------------------------------------
# built-in environments
# ------------------------------------------------------------------------------------------------------


def test_guess_number_bisection_wins():
    env = make_env("GuessNumber-v0")
    for example in make_env_task("GuessNumber-v0").eval_examples():
        env.reset(example, seed=0)
        low, high, turns = 1, 16, 0
        while True:
            guess = (low + high) // 2
            observation, reward, terminated, truncated, info = env.step(f"<think>between {low} and {high}</think>{guess}")
            turns += 1
            if terminated:
                break
            assert observation[0]["content"] in ("Higher.", "Lower.") and reward == 0.0
            low, high = (guess + 1, high) if observation[0]["content"] == "Higher." else (low, guess - 1)
        assert reward == 1.0 and info["correct"] and turns <= 5, example.meta


def test_guess_number_lost_and_invalid():
    env = make_env("GuessNumber-v0", max_guesses=2, turn_penalty=0.1)
    env.reset(make_env_task("GuessNumber-v0").example(9), seed=0)
    obs, reward, terminated, truncated, info = env.step("banana")
    assert obs == [{"role": "user", "content": "Reply with one number from 1 to 16."}]
    assert (reward, terminated, info["valid"]) == (-0.1, False, False)
    obs, reward, terminated, truncated, info = env.step("I say 3")
    assert obs[0]["content"] == "Higher." and terminated and not truncated and reward == -0.1


def test_tool_arithmetic_with_the_calculator():
    env = make_env("ToolArithmetic-v0")
    example = make_env_task("ToolArithmetic-v0").eval_examples()[0]
    messages, _ = env.reset(example, seed=0)
    assert messages == [{"role": "user", "content": f"What is {example.meta['expression']}?"}]
    assert env.tool_schemas[0]["function"]["name"] == "calculator"
    obs, reward, terminated, _, info = env.step(format_tool_call("calculator", {"expression": example.meta["expression"]}))
    assert obs == [{"role": "tool", "name": "calculator", "content": example.answer}]
    assert (reward, terminated, info["tool_calls"], info["tool_errors"]) == (0.0, False, 1, 0)
    obs, reward, terminated, _, info = env.step(f"The answer is {obs[0]['content']}.")
    assert (reward, terminated, info["correct"]) == (1.0, True, True)


def test_tool_arithmetic_wrong_answer_errors_and_truncation():
    env = make_env("ToolArithmetic-v0", max_turns=2)
    example = make_env_task("ToolArithmetic-v0").eval_examples()[1]
    env.reset(example, seed=0)
    obs, reward, terminated, truncated, info = env.step(format_tool_call("calculator", {"expression": "import os"}))
    assert obs[0]["content"].startswith("error:") and info["tool_errors"] == 1 and not truncated
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "calculator"</tool_call>')
    assert "not valid JSON" in obs[0]["content"] and truncated and not terminated and reward == 0.0
    env.reset(example, seed=0)
    _, reward, terminated, _, info = env.step(str(int(example.answer) + 1))
    assert (reward, terminated, info["correct"]) == (0.0, True, False)


def test_tool_arithmetic_task_splits_are_disjoint():
    task = make_env_task("ToolArithmetic-v0", num_train=300, num_eval=50)
    held_out = {e.prompt for e in task.eval_examples()}
    assert len(held_out) == 50 and not held_out & {e.prompt for e in task.train_examples(seed=0)}
    for e in task.eval_examples():
        left, right = e.meta["expression"].split("*")
        assert int(left) * int(right) == int(e.answer) and len(left) == 3 and len(right) == 2


def test_tool_arithmetic_expert_can_answer_from_memory():
    example = make_env_task("ToolArithmetic-v0").eval_examples()[3]
    for expert, turns in (("calculator", 2), ("memory", 1)):
        env = make_env("ToolArithmetic-v0", expert=expert)
        env.reset(example)
        actions, rewards, done = [], [], False
        while not done:
            actions.append(env.expert_action())
            result = env.step(actions[-1])
            rewards.append(result.reward)
            done = result.terminated or result.truncated
        assert len(actions) == turns and rewards[-1] == 1.0 and result.info["correct"]
        assert ("<tool_call>" in actions[0]) == (expert == "calculator")
    assert actions == [example.answer]
    check_env(make_env("ToolArithmetic-v0", expert="memory"))
    with pytest.raises(ValueError, match="expert"):
        make_env("ToolArithmetic-v0", expert="oracle")


def test_tool_arithmetic_shaped_rewards_are_options_and_off_by_default():
    example = make_env_task("ToolArithmetic-v0").eval_examples()[2]
    right_call = format_tool_call("calculator", {"expression": example.meta["expression"]})
    wrong_call = format_tool_call("calculator", {"expression": example.meta["expression"] + "+1"})
    wrong = str(int(example.answer) + 1)

    def play(actions, **options):
        env = make_env("ToolArithmetic-v0", **options)
        env.reset(example, seed=0)
        results = [env.step(a) for a in actions]
        return [r.reward for r in results], results[-1].info

    shaped = {"call_reward": 0.25, "tool_answer_reward": 0.5}
    # off by default: the 0/1 outcome of v0
    assert play([right_call, example.answer])[0] == [0.0, 1.0]
    # right call, its output copied: every part earned, and the most of any episode
    rewards, info = play([right_call, example.answer], **shaped)
    assert rewards == [0.25, 1.5] and info["correct"] and info["used_tool_output"]
    # right call, a wrong digit in the answer: the call's credit only
    rewards, info = play([right_call, wrong], **shaped)
    assert rewards == [0.25, 0.0] and not info["correct"] and not info["used_tool_output"]
    # a wrong expression whose output is copied: the answer is wrong, the copy earns its credit
    rewards, info = play([wrong_call, wrong], **shaped)
    assert rewards == [0.0, 0.5] and not info["correct"] and info["used_tool_output"]
    # the call's credit is earned once per episode, not per repeated call
    assert play([right_call, right_call, example.answer], **shaped)[0] == [0.25, 0.0, 1.5]
    # an answer without any call earns no copy credit, even when right
    assert play([example.answer], **shaped)[0] == [1.0]
    check_env(make_env("ToolArithmetic-v0", **shaped))
    # valid_call_reward: the first call that returns a number, right value or not, once per episode
    assert play([wrong_call, wrong], valid_call_reward=0.25)[0] == [0.25, 0.0]
    assert play([wrong_call, right_call, example.answer], valid_call_reward=0.25)[0] == [0.25, 0.0, 1.0]
    assert play([right_call, example.answer], valid_call_reward=0.25, **shaped)[0] == [0.5, 1.5]
    assert play([example.answer], valid_call_reward=0.25)[0] == [1.0]
    for bad in ({"call_reward": -0.1}, {"tool_answer_reward": 1.5}, {"call_reward": float("nan")},
                {"valid_call_reward": 2.0}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}=.*must be a number in \\[0, 1\\]"):
            make_env("ToolArithmetic-v0", **bad)
