"""A run on conversational JSONL with a chat model and a reward model: what the model, the reward functions
and the metrics see; and the config entries `{model: PATH}` of `rewards.functions`."""

from __future__ import annotations

import json
import math

import pytest
from trainer_helpers import SMALL_MODEL, small_config

from chat_helpers import CHATML, fast_tokenizer, save_classifier
from lmpo.errors import InputError
from lmpo.models import build_tiny_model
from lmpo.trainer import Trainer
from lmpo.trainer.config import ConfigError, RewardModelConfig, config_from_dict, save_config, validate_config

RECORDER = '''
CALLS = []

def record(prompts, completions, answer, **columns):
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, "columns": sorted(columns)})
    return [float(len(c[0]["content"])) for c in completions]
'''


def _chat_file(path, n=24):
    rows = [{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i % 10}+{i // 10}="}],
             "answer": str(i % 10 + i // 10), "level": i % 3} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat_config(tmp_path, rm_dir, **sections):
    data = str(_chat_file(tmp_path / "chat.jsonl"))
    base = {
        "task": {"name": "file", "path": data, "options": {"eval_fraction": 0.25}, "eval_examples": 4},
        "rewards": {"functions": ["exact_match", "chat_recorder:record", {"model": rm_dir, "name": "rm"}],
                    "weights": [1.0, 0.1, 0.5]},
        "loop": {"steps": 1, "prompts_per_step": 2, "seqs_per_microbatch": 8, "seed": 0, "device": "cpu"},
        "eval": {"at_start": False, "seqs_per_batch": 4},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return small_config(tmp_path / "run", **base)


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    (tmp_path / "chat_recorder.py").write_text(RECORDER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import chat_recorder

    chat_recorder.CALLS.clear()
    yield chat_recorder
    monkeypatch.delitem(__import__("sys").modules, "chat_recorder")


def test_conversational_run_with_a_reward_model(tmp_path, recorder):
    rm_dir = tmp_path / "rm"
    save_classifier(rm_dir, fast_tokenizer(CHATML), seed=1)
    tok = fast_tokenizer(CHATML)
    cfg = _chat_config(tmp_path, str(rm_dir))
    trainer = Trainer(cfg, model=build_tiny_model(tok, seed=0, **SMALL_MODEL), tokenizer=tok, log=lambda m: None)
    # the policy sees the rendered chat prompt; the conversation is kept for the rewards
    ex = trainer.train_examples[0]
    assert ex.prompt.startswith("<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n")
    assert ex.prompt.endswith("<|im_start|>assistant\n") and ex.messages[0] == {"role": "system", "content": "Add."}
    result = trainer.train()

    # reward functions get TRL's conversational arguments: message lists in, assistant messages out
    call = recorder.CALLS[0]
    assert len(call["prompts"]) == 2 * cfg.rollout.completions_per_prompt
    assert call["prompts"][0][0] == {"role": "system", "content": "Add."}
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in call["completions"])
    assert all(isinstance(a, str) for a in call["answer"]) and call["columns"] == ["level"]

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = next(r for r in rows if r["kind"] == "train")
    # the total is the weighted sum of the per-function means (all defined here)
    total = train["reward/exact_match/mean"] + 0.1 * train["reward/chat_recorder:record/mean"] + 0.5 * train["reward/rm/mean"]
    assert math.isclose(train["reward/mean"], total, rel_tol=1e-5, abs_tol=1e-6)
    assert train["reward/rm/std"] > 0  # the classifier scores different completions differently
    assert "eval/reward_mean" in next(r for r in rows if r["kind"] == "eval")
    assert result.steps_done == 1


def test_conversational_data_and_a_template_less_tokenizer_stop_before_training(tmp_path):
    rm_dir = tmp_path / "rm"
    save_classifier(rm_dir, fast_tokenizer(CHATML))
    tok = fast_tokenizer(chat_template=None)
    cfg = _chat_config(tmp_path, str(rm_dir), rewards={"functions": ["exact_match"], "weights": []})
    with pytest.raises(InputError, match="no chat template"):
        Trainer(cfg, model=build_tiny_model(tok, seed=0, **SMALL_MODEL), tokenizer=tok)
    # a template-less reward model is refused as well, before any step
    no_tpl = tmp_path / "rm_plain"
    save_classifier(no_tpl, fast_tokenizer(chat_template=None))
    cfg = _chat_config(tmp_path, str(no_tpl), rewards={"functions": [{"model": str(no_tpl)}], "weights": []})
    tok = fast_tokenizer(CHATML)
    with pytest.raises(InputError, match="reward model .* no chat template"):
        Trainer(cfg, model=build_tiny_model(tok, seed=0, **SMALL_MODEL), tokenizer=tok)


def test_reward_model_entries_in_the_config(tmp_path):
    rm_dir = tmp_path / "rm"
    save_classifier(rm_dir, fast_tokenizer(CHATML))
    cfg = config_from_dict({"rewards": {"functions": ["exact_match", {"model": str(rm_dir), "seqs_per_batch": 8}],
                                        "weights": [1, 0.5]}})
    assert cfg.rewards.functions[1] == RewardModelConfig(model=str(rm_dir), seqs_per_batch=8)
    assert cfg.rewards.functions[1].metric_name == "rm"
    validate_config(cfg)
    save_config(cfg, tmp_path / "c.yaml")  # plain YAML, loads back equal
    from lmpo.trainer.config import load_config

    assert load_config(tmp_path / "c.yaml") == cfg

    def bad(entry, weights=()):
        return config_from_dict({"rewards": {"functions": entry, "weights": list(weights)}})

    with pytest.raises(ConfigError, match=r"rewards.functions\[0\].model.*no-such"):
        validate_config(bad([{"model": "no-such"}]))
    with pytest.raises(ConfigError, match="not a directory"):
        validate_config(bad([{"model": str(tmp_path / "models" / "missing")}]))  # a path, not a hub 'org/name'
    with pytest.raises(ConfigError, match="no config.json"):
        validate_config(bad([{"model": str(tmp_path)}]))
    with pytest.raises(ConfigError, match="twice"):
        validate_config(bad([{"model": str(rm_dir)}, {"model": str(rm_dir)}]))
    with pytest.raises(ConfigError, match="Did you mean `model`"):
        bad([{"modle": str(rm_dir)}])
    with pytest.raises(ConfigError, match="one weight per function"):
        validate_config(bad(["exact_match", {"model": str(rm_dir)}], [1.0]))


def test_the_qwen2_chat_example_runs(tmp_path):
    """examples/hf/chat_reward_model.py: a Qwen2 chat policy, conversational JSONL and a reward model, offline."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "hf" / "chat_reward_model.py"
    spec = importlib.util.spec_from_file_location("chat_reward_model", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.main(["--out", str(tmp_path), "--steps", "2", "--sft-steps", "2"])
    assert 0.0 <= out["after"]["eval/accuracy"] <= 1.0 and (tmp_path / "run" / "plots" / "reward.png").exists()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["reward/rm/mean"]) for r in rows if r["kind"] == "train")
