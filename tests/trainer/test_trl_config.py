"""TRL GRPOConfig names as lmpo config aliases, and `lmpo train --from-trl`: the registry against TRL's own config."""

from __future__ import annotations

import dataclasses
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from lmpo.config import ConfigError, deep_merge, generated_block
from lmpo.errors import InputError
from lmpo.integrations.trl_names import (
    TRL_ALIASES,
    TRL_IGNORED,
    TRL_REFUSED,
    render_alias_table,
    translate_trl,
    trl_defaults,
)
from lmpo.objectives import Objective
from lmpo.trainer.config import TrainConfig, config_from_dict, load_config, validate_config

trl = pytest.importorskip("trl")
DOC = Path(__file__).resolve().parents[2] / "docs" / "trainer.md"

#: a value for each alias whose TRL default is None (or switches the feature off)
SAMPLE = {"epsilon_high": 0.28, "top_entropy_quantile": 0.2, "off_policy_mask_threshold": 0.5,
          "steps_per_generation": 2, "generation_batch_size": 16, "eval_steps": 5, "save_total_limit": 2,
          "top_k": 5, "max_steps": 3, "reward_weights": [1.0], "seed": 3, "warmup_steps": 2, "logging_steps": 2,
          "use_vllm": False, "report_to": ["tensorboard"], "bf16": True,
          "output_dir": "runs/trl",
          "sync_ref_model": True, "ref_model_sync_steps": 16, "ref_model_mixup_alpha": 0.5, "delta": 1.5, "mask_truncated_completions": True}


def _build(config: dict) -> tuple[TrainConfig, Objective]:
    cfg = load_config(base=config)
    validate_config(cfg)
    return cfg, Objective.preset(cfg.objective.preset, **cfg.objective.overrides)


def test_every_alias_is_a_grpo_config_field_and_maps_to_valid_lmpo_keys():
    defaults = trl_defaults()
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(TRL_ALIASES) | set(TRL_IGNORED) | set(TRL_REFUSED) <= fields
    assert not (set(TRL_ALIASES) & set(TRL_IGNORED)) and not (set(TRL_ALIASES) & set(TRL_REFUSED))
    sections = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    for name, alias in TRL_ALIASES.items():
        for target in alias.targets:  # a config field (objective keywords are checked by the build below)
            section, key = target.split(".", 1)
            assert section in sections, target
            if not key.startswith("overrides."):
                assert key in {f.name for f in dataclasses.fields(getattr(TrainConfig(), section))}, target
        value = SAMPLE.get(name, getattr(defaults[name], "value", defaults[name]))
        extra = {"loss_type": "sapo"} if name.startswith("sapo_") else {"loss_type": "vespo"} if name.startswith(
            "vespo_") else {"sync_ref_model": True, "beta": 0.04} if "ref_model" in name else {}
        t = translate_trl({name: value, **extra})
        assert name in t.mapped and not t.refused, (name, t.refused)
        _, keys, filled = t.mapped[name]
        assert not filled and keys, (name, "set nothing with a non-default value")
        assert set(keys) <= set(alias.targets), (name, keys)
        lmpo_side = {"rewards": {"functions": ["exact_match"]}} if name == "reward_weights" else {}
        _build(deep_merge(t.config, lmpo_side))  # the lmpo config and the objective accept the mapped values


def test_mixed_trl_yaml_gives_the_three_lists(tmp_path):
    text = """
num_generations: 4          # mapped
beta: 0.04                  # mapped
loss_type: cispo            # mapped (aggregation and trust region)
epsilon_high: 5.0           # mapped: TRL's cispo cap is lmpo's 1 + eps_high
push_to_hub: false          # ignored: Hub upload
logging_dir: logs           # ignored: logging detail
mask_truncated_completions: true   # mapped
fp16: true                  # refused: lmpo autocasts to bfloat16 only
delta: 1.5                  # mapped: the dual clip with c = 1.5
use_adaptive_entropy: true  # refused
num_train_epochs: 3.0       # TRL's default: ignored although lmpo could not honour another value
"""
    t = translate_trl(yaml.safe_load(text))
    given_mapped = {k for k, (_, _, filled) in t.mapped.items() if not filled}
    assert given_mapped == {"num_generations", "beta", "loss_type", "epsilon_high", "mask_truncated_completions", "delta"}
    assert set(t.ignored) == {"push_to_hub", "logging_dir", "num_train_epochs"}
    assert set(t.refused) == {"fp16", "use_adaptive_entropy"}
    assert t.mapped["delta"][1] == {"objective.overrides.dual_clip": True, "objective.overrides.dual_clip_c": 1.5}
    assert "bfloat16" in t.refused["fp16"]
    assert t.mapped["mask_truncated_completions"][1] == {"objective.mask_truncated_completions": True}
    assert t.mapped["epsilon_high"][1] == {"objective.overrides.eps_high": 4.0}
    assert t.mapped["loss_type"][1] == {"objective.overrides.aggregation": "token_mean",
                                        "objective.overrides.trust_region": "cispo"}
    # keys the file leaves out that define TRL's algorithm take TRL's defaults, marked as such
    assert t.mapped["epsilon"] == (0.2, {"objective.overrides.eps_low": 0.2}, True)
    assert t.mapped["learning_rate"][2] and t.config["optim"]["lr"] == 1e-6
    report = t.report()
    assert "refused:\n  fp16:" in report and "(TRL default)" in report


def test_unknown_key_is_an_error_naming_it():
    with pytest.raises(InputError, match=r"'num_generation' \(did you mean 'num_generations'\?\) is no field"):
        translate_trl({"num_generation": 4, "beta": 0.1})


def test_a_real_grpo_config_round_trips():
    c = trl.GRPOConfig(output_dir="out", num_generations=4, beta=0.04, epsilon=0.1, epsilon_high=0.3,
                       loss_type="dr_grpo", max_completion_length=32, learning_rate=3e-4, scale_rewards="batch",
                       importance_sampling_level="sequence", num_iterations=2, temperature=0.7, top_p=0.9,
                       per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=4,
                       bf16=False, max_steps=5, lr_scheduler_type="cosine", warmup_steps=3, weight_decay=0.01,
                       adam_beta2=0.95, max_grad_norm=0.5, seed=7, save_steps=2, save_total_limit=3,
                       sync_ref_model=True, ref_model_sync_steps=4, ref_model_mixup_alpha=0.9)
    full = c.to_dict()
    subset = {k: full[k] for k in TRL_ALIASES if k in full}
    for source in (subset, full):  # the mapped subset, and the whole dict with every Trainer field in it
        t = translate_trl(source)
        assert not t.refused, t.refused
        cfg, obj = _build(t.config)
        assert cfg.rollout.completions_per_prompt == c.num_generations
        assert cfg.rollout.max_new_tokens == c.max_completion_length
        assert (cfg.rollout.temperature, cfg.rollout.top_p) == (c.temperature, c.top_p)
        assert (obj.kl_coef, obj.eps_low, obj.eps_high) == (c.beta, c.epsilon, c.epsilon_high)
        assert obj.aggregation == "seq_sum_norm" and obj.norm_constant == c.max_completion_length
        assert obj.level == "sequence" and obj.advantage_scale == c.scale_rewards == "batch"
        assert cfg.loop.epochs_per_step == c.num_iterations
        # TRL's own __post_init__ computed the generation batch: 8 per device × 4 steps per generation
        assert cfg.loop.prompts_per_step * c.num_generations == c.generation_batch_size == 32
        assert cfg.loop.minibatches_per_step == c.steps_per_generation // c.gradient_accumulation_steps == 2
        assert cfg.loop.seqs_per_microbatch == c.per_device_train_batch_size
        assert (cfg.optim.lr, cfg.optim.schedule, cfg.optim.warmup_steps) == (3e-4, "cosine", 3)
        assert cfg.optim.betas == (0.9, 0.95) and cfg.optim.weight_decay == 0.01 and cfg.optim.max_grad_norm == 0.5
        assert (cfg.loop.steps, cfg.loop.seed, cfg.logging.run_dir) == (5, 7, "out")
        assert (cfg.checkpoint.every_steps, cfg.checkpoint.keep_last) == (2, 3)
        assert (cfg.objective.ref_sync_steps, cfg.objective.ref_sync_alpha) == (4, 0.9)  # TR-DPO


def test_loss_types_and_their_clip_parameters():
    for loss_type in ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "vespo", "luspo"):
        _, obj = _build(translate_trl({"loss_type": loss_type}).config)
        assert obj.aggregation == {"grpo": "seq_mean_token_mean", "sapo": "seq_mean_token_mean",
                                   "luspo": "seq_mean_token_sum", "dr_grpo": "seq_sum_norm"}.get(loss_type,
                                                                                                "token_mean")
        assert obj.trust_region == {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}.get(loss_type, "ppo")
    # TRL's GRPOConfig default loss_type is dapo (token mean)
    assert translate_trl({}).mapped["loss_type"] == ("dapo", {"objective.overrides.aggregation": "token_mean"}, True)
    _, sapo = _build(translate_trl({"loss_type": "sapo", "sapo_temperature_neg": 1.2, "epsilon": 0.3}).config)
    assert sapo.sapo_tau_neg == 1.2  # epsilon is not read by sapo (TRL neither), so no eps_low is set
    t = translate_trl({"loss_type": "nope"})
    assert "loss_type" in t.refused and "'nope' has no lmpo equivalent" in t.refused["loss_type"]
    t = translate_trl({"num_generations": 3, "per_device_train_batch_size": 8})
    assert "not a whole number of groups" in t.refused["per_device_train_batch_size"]


def test_trl_names_as_aliases_in_an_lmpo_config():
    cfg = config_from_dict({"num_generations": 4, "beta": 0.1, "max_completion_length": 7, "epsilon_high": 0.3,
                            "loss_type": "dr_grpo", "importance_sampling_level": "sequence", "learning_rate": 1e-3,
                            "objective": {"preset": "grpo"}})
    assert (cfg.rollout.completions_per_prompt, cfg.rollout.max_new_tokens, cfg.optim.lr) == (4, 7, 1e-3)
    assert cfg.objective.overrides == {"kl_coef": 0.1, "eps_high": 0.3, "aggregation": "seq_sum_norm",
                                       "norm_constant": 7.0, "level": "sequence"}
    with pytest.raises(ConfigError, match=r"num_generations: 4 .* contradicts rollout.completions_per_prompt: 8"):
        config_from_dict({"num_generations": 4, "rollout": {"completions_per_prompt": 8}})
    with pytest.raises(ConfigError, match="push_to_hub: a TRL GRPOConfig field that an lmpo config does not accept"):
        config_from_dict({"push_to_hub": True})
    # the same value under both names is no contradiction; a command-line override wins over a file's alias
    assert config_from_dict({"beta": 0.1, "objective": {"overrides": {"kl_coef": 0.1}}}).objective.overrides == {
        "kl_coef": 0.1}


def test_doc_table_is_the_registry():
    assert generated_block(DOC.read_text(encoding="utf-8"), "trl-aliases") == render_alias_table(), (
        "docs/trainer.md is stale: run `make docs`")


def test_from_trl_command_reports_then_refuses(tmp_path, monkeypatch):
    from lmpo.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "grpo.yaml").write_text("num_generations: 2\nfp16: true\npush_to_hub: false\n")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["train", "--from-trl", "grpo.yaml", "--print-config"])
    assert code == 2
    assert "refused:\n  fp16: lmpo autocasts to bfloat16 only" in out.getvalue()
    assert "ignored:\n  push_to_hub:" in out.getvalue()
    assert "lmpo cannot honour fp16" in err.getvalue()
    (tmp_path / "grpo.yaml").write_text("num_generations: 2\nmax_completion_length: 3\nbeta: 0.01\n")
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = main(["train", "--from-trl", "grpo.yaml", "--print-config", "--optim.lr", "0.5"])
    assert code == 0
    printed = yaml.safe_load(out.getvalue().split("refused:\n  (none)\n", 1)[1])
    assert printed["rollout"]["completions_per_prompt"] == 2 and printed["objective"]["overrides"]["kl_coef"] == 0.01
    assert printed["optim"]["lr"] == 0.5  # the command line applies on top of the TRL file
