"""Incremental rendering against real chat templates (the copies TRL ships of Qwen2.5's, Qwen3's, Llama 3.2's and
DeepSeek-R1-Distill's), rendered offline with character-level tokenisers that have each family's special tokens.

For every template: the tokens between two turns are exactly what the template writes after the assistant's
stop token when it renders the conversation so far; where the template renders history verbatim (Qwen2.5,
Llama 3.2), the whole episode equals the template's rendering of the whole conversation; where it rewrites
history (Qwen3 and DeepSeek drop earlier reasoning), the episode keeps every sampled reasoning block that a
re-rendering loses.
"""

from __future__ import annotations

from importlib import resources

import pytest

from episode_helpers import ScriptedSampler, template_tokenizer
from lmpo.envs import EpisodeBudget, make_env, make_env_task
from lmpo.envs.tools import format_tool_call
from lmpo.generation.episodes import run_episodes
from lmpo.tasks.chat import render_conversation

pytest.importorskip("trl")

QWEN = (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", None, "<|im_start|>assistant\n")
LLAMA = (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
         "<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>assistant<|end_header_id|>\n\n")
DEEPSEEK = (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
            "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜Assistant｜>")
#: template file, its family's tokens, whether it renders earlier assistant turns verbatim, whether it has tools
TEMPLATES = [("qwen2_5", QWEN, True, True), ("qwen3", QWEN, False, True), ("llama3_2", LLAMA, True, True),
             ("deepseek_r1_distill", DEEPSEEK, False, False)]


def trl_template(name: str) -> str:
    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def play(name, family, env_id, example, script):
    specials, eos, bos, generation_prompt = family
    tokenizer = template_tokenizer(trl_template(name), specials, eos, bos)
    sampler = ScriptedSampler(tokenizer, script, turn_marker=generation_prompt)
    [episode] = run_episodes(sampler, tokenizer, env_id, [example],
                             budget=EpisodeBudget(max_turns=6, max_total_tokens=20_000, max_new_tokens_per_turn=200))
    return tokenizer, sampler, episode


def observation_spans(episode) -> list[list[int]]:
    """The environment's tokens between consecutive policy turns, one list per observation."""
    spans: list[list[int]] = []
    for i, (token, turn) in enumerate(zip(episode.completion_ids, episode.turn_ids)):
        if turn == -1:
            if i == 0 or episode.turn_ids[i - 1] != -1:
                spans.append([])
            spans[-1].append(token)
    return spans


def check(tokenizer, sampler, episode, verbatim, tools):
    eos = tokenizer.eos_token
    assert episode.end_reason == "terminated" and episode.episode_return == 1.0
    assert episode.policy_token_ids() == [t for turn in sampler.turns for t in turn.token_ids]
    sequence = tokenizer.decode(episode.prompt_ids + episode.completion_ids)
    # between turns: what the template writes after the assistant's stop token, rendering the conversation so far
    assistant_at = [i for i, m in enumerate(episode.messages) if m["role"] == "assistant"]
    spans = observation_spans(episode)
    assert len(spans) == len(assistant_at) - 1
    for span, upto in zip(spans, assistant_at[1:]):
        rendered = render_conversation(tokenizer, episode.messages[:upto], add_generation_prompt=True, tools=tools)
        assert rendered.endswith(eos + tokenizer.decode(span)), (rendered[-200:], tokenizer.decode(span))
    whole = render_conversation(tokenizer, episode.messages, add_generation_prompt=False, tools=tools)
    if verbatim:  # the template's own rendering of the whole conversation, up to a trailing newline
        assert whole.startswith(sequence) and whole[len(sequence):] in ("", "\n")
    else:  # the template rewrites history: a re-rendered episode would not be the sampled one
        assert not whole.startswith(sequence)
    return sequence, whole


@pytest.mark.parametrize("name, family, verbatim, _", TEMPLATES)
def test_feedback_game(name, family, verbatim, _):
    texts = ["<think>middle of 1..16</think>8", "<think>lower</think>4", "<think>lower again</think>2",
             "<think>higher</think>3"]
    if name == "deepseek_r1_distill":  # its generation prompt opens the reasoning block itself
        texts = [t.removeprefix("<think>") for t in texts]
    tokenizer, sampler, episode = play(name, family, "GuessNumber-v0", make_env_task("GuessNumber-v0").example(3),
                                       texts)
    assert episode.num_turns == 4
    sequence, whole = check(tokenizer, sampler, episode, verbatim, None)
    if not verbatim:  # Qwen3 and DeepSeek drop the reasoning of turns before the last user message
        assert sequence.count("</think>") == 4 > whole.count("</think>")


@pytest.mark.parametrize("name, family, verbatim, has_tools", [t for t in TEMPLATES if t[3]])
def test_tool_episode(name, family, verbatim, has_tools):
    example = make_env_task("ToolArithmetic-v0").eval_examples()[0]
    texts = ["<think>use the calculator</think>" + format_tool_call("calculator", {"expression": example.meta["expression"]}),
             f"<think>copy it</think>{example.answer}"]
    tokenizer, sampler, episode = play(name, family, "ToolArithmetic-v0", example, texts)
    assert episode.num_turns == 2 and "calculator" in tokenizer.decode(episode.prompt_ids)  # tools= reached it
    check(tokenizer, sampler, episode, verbatim, make_env("ToolArithmetic-v0").tool_schemas)
