"""RLVCR through the trainer: the ``rlvcr`` config section, the loop hook, and ``configs/rlvcr.yaml``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lmpo.generation import Rollout
from lmpo.models import CharTokenizer, build_tiny_model
from lmpo.tasks.thinking import addition_scratchpad
from lmpo.trainer.config import ConfigError, config_from_dict, load_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


class ScriptedRollout:
    """A rollout engine whose G completions per prompt are fixed: correct with the full scratchpad, wrong,
    correct with a one-step scratchpad, correct without a thinking block. Only the regeneration inside the
    RLVCR stage samples from the model, so the test knows exactly who is expanded."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = 0

    def sync_weights(self, model):
        pass

    def generate(self, prompts, completions_per_prompt=1, seed=None, generator=None, greedy=False):
        assert completions_per_prompt == 4
        self.calls += 1
        rows_p, rows_c, texts, ps = [], [], [], []
        for p in prompts:
            a, b = (int(x) for x in p[:-1].split("+"))
            for c in (f"<think>{addition_scratchpad(a, b)}</think>{a + b}", f"<think>0</think>{a + b + 1}",
                      f"<think>{a}+{b}</think>{a + b}", f"{a + b}"):
                rows_p.append(self.tok(p)["input_ids"])
                rows_c.append(self.tok(c, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
                texts.append(c)
                ps.append(p)
        P, T, B = max(map(len, rows_p)), max(map(len, rows_c)), len(rows_p)
        pi, pm = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, P, dtype=torch.long)
        ci, cm = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
        for i in range(B):
            pi[i, P - len(rows_p[i]):], pm[i, P - len(rows_p[i]):] = torch.tensor(rows_p[i]), 1
            ci[i, :len(rows_c[i])], cm[i, :len(rows_c[i])] = torch.tensor(rows_c[i]), 1
        group = torch.arange(len(prompts)).repeat_interleave(4)
        return Rollout(pi, pm, ci, cm, group, ps, texts, torch.zeros(B, dtype=torch.bool))


def run_config(tmp_path, **rlvcr):
    return config_from_dict({
        "task": {"name": "thinking_addition", "options": {"min_digits": 1, "max_digits": 2, "num_eval": 20},
                 "eval_examples": 4},
        "rollout": {"completions_per_prompt": 4, "max_new_tokens": 8},
        "optim": {"lr": 1e-2},
        "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 16, "seed": 0, "device": "cpu"},
        "eval": {"at_start": False, "seqs_per_batch": 4, "max_new_tokens": 4},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(tmp_path), "progress_bar": False, "tensorboard": False, "plots": False},
        "rlvcr": {"enabled": True, "budgets": [2, 4, 8, 16], **rlvcr},
    })


def train(tmp_path, **rlvcr):
    from lmpo.trainer import Trainer

    tok = CharTokenizer()
    model = build_tiny_model(tok, seed=0, **SMALL)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(run_config(tmp_path, **rlvcr), model=model, tokenizer=tok, rollout_engine=ScriptedRollout(tok),
                      log=lambda msg: None)
    result = trainer.train()
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return result, changed


def test_trainer_expands_and_trains_on_the_expanded_batch(tmp_path):
    result, changed = train(tmp_path)
    assert changed and len(result.history) == 2
    for h in result.history:
        # 2 prompts × 4 completions: 2 successes each (the bare answer fails thinking_answer) -> 4 families.
        assert h["rlvcr/successes"] == 4 and h["rlvcr/unparseable_successes"] == 0
        assert h["rlvcr/expanded_originals"] == 4 and h["rlvcr/expanded_samples"] == 12
        assert h["rlvcr/batch_seqs"] == 8 + 12
        for lvl in range(1, 5):
            for name in ("confidence", "cost", "thinking_reward", "thinking_adv"):
                assert math.isfinite(h[f"rlvcr/{name}_L{lvl}"])
        assert math.isfinite(h["loss/policy"]) and math.isfinite(h["optim/grad_norm"])
    # The per-level metrics are logged to metrics.jsonl like every other metric.
    assert "rlvcr/confidence_L1" in (tmp_path / "metrics.jsonl").read_text()


def test_thinking_weight_zero_trains_like_grpo_on_the_originals(tmp_path):
    # w = 0: every row's final advantage is its action advantage (expanded rows: their original's GRPO value).
    result, changed = train(tmp_path, thinking_weight=0.0)
    assert changed and result.history[0]["rlvcr/expanded_samples"] == 12
    assert all(h["rlvcr/final_adv_mean"] == pytest.approx(h["rlvcr/action_adv_mean"]) for h in result.history)


def test_config_section_and_shipped_config():
    cfg = load_config(ROOT / "configs" / "rlvcr.yaml")
    validate_config(cfg)
    assert cfg.rlvcr.enabled and cfg.task.name == "thinking_addition"
    assert len(cfg.rlvcr.budgets) == cfg.rlvcr.levels == 4
    with pytest.raises(ConfigError, match="rlvcr.thinking_weight"):
        config_from_dict({"rlvcr": {"thinking_weight": 2}})
    with pytest.raises(ConfigError, match="unknown config key `rlvcr.level`"):
        config_from_dict({"rlvcr": {"level": 4}})


def test_expansion_loss_thinking_reaches_the_update(tmp_path, monkeypatch):
    # The loop trains on the stage's loss mask: with expansion_loss = thinking the expanded rows' actions (the
    # answer and EOS after "</think>") carry no loss token, the originals keep every completion token.
    import lmpo.trainer.run.loop as loop_module

    seen = []
    real = loop_module.update_stage.update

    def spy(step, batch, **kw):
        seen.append(batch)
        return real(step, batch, **kw)

    monkeypatch.setattr(loop_module.update_stage, "update", spy)
    train(tmp_path, expansion_loss="thinking")
    assert len(seen) == 2
    tok = CharTokenizer()
    for batch in seen:
        assert len(batch) == 8 + 12
        for r in range(len(batch)):
            kept = tok.decode(batch.completion_ids[r][batch.loss_mask[r]].tolist(), skip_special_tokens=False)
            full = tok.decode(batch.completion_ids[r][batch.completion_ids[r] != tok.pad_token_id].tolist(),
                              skip_special_tokens=False)
            if r < 8:
                assert batch.loss_mask[r].sum() > 0 and kept == full[:len(kept)]
            else:  # an expansion: its thinking block only
                assert kept.startswith("<think>") and kept.endswith("</think>")
