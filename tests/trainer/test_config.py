"""Config loading, overrides, validation messages and the generated reference doc."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from lmpo.trainer.config import (
    ConfigError,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_overrides,
    render_config_reference,
    save_config,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]


def test_overrides_parse_yaml_scalars_and_nest():
    argv = ["--objective.preset", "dapo", "--optim.lr=1e-4", "--loop.steps", "7",
            "--objective.overrides.eps_high", "0.3", "--logging.tensorboard", "false"]
    got = parse_overrides(argv)
    # YAML 1.1 reads "1e-4" as a string; the typed config turns it into the float the field declares
    assert got == {"objective": {"preset": "dapo", "overrides": {"eps_high": 0.3}}, "optim": {"lr": "1e-4"},
                   "loop": {"steps": 7}, "logging": {"tensorboard": False}}
    cfg = load_config(None, argv)
    assert cfg.optim.lr == 1e-4 and cfg.loop.steps == 7 and cfg.objective.overrides == {"eps_high": 0.3}


def test_yaml_plus_overrides_and_roundtrip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("loop:\n  steps: 5\n  prompts_per_step: 4\nrollout:\n  completions_per_prompt: 6\n")
    cfg = load_config(path, ["--loop.steps", "9", "--optim.betas", "[0.8, 0.9]"])
    assert cfg.loop.steps == 9 and cfg.loop.prompts_per_step == 4 and cfg.optim.betas == (0.8, 0.9)
    # derived totals carry units: 4 prompts x 6 completions = 24 sequences per step
    assert cfg.seqs_per_step == 24 and cfg.total_optimizer_steps == 9
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loop.steps = 3  # type: ignore[misc]


def test_example_configs_load_and_validate():
    for name in ("demo.yaml", "addition_grpo.yaml", "addition_dapo_lora.yaml"):
        validate_config(load_config(ROOT / "configs" / name))


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config_from_dict(data))
    return str(info.value)


def test_unknown_preset_names_field_value_and_choices():
    msg = _error({"objective": {"preset": "grpoo"}})
    assert "objective.preset" in msg and "'grpoo'" in msg and "Did you mean 'grpo'" in msg


def test_rollout_engine_names_come_from_the_registry():
    from lmpo.generation import ENGINES

    msg = _error({"rollout": {"engine": "vlm"}})
    assert "rollout.engine" in msg and "'vlm'" in msg and "Did you mean 'vllm'" in msg
    assert all(name in msg for name in ENGINES)
    msg = _error({"rollout": {"vllm_gpu_memory_utilization": 1.5}})
    assert "rollout.vllm_gpu_memory_utilization" in msg and "1.5" in msg


def test_group_size_one_with_grpo_advantages():
    msg = _error({"rollout": {"completions_per_prompt": 1}})
    assert "rollout.completions_per_prompt" in msg and "= 1" in msg and ">= 2" in msg


def test_missing_task_file():
    msg = _error({"task": {"name": "file", "path": "/nonexistent/data.jsonl"}})
    assert "task.path" in msg and "/nonexistent/data.jsonl" in msg and "does not exist" in msg


def test_reward_path_that_does_not_import():
    msg = _error({"rewards": {"functions": ["no_such_pkg.rewards:score"]}})
    assert "rewards.functions[0]" in msg and "no_such_pkg" in msg and "does not import" in msg
    msg = _error({"rewards": {"functions": ["lmpo.trainer.demo:no_such_function"]}})
    assert "no callable 'no_such_function'" in msg
    msg = _error({"rewards": {"functions": ["exact_mach"]}})
    assert "Did you mean 'exact_match'" in msg


def test_unknown_key_suggests_close_match():
    with pytest.raises(ConfigError, match=r"unknown config key `loop.prompt_per_step`.*Did you mean `prompts_per_step`"):
        config_from_dict({"loop": {"prompt_per_step": 8}})
    with pytest.raises(ConfigError, match=r"unknown config key `optimizer`.*Did you mean `optim`"):
        config_from_dict({"optimizer": {"lr": 1e-3}})


def test_type_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"`loop.steps` = 'many' must be an integer"):
        config_from_dict({"loop": {"steps": "many"}})


def test_bad_objective_override_and_minibatch_split():
    msg = _error({"objective": {"overrides": {"eps_hihg": 0.3}}})
    assert "objective.overrides" in msg and "eps_hihg" in msg
    msg = _error({"loop": {"prompts_per_step": 3, "minibatches_per_step": 5}})  # 3 x 8 = 24 seqs, 5 ∤ 24
    assert "loop.minibatches_per_step" in msg and "24" in msg


def test_bad_config_fails_before_any_model_is_built(monkeypatch, tmp_path):
    import lmpo.models

    def boom(*a, **k):
        raise AssertionError("a model was built before validation")

    monkeypatch.setattr(lmpo.models, "load_model_and_tokenizer", boom)
    from lmpo.trainer import Trainer

    with pytest.raises(ConfigError, match="rollout.completions_per_prompt"):
        Trainer(config_from_dict({"rollout": {"completions_per_prompt": 1},
                                  "logging": {"run_dir": str(tmp_path)}}))


def test_every_field_is_documented_and_the_doc_matches():
    def walk(cls):
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if dataclasses.is_dataclass(default):
                yield from walk(type(default))
            else:
                assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
                yield f.name

    assert len(list(walk(TrainConfig))) > 50
    reference = render_config_reference()
    doc = (ROOT / "docs" / "trainer.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- config-reference:start -->\n(.*?)<!-- config-reference:end -->", doc, re.S)
    assert m, "docs/trainer.md lacks the config-reference markers"
    assert m.group(1) == reference, "docs/trainer.md is stale: run `make docs`"
    from lmpo.trainer.config import render_metrics_reference

    m = re.search(r"<!-- metrics:start -->\n(.*?)<!-- metrics:end -->", doc, re.S)
    assert m and m.group(1) == render_metrics_reference(), "docs/trainer.md metric table is stale: run `make docs`"
    # every section key of the dataclass appears in the doc
    for key in config_to_dict(TrainConfig()):
        assert f"### `{key}`" in reference


def test_saved_config_is_plain_yaml(tmp_path):
    save_config(TrainConfig(), tmp_path / "c.yaml")
    data = yaml.safe_load((tmp_path / "c.yaml").read_text())
    assert data["rollout"]["completions_per_prompt"] == 8 and data["model"]["lora"]["enabled"] is False


def test_demo_yaml_equals_embedded_demo_config():
    from lmpo.trainer.demo import demo_config

    assert load_config(ROOT / "configs" / "demo.yaml") == demo_config()


@pytest.mark.parametrize("name", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
                                  "gdpo"])
def test_peer_advantage_estimators_are_accepted(name):
    validate_config(config_from_dict({"objective": {"advantage_estimator": name}}))
    # only the estimators that compare a prompt's completions need G >= 2
    one = {"objective": {"advantage_estimator": name}, "rollout": {"completions_per_prompt": 1}}
    if name in ("reinforce_plus_plus", "remax"):
        validate_config(config_from_dict(one))
    else:
        msg = _error(one)
        assert "rollout.completions_per_prompt" in msg and repr(name) in msg


def test_advantage_options_are_validated_naming_the_option():
    ok = {"objective": {"advantage_estimator": "gdpo",
                        "advantage_options": {"whiten": "sequences", "eps": "1e-4", "scale": "none"}}}
    validate_config(config_from_dict(ok))  # YAML 1.1 reads 1e-4 as a string: coerced like every number
    msg = _error({"objective": {"advantage_estimator": "reinforce_plus_plus", "advantage_options": {"whitten": "x"}}})
    assert "objective.advantage_options.whitten" in msg and "Did you mean 'whiten'" in msg
    msg = _error({"objective": {"advantage_estimator": "gpg", "advantage_options": {"valid": "all"}}})
    assert "objective.advantage_options.valid" in msg and "'all'" in msg and "group_signal" in msg
    msg = _error({"objective": {"advantage_estimator": "gpg", "advantage_options": {"f_norm": -1.0}}})
    assert "objective.advantage_options.f_norm" in msg and "-1.0" in msg and "out of range" in msg
    msg = _error({"objective": {"advantage_estimator": "remax", "advantage_options": {"scale": "group"}}})
    assert "objective.advantage_options.scale" in msg and "'remax' has no option 'scale'" in msg
    msg = _error({"objective": {"advantage_estimator": "reinforce_plus_plus"}, "rollout": {}}
                 | {"objective": {"advantage_estimator": "reinforce_pp"}})
    assert "objective.advantage_estimator" in msg and "reinforce_plus_plus" in msg


def test_kl_reward_defaults_have_one_source_and_idle_fields_are_named():
    """The KL-in-reward fields declare ``needs="kl_in_reward"``; their defaults are written only in the fields,
    and the controller the trainer builds from a default config starts from them."""
    from lmpo.config import idle_fields
    from lmpo.trainer.config import ObjectiveConfig, RewardsConfig
    from lmpo.trainer.run.build import build_kl_controller

    fields = {f.name: f.default for f in dataclasses.fields(ObjectiveConfig) if f.metadata.get("needs")}
    assert fields == {"kl_reward_estimator": "k1", "kl_reward_coef": 0.001, "kl_ctrl_type": "fixed",
                      "kl_ctrl_target": 0.1, "kl_ctrl_horizon": 10000}
    assert idle_fields(ObjectiveConfig(), "kl_in_reward") == []
    moved = ObjectiveConfig(kl_ctrl_horizon=5, kl_reward_coef=0.5)
    assert idle_fields(moved, "kl_in_reward") == ["kl_reward_coef", "kl_ctrl_horizon"]
    assert idle_fields(dataclasses.replace(moved, kl_in_reward=True), "kl_in_reward") == []
    with pytest.raises(ConfigError, match=r"`objective.kl_reward_coef` = 0.5 \(and objective.kl_ctrl_horizon\) has "
                                          "no effect while `objective.kl_in_reward` is false"):
        moved.validate()
    ctrl = build_kl_controller(ObjectiveConfig(kl_in_reward=True, kl_ctrl_type="adaptive"))
    assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.001, 0.1, 10000)
    with pytest.raises(ConfigError, match=r"set it > 0 \(verl's default 0.1\)"):
        ObjectiveConfig(kl_in_reward=True, kl_ctrl_type="adaptive", kl_ctrl_target=0.0).validate()
    assert idle_fields(RewardsConfig(pool="process"), "workers") == ["pool"]
    assert idle_fields(RewardsConfig(pool="process", workers=2), "workers") == []


def test_flat_objective_keys_keep_loading(tmp_path):
    """ObjectiveConfig keeps its flat keys (stored run configs and the TRL aliases write them)."""
    cfg = load_config(None, ["--objective.kl_in_reward", "true", "--objective.kl_reward_coef", "0.01",
                             "--objective.ref_sync_steps", "2"])
    assert (cfg.objective.kl_in_reward, cfg.objective.kl_reward_coef, cfg.objective.ref_sync_steps) == (True, 0.01, 2)
