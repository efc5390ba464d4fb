"""`lmpo lab` on a multi-turn task: a 2-cell grid (grpo, gspo) on ToolArithmetic-v0 episodes, end to end."""

from __future__ import annotations

import json
import math

import pytest

from lmpo.lab import lab_config_from_dict, run_lab
from lmpo.lab.grid import validate_lab_config
from lmpo.trainer.config import ConfigError

ENV = "ToolArithmetic-v0"


def multiturn_config(lab_dir, model_dir, **sections) -> dict:
    base = {
        "lab": {"dir": str(lab_dir), "jobs": 1, "checkpoint_every_steps": 0, "progress": "quiet"},
        "grid": {"objectives": ["grpo", "gspo"], "seeds": [0]},
        "train": {
            "model": {"name": model_dir},
            # the shaped reward makes an untrained policy's episodes differ (any numeric answer after a call)
            "env": {"id": ENV, "options": {"tool_answer_reward": 0.5},
                    "budget": {"max_turns": 2, "max_total_tokens": 64, "max_new_tokens_per_turn": 6}},
            "task": {"eval_examples": 4},
            "rollout": {"completions_per_prompt": 4, "temperature": 1.0},
            "optim": {"lr": 1e-2},
            "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 8, "device": "cpu", "num_threads": 1},
            "eval": {"every_steps": 2},
        },
        "gradients": {"enabled": False},
        "report": {},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


def test_a_multi_turn_lab_runs_its_grid_on_episodes(tmp_path, chat_model_dir):
    result = run_lab(lab_config_from_dict(multiturn_config(tmp_path / "lab", chat_model_dir)), inline=True)
    assert sorted(result.ran) == [f"train/{ENV}/grpo/seed0", f"train/{ENV}/gspo/seed0"]
    for objective in ("grpo", "gspo"):
        run = tmp_path / "lab" / "cells" / ENV / objective / "seed0" / "run"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "episodes/turns_mean" in r]
        # every RL step played episodes of the environment (not single-turn completions) within the budget
        assert len(steps) == 2 and all(1 <= r["episodes/turns_mean"] <= 2 for r in steps)
        assert any("eval/accuracy" in r for r in rows)
        summary = json.loads((run.parent / "summary.json").read_text())
        # the endpoints the report compares (pass@k is off: the sampled evaluation is single-turn)
        for name in ("accuracy", "accuracy_start", "reward_end", "entropy_end", "length", "eval_length"):
            assert math.isfinite(summary["metrics"][name]), name
        assert 1 <= summary["metrics"]["eval_length"] <= 12  # policy tokens of a greedy episode: <= 2 turns x 6
    assert (tmp_path / "lab" / "lab.md").exists()
    assert {"grpo", "gspo"} <= set(json.dumps(result.report).split('"')), "both objectives are in the report"


@pytest.mark.parametrize(("sections", "field"), [
    ({"lab": {"sampled_eval_k": 4}}, "`lab.sampled_eval_k` = 4"),
    ({"gradients": {"enabled": True}}, "`gradients.enabled` = true"),
])
def test_single_turn_parts_of_a_lab_are_refused_on_an_environment(tmp_path, sections, field):
    cfg = lab_config_from_dict(multiturn_config(tmp_path / "lab", "tiny", **sections))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        validate_lab_config(cfg)
    assert ENV in str(err.value) and ("sampled_eval_k: 0" in str(err.value) or "enabled: false" in str(err.value))


@pytest.mark.slow
def test_a_multi_turn_lab_warms_up_once_per_seed_on_the_experts_episodes(tmp_path):
    """The tiny preset, warmed up on GuessNumber's expert episodes per seed; the seed's cell starts from it."""
    data = multiturn_config(tmp_path / "lab", "tiny", grid={"objectives": ["grpo"], "seeds": [0]},
                            train={"sft": {"steps": 2, "seqs_per_step": 4, "max_examples": 8}})
    data["train"].update(env={"id": "GuessNumber-v0",
                              "budget": {"max_turns": 6, "max_total_tokens": 256, "max_new_tokens_per_turn": 6}},
                         loop={**data["train"]["loop"], "steps": 1})
    result = run_lab(lab_config_from_dict(data), inline=True)
    assert sorted(result.ran) == ["train/GuessNumber-v0/grpo/seed0", "warmup/GuessNumber-v0/seed0"]
    warm = tmp_path / "lab" / "warmup" / "GuessNumber-v0" / "seed0"
    assert json.loads((warm / "warmup.json").read_text())["sft_steps"] == 2
    assert (warm / "model" / "chat_template.jinja").read_text().startswith("{% if tools %}tools: ")
    cell = tmp_path / "lab" / "cells" / "GuessNumber-v0" / "grpo" / "seed0" / "run"
    import yaml

    stored = yaml.safe_load((cell / "config.yaml").read_text())
    assert stored["model"]["name"] == str(warm / "model") and stored["sft"]["steps"] == 0
