"""docs/multiturn.md says what the code does: its generated tables are current, its metric keys are the ones
``episode_metrics`` returns, and its examples run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from episode_helpers import ScriptedSampler
from lmpo.config import generated_block
from lmpo.envs import EpisodeBudget, make_env_task
from lmpo.envs.docs import BLOCKS
from lmpo.envs.tools import format_tool_call
from lmpo.generation.episodes import END_REASONS, episode_metrics, run_episodes
from lmpo.models import build_chat_tokenizer

DOC = Path(__file__).resolve().parents[2] / "docs" / "multiturn.md"
# ids other test modules register are not lmpo's (the docs list what lmpo ships)
pytestmark = pytest.mark.usefixtures("lmpo_envs_only")


def test_generated_blocks_are_current():
    text = DOC.read_text(encoding="utf-8")
    for name, render in BLOCKS.items():
        assert generated_block(text, name) == render(), "docs/multiturn.md is stale: run `make docs`"


def test_metric_keys_are_documented():
    tokenizer = build_chat_tokenizer()
    example = make_env_task("ToolArithmetic-v0").eval_examples()[0]
    sampler = ScriptedSampler(tokenizer, [format_tool_call("calculator", {"expression": "1+1"}), "2"])
    episodes = run_episodes(sampler, tokenizer, "ToolArithmetic-v0", [example],
                            budget=EpisodeBudget(max_new_tokens_per_turn=128))
    keys = set(episode_metrics(episodes))
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("`episode_metrics(episodes)` gives"):text.index("## TextArena")]
    documented = set(re.findall(r"`(episodes/[a-z_<>]+)`", table))
    expanded = {k for k in documented if "<reason>" not in k} | {f"episodes/end_{r}" for r in END_REASONS}
    assert keys == expanded
    for reason in END_REASONS:
        assert f"`{reason}`" in text


def test_quick_start_runs():
    text = DOC.read_text(encoding="utf-8")
    code = text[text.index("```python\n") + len("```python\n"):]
    code = code[: code.index("```")]
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the page's own example
    assert len(namespace["episodes"]) == 16 and namespace["batch"].completion_ids.shape[0] == 16


def test_writing_an_environment_example(monkeypatch):
    from lmpo.envs import ENVS, check_env

    text = DOC.read_text(encoding="utf-8")
    start = text.index("```python\nfrom lmpo.envs import LMEnv")
    code = text[start + len("```python\n"):]
    code = code[: code.index("```")]
    monkeypatch.setattr("lmpo.envs.base.ENVS", dict(ENVS))  # the example registers Echo-v0 in a copy
    exec(compile(code, str(DOC), "exec"), {})  # noqa: S102 - the page's own example
    import lmpo.envs.base as base

    env = base.ENVS["Echo-v0"].factory()
    env.env_id = "Echo-v0"
    check_env(env)
    assert "Echo-v0" not in ENVS  # the example registered into a copy
