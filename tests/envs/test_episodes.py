"""The multi-turn driver: token-exact sequences, budgets, bad environments, batches and metrics."""

from __future__ import annotations

import time

import pytest
import torch

from episode_helpers import GENERATION_PROMPT, EosBias, ScriptedSampler
from lmpo.envs import EnvError, EpisodeBudget, LMEnv, StepResult, make_env_task
from lmpo.envs.tools import format_tool_call
from lmpo.errors import InputError
from lmpo.generation.episodes import (
    ChatRenderer,
    EpisodeRunner,
    HFTurnSampler,
    collate_episodes,
    episode_metrics,
    per_turn_to_tokens,
    run_episodes,
    turn_returns,
)
from lmpo.models import CHATML_TEMPLATE, build_chat_tokenizer, build_tiny_model
from lmpo.tasks.chat import render_conversation

#: ChatML that, like Qwen3's template, drops the reasoning of every assistant turn but the last one
STRIPS_THINK = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_chat_tokenizer()


def guess_example(secret: int):
    return make_env_task("GuessNumber-v0").example(secret)


def test_sampled_tokens_are_trained_tokens_with_a_template_that_strips_thinking(tokenizer):
    texts = ["<think>the middle of 1..16 is 8</think>8", "<think>lower, so 4</think>4",
             "<think>lower again, 2</think>2", "<think>higher: 3</think>3"]
    sampler = ScriptedSampler(tokenizer, texts)
    [episode] = run_episodes(sampler, tokenizer, "GuessNumber-v0", [guess_example(3)], chat_template=STRIPS_THINK,
                             budget=EpisodeBudget(max_turns=6, max_total_tokens=1000, max_new_tokens_per_turn=64))
    assert (episode.end_reason, episode.num_turns, episode.rewards) == ("terminated", 4, [0.0, 0.0, 0.0, 1.0])
    sampled = [t for turn in sampler.turns for t in turn.token_ids]
    assert episode.policy_token_ids() == sampled  # bit-identical, over four turns
    policy = [i for i, m in enumerate(episode.policy_mask) if m]
    assert [episode.logprobs[i] for i in policy] == [lp for turn in sampler.turns for lp in turn.logprobs]
    assert all(lp == 0.0 for lp, m in zip(episode.logprobs, episode.policy_mask) if not m)
    assert episode.loss_mask == episode.policy_mask
    # what the sampler conditioned on is what the trainer sees: each context is the previous one, the turn
    # sampled from it and the observation's tokens
    sequence = episode.prompt_ids + episode.completion_ids
    for k, context in enumerate(sampler.contexts):
        assert sequence[: len(context)] == context
        if k:
            before = sampler.contexts[k - 1] + sampler.turns[k - 1].token_ids
            observation = tokenizer.decode(context[len(before):])
            assert context[: len(before)] == before
            assert observation == "\n<|im_start|>user\nLower.<|im_end|>\n" + GENERATION_PROMPT or \
                observation == "\n<|im_start|>user\nHigher.<|im_end|>\n" + GENERATION_PROMPT
    assert sequence == sampler.contexts[-1] + sampler.turns[-1].token_ids
    # the test is meaningful: re-rendering the conversation would have dropped the earlier turns' reasoning
    rerendered = tokenizer.decode(tokenizer(render_conversation(tokenizer, episode.messages, STRIPS_THINK, False))["input_ids"])
    assert rerendered.count("<think>") == 1 and tokenizer.decode(sequence).count("<think>") == 4
    assert [m["role"] for m in episode.messages] == ["user"] + ["assistant", "user"] * 3 + ["assistant"]


def test_hf_sampler_logprobs_match_a_teacher_forced_forward(tokenizer):
    """Sampling with a real model over several turns: the recorded log-probs are those of the final sequence
    under one teacher-forced forward, so the model saw exactly the tokens it is trained on."""
    model = EosBias(build_tiny_model(tokenizer, seed=0), tokenizer.eos_token_id, 4.0)
    sampler = HFTurnSampler(model, tokenizer, temperature=1.0)
    episodes = run_episodes(sampler, tokenizer, "GuessNumber-v0", [guess_example(5), guess_example(11)],
                            completions_per_example=2,
                            budget=EpisodeBudget(max_turns=4, max_total_tokens=300, max_new_tokens_per_turn=12),
                            generator=torch.Generator().manual_seed(0))
    assert max(e.num_turns for e in episodes) >= 3
    batch = collate_episodes(episodes, tokenizer.pad_token_id)
    mask = batch.full_attention_mask
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits.float()
    P = batch.prompt_ids.shape[1]
    teacher = logits[:, P - 1:-1].log_softmax(-1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    policy = batch.policy_mask.bool()
    torch.testing.assert_close(teacher[policy], batch.logprobs[policy], atol=2e-4, rtol=0)
    assert (batch.logprobs[~policy] == 0).all()
    for e in episodes:
        assert len(e.prompt_ids) + len(e.completion_ids) <= 300
        assert e.end_reason in ("max_turns", "max_new_tokens_per_turn", "terminated")


def test_hf_sampler_greedy_is_reproducible_and_respects_limits(tokenizer):
    model = build_tiny_model(tokenizer, seed=1)
    sampler = HFTurnSampler(model, tokenizer, temperature=0.0)
    contexts = [tokenizer("<|im_start|>user\nhi<|im_end|>\n")["input_ids"], tokenizer("ab")["input_ids"]]
    first = sampler.sample(contexts, [5, 3])
    for turn, n in zip(first, [5, 3]):  # cut at the limit, or shorter because it ended with its stop token
        assert len(turn.token_ids) == len(turn.logprobs) == n if not turn.stopped else \
            turn.token_ids[-1] == tokenizer.eos_token_id and len(turn.token_ids) <= n
    assert sampler.sample(contexts, [5, 3]) == first
    # a row alone gives the same greedy tokens as in the padded batch
    assert sampler.sample(contexts[1:], [3])[0].token_ids == first[1].token_ids


class Forever(LMEnv):
    """Never ends.

    ## Description
    Answers every turn. ## Observations / Actions / Rewards: see the code.

    ## Observations
    ``again``.

    ## Actions
    Any text.

    ## Rewards
    0.1 per turn.

    ## Episode End
    Never.

    ## Version
    v0: first version.
    """

    env_id = "Forever-v0"

    def __init__(self, fail_at=None, failure=None):
        super().__init__()
        self.fail_at, self.failure, self.turn = fail_at, failure, 0

    def reset(self, example=None, seed=None):
        super().reset(example, seed)
        if self.fail_at == "reset":
            raise self.failure
        self.turn = 0
        return [{"role": "user", "content": "go"}], {}

    def step(self, action):
        self.turn += 1
        if self.turn == self.fail_at:
            if isinstance(self.failure, BaseException):
                raise self.failure
            return self.failure()
        return StepResult([{"role": "user", "content": "again"}], 0.1, False, False, {})


def test_max_turns_truncates_an_env_that_never_ends(tokenizer):
    sampler = ScriptedSampler(tokenizer, ["x"] * 10)
    [episode] = run_episodes(sampler, tokenizer, Forever, [None], budget=EpisodeBudget(max_turns=3))
    assert (episode.end_reason, episode.truncated, episode.terminated, episode.num_turns) == ("max_turns", True, False, 3)
    assert episode.rewards == [0.1, 0.1, 0.1]
    assert episode_metrics([episode])["episodes/end_max_turns"] == 1.0


def test_turn_budget_truncates_and_masks(tokenizer):
    texts = ["ok", ("a very long turn that never stops", False)]
    budget = EpisodeBudget(max_turns=5, max_new_tokens_per_turn=10)
    for mask_truncated in (False, True):
        sampler = ScriptedSampler(tokenizer, texts)
        [e] = run_episodes(sampler, tokenizer, Forever, [None], budget=budget, mask_truncated=mask_truncated)
        assert (e.end_reason, e.num_turns) == ("max_new_tokens_per_turn", 2)
        assert tokenizer.decode(sampler.turns[1].token_ids) == "a very lon"
        assert e.policy_token_ids()[-10:] == sampler.turns[1].token_ids  # kept, with their log-probs
        assert e.logprobs[-10:] == sampler.turns[1].logprobs
        assert e.loss_mask == ([0] * len(e.policy_mask) if mask_truncated else e.policy_mask)
        assert e.rewards == [0.1]  # the cut turn never reached the environment


def test_total_token_budget(tokenizer):
    opening = len(ChatRenderer(tokenizer).opening_ids([{"role": "user", "content": "go"}]))
    for total in range(opening + 1, opening + 60):
        sampler = ScriptedSampler(tokenizer, ["abcd"] * 20)
        [e] = run_episodes(sampler, tokenizer, Forever, [None],
                           budget=EpisodeBudget(max_turns=20, max_total_tokens=total, max_new_tokens_per_turn=8))
        assert e.end_reason == "max_total_tokens", total
        assert len(e.prompt_ids) + len(e.completion_ids) <= total
        # the sequence ends with the policy's tokens: an observation that does not fit is left out
        assert e.policy_mask[-1] == 1 and len(e.loss_mask) == len(e.completion_ids) == len(e.logprobs)
    with pytest.raises(InputError, match="max_total_tokens"):
        run_episodes(ScriptedSampler(tokenizer, ["a"]), tokenizer, Forever, [None],
                     budget=EpisodeBudget(max_total_tokens=opening))


@pytest.mark.parametrize("fail_at, failure, where, message", [
    (2, RuntimeError("database down"), "turn 1", "step() failed or returned a malformed result: RuntimeError: database down"),
    ("reset", KeyError("secret"), "reset", "reset() failed or returned a malformed opening: KeyError: 'secret'"),
    (1, lambda: StepResult([{"role": "user", "content": 3}], 0.0, False, False, {}), "turn 0", "content must be a string"),
    (1, lambda: StepResult([{"role": "user", "content": "a"}], "1", False, False, {}), "turn 0", "finite number"),
    (1, lambda: StepResult([{"role": "user", "content": "a"}], 0.0, 0, False, {}), "turn 0", "must be bools"),
    (1, lambda: ([], 0.0, False), "turn 0", "must return (observation"),
    (1, lambda: time.sleep(3), "turn 0", "TimeoutError: no answer within 0.3 s"),
])
def test_bad_environments(tokenizer, fail_at, failure, where, message):
    def factory():
        return Forever(fail_at, failure)

    runner = EpisodeRunner(ScriptedSampler(tokenizer, ["x"] * 5), tokenizer, EpisodeBudget(max_turns=4),
                           step_timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(EnvError) as info:
        runner.run(factory, [None])
    assert f"environment Forever-v0 failed at {where} of episode 0 (seed 0)" in str(info.value)
    assert message in str(info.value) and "on_env_error='truncate'" in str(info.value)
    assert time.monotonic() - start < 2.5
    runner.on_env_error = "truncate"
    episodes = runner.run(factory, [None, None])
    assert all(e.end_reason == "env_error" and e.truncated and message in e.error for e in episodes)
    assert f"at {where} of episode 1 (seed 1)" in episodes[1].error
    assert episode_metrics(episodes)["episodes/end_env_error"] == 1.0


def test_only_the_failing_episode_ends(tokenizer):
    envs = iter([Forever(), Forever(2, RuntimeError("boom")), Forever()])
    episodes = EpisodeRunner(ScriptedSampler(tokenizer, ["x"] * 5), tokenizer, EpisodeBudget(max_turns=3),
                             on_env_error="truncate").run(lambda: next(envs), [None], completions_per_example=3)
    assert [e.end_reason for e in episodes] == ["max_turns", "env_error", "max_turns"]
    assert [e.num_turns for e in episodes] == [3, 2, 3]


def test_tool_episode_and_metrics(tokenizer):
    example = make_env_task("ToolArithmetic-v0").eval_examples()[0]
    texts = [format_tool_call("calculator", {"expression": example.meta["expression"]}), example.answer]
    sampler = ScriptedSampler(tokenizer, texts)
    [episode] = run_episodes(sampler, tokenizer, "ToolArithmetic-v0", [example],
                             budget=EpisodeBudget(max_new_tokens_per_turn=128))
    assert (episode.end_reason, episode.rewards) == ("terminated", [0.0, 1.0])
    observation = [t for t, m in zip(episode.completion_ids, episode.policy_mask) if not m]
    assert tokenizer.decode(observation) == f"\n<|im_start|>tool\n{example.answer}<|im_end|>\n{GENERATION_PROMPT}"
    metrics = episode_metrics([episode])
    assert metrics["episodes/tool_calls_mean"] == 1.0 and metrics["episodes/tool_call_valid_rate"] == 1.0
    assert metrics["episodes/success_rate"] == 1.0 and metrics["episodes/turns_mean"] == 2.0
    # an episode cut before it answered is a failure, not left out
    cut = run_episodes(ScriptedSampler(tokenizer, texts), tokenizer, "ToolArithmetic-v0", [example],
                       budget=EpisodeBudget(max_turns=1, max_new_tokens_per_turn=128))
    assert cut[0].end_reason == "max_turns"
    assert episode_metrics([episode, cut[0]])["episodes/success_rate"] == 0.5


def test_tool_schemas_reach_the_opening(tokenizer):
    template = "{% if tools %}[{{ tools | map(attribute='function.name') | join(',') }}]{% endif %}" + CHATML_TEMPLATE
    sampler = ScriptedSampler(tokenizer, ["1"])
    [episode] = run_episodes(sampler, tokenizer, "ToolArithmetic-v0", [None], chat_template=template)
    assert tokenizer.decode(episode.prompt_ids).startswith("[calculator]<|im_start|>user\nWhat is ")


def test_collate(tokenizer):
    sampler = ScriptedSampler(tokenizer, ["8", "4", "2", "3"])
    episodes = run_episodes(sampler, tokenizer, "GuessNumber-v0", [guess_example(8), guess_example(3)],
                            completions_per_example=2)
    batch = collate_episodes(episodes, tokenizer.pad_token_id)
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.num_turns.tolist() == [1, 1, 4, 4] and batch.returns.tolist() == [1.0, 1.0, 1.0, 1.0]
    B, T = batch.completion_ids.shape
    assert T == max(len(e.completion_ids) for e in episodes)
    for b, e in enumerate(episodes):
        n = len(e.completion_ids)
        assert batch.completion_ids[b, :n].tolist() == e.completion_ids
        assert (batch.completion_ids[b, n:] == tokenizer.pad_token_id).all() and batch.attention_mask[b].sum() == n
        assert batch.prompt_ids[b, -len(e.prompt_ids):].tolist() == e.prompt_ids
    assert ((batch.turn_ids >= 0) == batch.policy_mask.bool()).all()
    assert (batch.loss_mask <= batch.policy_mask).all() and (batch.policy_mask <= batch.attention_mask).all()


def test_renderer_refusals(tokenizer):
    with pytest.raises(InputError, match="no"):
        ChatRenderer(build_chat_tokenizer(None))
    echo_free = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    with pytest.raises(InputError, match="verbatim"):
        ChatRenderer(tokenizer, echo_free).observation_ids([{"role": "user", "content": "x"}], tokenizer.eos_token_id)


@pytest.mark.parametrize("env_id", ["ToolArithmetic-v0", "GuessNumber-v0"])
def test_experts_solve_every_held_out_example(tokenizer, env_id):
    examples = make_env_task(env_id).eval_examples()[:16]
    episodes = run_episodes(None, tokenizer, env_id, examples, expert=True,
                            budget=EpisodeBudget(max_turns=8, max_new_tokens_per_turn=128))
    assert all(e.end_reason == "terminated" and e.episode_return == 1.0 for e in episodes)
    assert all(lp == 0.0 for e in episodes for lp in e.logprobs)
    for e in episodes:  # each expert turn is its text, encoded once, and the stop token
        texts = [m["content"] for m in e.messages if m["role"] == "assistant"]
        turns = [[t for t, k in zip(e.completion_ids, e.turn_ids) if k == i] for i in range(e.num_turns)]
        assert [tokenizer.decode(t) for t in turns] == [x + tokenizer.eos_token for x in texts]
    if env_id == "ToolArithmetic-v0":
        assert {e.num_turns for e in episodes} == {2}
        assert episode_metrics(episodes)["episodes/tool_call_valid_rate"] == 1.0
    else:
        assert max(e.num_turns for e in episodes) == 5  # bisection over 1..16


def test_expert_needs_an_expert_or_a_sampler(tokenizer):
    with pytest.raises(NotImplementedError, match="no expert policy"):
        run_episodes(None, tokenizer, Forever, [None], expert=True)
    with pytest.raises(InputError, match="no sampler"):
        run_episodes(None, tokenizer, Forever, [None])


def naive_turn_returns(rewards, n, gamma):
    return [sum(gamma ** (j - k) * rewards[j] for j in range(k, n)) for k in range(n)]


def test_turn_returns_by_hand():
    # r = (0, 0, 1), γ = 0.5: G_2 = 1, G_1 = 0 + 0.5·1 = 0.5, G_0 = 0 + 0.5·0.5 = 0.25; row 2 has one turn (r = 2)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [2.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert turn_returns(rewards, mask, 0.5).tolist() == [[0.25, 0.5, 1.0], [2.0, 0.0, 0.0]]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [0.0, 0.37, 0.9, 1.0])
def test_turn_returns_match_the_naive_loop_and_ignore_padding(seed, gamma):
    g = torch.Generator().manual_seed(seed)
    B, K = 5, 7
    rewards = torch.randn(B, K, generator=g)
    lengths = torch.randint(1, K + 1, (B,), generator=g)
    mask = (torch.arange(K)[None] < lengths[:, None]).long()
    out = turn_returns(rewards, mask, gamma)
    for b in range(B):
        n = int(lengths[b])
        expected = naive_turn_returns(rewards[b].tolist(), n, gamma) + [0.0] * (K - n)
        torch.testing.assert_close(out[b], torch.tensor(expected), rtol=1e-5, atol=1e-6)
    garbage = rewards.masked_fill(mask == 0, 1e6)  # invariance: what padding holds changes nothing
    torch.testing.assert_close(turn_returns(garbage, mask, gamma), out)
    if gamma == 1.0:  # G_0 is the episode return
        torch.testing.assert_close(out[:, 0], (rewards * mask).sum(1), rtol=1e-5, atol=1e-5)


def test_turn_credit_from_a_batch(tokenizer):
    sampler = ScriptedSampler(tokenizer, ["x"] * 3)
    episodes = run_episodes(sampler, tokenizer, Forever, [None], budget=EpisodeBudget(max_turns=3))
    batch = collate_episodes(episodes, tokenizer.pad_token_id)
    assert batch.turn_rewards.tolist() == [[pytest.approx(0.1)] * 3] and batch.turn_mask.tolist() == [[1, 1, 1]]
    returns = turn_returns(batch.turn_rewards, batch.turn_mask, 0.5)  # 0.1 + 0.05 + 0.025, 0.1 + 0.05, 0.1
    tokens = per_turn_to_tokens(returns, batch.turn_ids)
    for k, expected in enumerate([0.175, 0.15, 0.1]):
        assert torch.allclose(tokens[batch.turn_ids == k], torch.tensor(expected))
    assert (tokens[batch.turn_ids == -1] == 0).all()
