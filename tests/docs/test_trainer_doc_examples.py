"""The data and config snippets of docs/trainer.md are what lmpo reads (a renamed key breaks this test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from lmpo.tasks import rows_to_examples
from lmpo.trainer.config import RewardModelConfig, config_from_dict

DOC = (Path(__file__).resolve().parents[2] / "docs" / "trainer.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)


def test_yaml_snippets_are_valid_config_sections():
    blocks = _blocks("yaml")
    assert len(blocks) >= 2
    for block in blocks:
        config_from_dict(yaml.safe_load(block))  # unknown keys or wrong types raise ConfigError
    rewards = config_from_dict(yaml.safe_load(next(b for b in blocks if "rewards:" in b and "{model:" in b))).rewards
    assert isinstance(rewards.functions[1], RewardModelConfig) and rewards.functions[1].metric_name == "rm"


def test_jsonl_snippet_rows_are_read_as_documented():
    [block] = _blocks("jsonl")
    standard, conversational, prompt_completion = rows_to_examples(json.loads(line) for line in block.splitlines())
    assert standard.prompt == "What is 12+30?" and standard.messages is None
    assert conversational.messages[0]["role"] == "system" and conversational.prompt == ""
    assert {standard.answer, conversational.answer, prompt_completion.answer} == {"42"}
