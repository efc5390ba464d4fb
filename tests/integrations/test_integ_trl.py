"""Contract tests of lmpo.integrations.trl against the real TRL 1.16 (CPU, built-in tiny model, offline).

- every preset: ``LmpoGRPOTrainer.compute_loss`` on a constructed TRL inputs dict equals the core
  ``Objective`` on log-probs computed independently from the model's logits (loss and parameter grads),
  with TRL's gradient-accumulation / global-token normalisers;
- lmpo grpo / dapo / dr_grpo / gspo through the subclass equal TRL's own loss for the matching loss_type;
- a few optimizer steps of real GRPO training change the weights, the entropy controller steps once per
  optimizer step; unsupported settings are refused with the fix in the message.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from lmpo.integrations.trl import CONTROLLER_STATE_FILE, LmpoGRPOTrainer, check_trl_args, objective_for_trl
from lmpo.models import CharTokenizer, build_tiny_model
from lmpo.objectives import PRESETS, Objective, lm_head_grad_norm, logits_grad_norm

TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)
PROMPTS = ["1+1=", "2+3=", "4+4=", "5+1="]


def digit_reward(completions, **kwargs):
    """Fraction of digits in the completion: varied on an untrained model, so advantages are non-zero."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def grpo_args(**overrides):
    base = dict(
        output_dir=tempfile.mkdtemp(prefix="lmpo_trl_"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, max_steps=2, use_cpu=True, report_to="none", bf16=False, logging_steps=1,
        learning_rate=1e-2, save_strategy="no", gradient_accumulation_steps=2, disable_tqdm=True,
        temperature=0.7,
    )
    base.update(overrides)
    return GRPOConfig(**base)


def make_trainer(objective, from_path=False, **arg_overrides):
    tokenizer = CharTokenizer()
    model = build_tiny_model(tokenizer, seed=0, **TINY)
    if from_path:  # TRL builds its reference model (beta != 0) from the policy's path
        path = tempfile.mkdtemp(prefix="lmpo_tiny_")
        model.save_pretrained(path)
        model = path
    dataset = Dataset.from_dict({"prompt": PROMPTS * 4})
    return LmpoGRPOTrainer(model, digit_reward, grpo_args(**arg_overrides), train_dataset=dataset,
                           processing_class=tokenizer, objective=objective)


@pytest.fixture(scope="module")
def trainer():
    return make_trainer(Objective.preset("grpo"))


def trl_inputs(seed, vocab, noise, B=4, P=5, T=7):
    """A TRL training micro-batch as ``_generate_and_score_completions`` returns it (left-padded prompts,
    right-padded completions); old log-probs are filled in by the caller."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(4, vocab, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    completion_ids = torch.randint(4, vocab, (B, T), generator=g)
    lengths = torch.tensor([T, 3, 5, 1])
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": torch.randn(B, generator=g),
        # the whole generation batch (steps_per_generation = 2 micro-batches) on one process
        "num_items_in_batch": completion_mask.sum() * 2 + 3,
        "noise": noise * torch.randn(B, T, generator=g),
    }


def reference_logps(model, inputs, temperature):
    """log π(y_t) and entropy from the model's full logits (TRL computes them with its fused LM head)."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T = inputs["completion_ids"].shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    logits = out.logits[:, -T - 1 : -1] / temperature  # (B, T, V)
    logp_all = torch.log_softmax(logits.float(), -1)
    logp = logp_all.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, logits, out.hidden_states[-1][:, -T - 1 : -1]


def grads(loss, model):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("name", [*PRESETS, "grad_adaptive:logits"])
def test_compute_loss_equals_core_for_every_preset(trainer, name):
    name, _, grad_norm_mode = name.partition(":")
    overrides = {"grad_norm_mode": grad_norm_mode} if grad_norm_mode else {}
    # advantage_scale: the trainer's scale_rewards (it tells the caller how to scale; no effect on the loss)
    objective = Objective.preset(name, advantage_scale="group", **overrides)
    trainer.objective = objective
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = trl_inputs(seed=len(name), vocab=len(trainer.processing_class),
                        noise=5e-4 if objective.is_sequence_level else 0.3)
    logp, entropy, logits, hidden = reference_logps(model, inputs, trainer.temperature)
    inputs["old_per_token_logps"] = logp.detach() + inputs.pop("noise")
    mask = inputs["completion_mask"]
    B = mask.shape[0]
    if objective.aggregation == "token_mean":  # TRL dapo: N_gen / processes · GA / steps_per_generation
        norm = {"num_tokens": inputs["num_items_in_batch"] / 1 * 2 / trainer.args.steps_per_generation}
    else:  # TRL grpo / dr_grpo: rows of the micro-batch times GA
        norm = {"num_seqs": float(B * 2)}
    core = objective
    if objective.aggregation == "seq_sum_norm":
        core = objective.replace(norm_constant=float(trainer.args.max_completion_length))
    extra = {}
    if "token_grad_norm" in objective.needs:
        # the hidden states are the head's input: lm_head(h)/temperature reproduces the logits
        torch.testing.assert_close(model.lm_head(hidden) / trainer.temperature, logits)
        extra["token_grad_norm"] = (lm_head_grad_norm(hidden, logits, inputs["completion_ids"],
                                                      logit_scale=1 / trainer.temperature)
                                    if objective.grad_norm_mode == "lm_head"
                                    else logits_grad_norm(logits, inputs["completion_ids"]))
    if objective.adaptive_entropy:
        trainer.entropy_controller.c = 0.3  # a non-zero coefficient, so the entropy term is exercised
        extra["entropy_coef"] = trainer.entropy_controller.coef
    torch.manual_seed(0)  # clip_cov draws from the global RNG
    want_loss, want_stats = core(logp, inputs["old_per_token_logps"], inputs["advantages"], mask, entropy=entropy,
                                 **norm, **extra)
    want_grads = grads(want_loss, model)
    torch.manual_seed(0)
    got_loss = trainer.compute_loss(model, inputs)
    got_grads = grads(got_loss, model)
    torch.testing.assert_close(got_loss, want_loss, rtol=2e-5, atol=1e-6)
    for got, want in zip(got_grads, want_grads):
        if want is None:
            assert got is None or not got.any()
            continue
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert sum(float(g.abs().sum()) for g in want_grads if g is not None) > 0
    window = trainer.lmpo_driver.pending[-1]  # the micro-batch's statistics, still on device (no sync yet)
    assert tuple(window) == tuple(want_stats)
    torch.testing.assert_close(window["loss/policy"].float(), want_stats["loss/policy"].float(), rtol=2e-5,
                               atol=1e-6)
    trainer.lmpo_driver.discard_step()


def _inputs_with_old_logps(trainer, model, seed: int, seq: bool):
    """TRL inputs whose old log-probs are the model's own plus noise (small for sequence-level ratios)."""
    inputs = trl_inputs(seed=seed, vocab=len(trainer.processing_class), noise=2e-4 if seq else 0.3)
    with torch.no_grad():
        logp, *_ = reference_logps(model, inputs, trainer.temperature)
    inputs["old_per_token_logps"] = logp + inputs.pop("noise")
    return inputs, logp


def _assert_equals_trl_loss(trainer, model, inputs, trl_settings, monkeypatch) -> None:
    """lmpo's loss and gradients on ``inputs`` equal TRL's own ``_compute_loss`` configured by ``trl_settings``."""
    got_loss = trainer.compute_loss(model, inputs)
    got_grads = grads(got_loss, model)
    for key, value in trl_settings.items():
        monkeypatch.setattr(trainer, key, value)
    want_loss = GRPOTrainer._compute_loss(trainer, model, inputs)
    want_grads = grads(want_loss, model)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    trainer.lmpo_driver.discard_step()


@pytest.mark.parametrize(
    ("name", "trl_settings"),
    [
        ("grpo", dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="token")),
        ("dapo", dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, importance_sampling_level="token")),
        ("dr_grpo", dict(loss_type="dr_grpo", epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="token")),
        ("gspo", dict(loss_type="grpo", epsilon_low=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence")),
    ],
)
def test_presets_equal_trl_own_loss(trainer, monkeypatch, name, trl_settings):
    """Same inputs through TRL's own ``GRPOTrainer._compute_loss`` configured like the preset."""
    trainer.objective = Objective.preset(name, advantage_scale="group")
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    seq = trl_settings["importance_sampling_level"] == "sequence"
    inputs, _ = _inputs_with_old_logps(trainer, model, seed=7, seq=seq)
    _assert_equals_trl_loss(trainer, model, inputs, trl_settings, monkeypatch)


@pytest.mark.parametrize("name", ["dapo", "gspo"])
def test_training_steps_change_the_weights(name):
    trainer = make_trainer(Objective.preset(name))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    change = max(float((a - b.detach()).abs().max()) for a, b in zip(before, trainer.model.parameters()))
    assert change > 1e-4
    logged = trainer.state.log_history[0]
    assert {"loss/policy", "ratio/mean", "clip/low_frac", "entropy/mean"} <= set(logged)
    assert trainer.state.global_step == 2


def test_adaptive_entropy_controller_steps_once_per_optimizer_step_and_is_checkpointed():
    # target above the tiny model's entropy (≈ ln 100): c rises by Δ each optimizer step, gate open
    objective = Objective.preset("adaptive_entropy", entropy_target=10.0, entropy_delta=0.01)
    trainer = make_trainer(objective, save_strategy="steps", save_steps=2)  # 2 steps × 2 micro-batches
    trainer.train()
    controller = trainer.entropy_controller
    assert controller.steps == 2
    assert controller.c == pytest.approx(0.02)
    coefs = [row["entropy/coef"] for row in trainer.state.log_history if "entropy/coef" in row]
    assert coefs == pytest.approx([0.01, 0.02])
    assert 0 < controller.last_entropy < 10
    # the checkpoint carries the controller; loading it restores the state in a fresh trainer
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-2")
    with open(os.path.join(checkpoint, CONTROLLER_STATE_FILE)) as f:
        assert json.load(f) == controller.state_dict()
    fresh = make_trainer(objective)
    fresh.create_optimizer_and_scheduler(num_training_steps=2)
    fresh._load_optimizer_and_scheduler(checkpoint)
    assert fresh.entropy_controller.state_dict() == controller.state_dict()


def test_eval_mode_logs_immediately_without_accumulation(trainer):
    trainer.objective = Objective.preset("dapo")
    model = trainer.model
    model.eval()
    try:
        inputs = trl_inputs(seed=31, vocab=len(trainer.processing_class), noise=0.2)
        with torch.no_grad():
            logp, entropy, *_ = reference_logps(model, inputs, trainer.temperature)
            inputs["old_per_token_logps"] = logp + inputs.pop("noise")
            trainer._metrics["eval"].clear()
            got = trainer.compute_loss(model, inputs)
        # eval: TRL's dapo normaliser without the accumulation window, num_items_in_batch / processes
        want, stats = Objective.preset("dapo")(logp, inputs["old_per_token_logps"], inputs["advantages"],
                                               inputs["completion_mask"], entropy=entropy,
                                               num_tokens=inputs["num_items_in_batch"])
        torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-6)
        assert trainer._metrics["eval"]["clip/high_frac"] == [pytest.approx(float(stats["clip/high_frac"]))]
        assert trainer.lmpo_driver.pending == []
    finally:
        model.train()


@pytest.mark.parametrize(
    ("objective", "settings", "match"),
    [
        ("grpo", dict(beta=0.04), "beta=0.04"),
        ("grpo", dict(entropy_coef=0.01), "entropy_coef"),
        (Objective.preset("grpo", credit="temporal_decay"), dict(top_entropy_quantile=0.2), "top_entropy_quantile"),
        (Objective.preset("grpo", rejection="divergence"), dict(off_policy_mask_threshold=0.5),
         "off_policy_mask_threshold"),
        ("dr_grpo", dict(), "scale_rewards"),
        (Objective.preset("grad_adaptive", grad_norm_mode="exact"), dict(), "exact"),
        (Objective.preset("grpo", kl_coef=0.05), dict(beta=0.05), "use_bias_correction_kl"),
        (Objective.preset("grpo", kl_coef=0.05, kl_ratio_weighted=True), dict(beta=0.05, use_bias_correction_kl=False),
         "kl_ratio_weighted=True"),
    ],
)
def test_unsupported_settings_are_refused(objective, settings, match):
    obj = Objective.preset(objective) if isinstance(objective, str) else objective
    with pytest.raises(ValueError, match=match):
        check_trl_args(obj, grpo_args(**settings))


def test_reference_kl_uses_trl_ref_logps():
    """beta = kl_coef: TRL loads the reference model and passes ref_per_token_logps to the objective."""
    objective = Objective.preset("grpo", kl_coef=0.05, kl_estimator="k3")
    trainer = make_trainer(objective, from_path=True, beta=0.05, use_bias_correction_kl=False)
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    inputs = trl_inputs(seed=3, vocab=len(trainer.processing_class), noise=0.3)
    logp, entropy, *_ = reference_logps(model, inputs, trainer.temperature)
    inputs["old_per_token_logps"] = logp.detach() + inputs.pop("noise")
    inputs["ref_per_token_logps"] = logp.detach() - 0.1
    got = trainer.compute_loss(model, inputs)
    want, stats = objective(logp, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"],
                            ref_logp=inputs["ref_per_token_logps"], entropy=entropy, num_seqs=4.0)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-6)
    assert float(stats["loss/kl_ref"]) > 0


def test_example_script_builds_the_trainer(tmp_path):
    """examples/trl/train_lmpo_trl.py wires preset, overrides, task and rewards into LmpoGRPOTrainer."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "trl", "train_lmpo_trl.py")
    spec = importlib.util.spec_from_file_location("train_lmpo_trl", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = script.parse_args([
        "--model", "tiny", "--task", "addition", "--task-option", "num_train=32", "--preset", "dr_grpo",
        "--override", "eps_high=0.3", "--override", "dual_clip=true", "--use-cpu", "--max-steps", "1",
        "--prompts-per-device", "2", "--completions-per-prompt", "2", "--max-completion-length", "4",
        "--output-dir", str(tmp_path),
    ])
    trainer = script.build_trainer(args)
    objective = trainer.objective
    assert (objective.name, objective.eps_high, objective.dual_clip) == ("dr_grpo", 0.3, True)
    assert objective.norm_constant == 4.0  # Dr. GRPO's constant: the max completion length
    assert trainer.args.scale_rewards == "none" and len(trainer.train_dataset) == 32


def scored_batch(trainer, monkeypatch, noise, seed=0):
    """A batch made by TRL's own ``_generate_and_score_completions`` with "vLLM" sampler log-probs: only the
    engine call is replaced, by fixed completions whose sampler log-probs are the model's own plus noise. TRL then
    computes the old log-probs, rewards, advantages and its importance-sampling ratios itself."""
    model, vocab = trainer.model, len(trainer.processing_class)
    g = torch.Generator().manual_seed(seed)

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completions, logprobs = [], []
        for i, ids in enumerate(prompt_ids):
            completion = torch.randint(4, vocab, (2 + i % 4,), generator=g).tolist()
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids + completion])).logits[0, len(ids) - 1:-1]
                logp = torch.log_softmax(logits.float() / trainer.temperature, -1)
                logp = logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]
            completions.append(completion)
            logprobs.append((logp + noise * torch.randn(logp.shape, generator=g)).tolist())
        return completions, logprobs

    monkeypatch.setattr(trainer, "_generate_single_turn", single_turn)
    return trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS[:2] for _ in range(4)])


def use_vllm_is(trainer, monkeypatch, mode, clip_min, clip_max):
    """TRL's vLLM importance-sampling settings on the trainer and its args (no vLLM engine is started)."""
    settings = dict(use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
                    vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max)
    for key, value in settings.items():
        monkeypatch.setattr(trainer, key, value)
        monkeypatch.setattr(trainer.args, key, value)


VLLM_CASES = [
    ("token_truncate", 0.8, 1.15, "dapo", dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28,
                                               importance_sampling_level="token"), 0.3),
    ("token_mask", 0.8, 1.25, "grpo", dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2,
                                           importance_sampling_level="token"), 0.3),
    ("sequence_truncate", None, 1.1, "gspo", dict(loss_type="grpo", epsilon_low=3e-4, epsilon_high=4e-4,
                                                  importance_sampling_level="sequence"), 0.15),
    ("sequence_mask", 0.85, 1.2, "grpo", dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2,
                                              importance_sampling_level="token"), 0.15),
    ("token_mask", 0.8, 1.25, "vespo", dict(loss_type="vespo", importance_sampling_level="token"), 0.3),
]


@pytest.mark.parametrize(("mode", "clip_min", "clip_max", "name", "trl_settings", "noise"), VLLM_CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in VLLM_CASES])
def test_vllm_importance_sampling_modes_equal_trl(trainer, monkeypatch, mode, clip_min, clip_max, name,
                                                  trl_settings, noise):
    """TRL's four ``vllm_importance_sampling_mode``s become lmpo's ``tis`` / ``mis`` correction computed from the
    sampler's log-probs; the loss and parameter gradients equal TRL's ``_compute_loss`` on the batch TRL's own
    rollout code scored (its ratios ``importance_sampling_ratio``; VESPO folds them into its weight)."""
    use_vllm_is(trainer, monkeypatch, mode, clip_min, clip_max)
    trainer.objective = Objective.preset(name, advantage_scale="group")
    correction = trainer.objective.parts["correction"]
    assert (correction.name, correction.is_min, correction.is_max) == ("tis" if "truncate" in mode else "mis",
                                                                       clip_min, clip_max)
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = scored_batch(trainer, monkeypatch, noise)
    ratio = inputs["importance_sampling_ratio"]
    raw = torch.exp(((inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"])
                     * inputs["completion_mask"]).sum(-1, keepdim=ratio.shape[-1] == 1) if ratio.shape[-1] == 1
                    else (inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]))
    valid = inputs["completion_mask"].bool() if ratio.shape[-1] != 1 else torch.ones_like(ratio, dtype=torch.bool)
    changed = (ratio != raw) & valid
    assert changed.any() and not changed[valid].all()  # the thresholds bind for some weights only
    _assert_equals_trl_loss(trainer, model, inputs, trl_settings, monkeypatch)


def test_cov_control_runs_under_vllm_correction(trainer, monkeypatch):
    """clip_cov / kl_cov under vLLM: no longer refused; the weights multiply the terms, the selection sees A."""
    use_vllm_is(trainer, monkeypatch, "token_truncate", None, 1.2)
    trainer.objective = Objective.preset("kl_cov", advantage_scale="group")
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    inputs = scored_batch(trainer, monkeypatch, 0.3, seed=1)
    logp, entropy, *_ = reference_logps(model, inputs, trainer.temperature)
    got = trainer.compute_loss(model, inputs)
    want, _ = trainer.objective(logp, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"],
                                entropy=entropy, rollout_logp=inputs["sampling_per_token_logps"],
                                num_tokens=inputs["num_items_in_batch"] / trainer.args.steps_per_generation)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-6)
    assert trainer.lmpo_driver.pending[-1]["rollout/weight_mean"] > 0
    trainer.lmpo_driver.discard_step()


@pytest.mark.parametrize(
    ("settings", "kind", "part"),
    [(dict(top_entropy_quantile=0.2), "credit", "high_entropy"),
     (dict(off_policy_mask_threshold=0.5), "rejection", "off_policy_seq")],
)
def test_trl_part_settings_become_objective_parts(settings, kind, part):
    args = grpo_args(**settings)
    check_trl_args(Objective.preset("grpo"), args)
    objective = objective_for_trl(Objective.preset("grpo"), args)
    assert objective.parts[kind].name == part
    with pytest.raises(ValueError, match=f"objective already has {kind}="):
        check_trl_args(Objective.preset("grpo", **{kind: "temporal_decay" if kind == "credit" else "divergence"}),
                       args)


def test_composed_objective_trains_under_trl():
    """CISPO × sequence level × TIS × low_var_kl runs real TRL GRPO steps (the sampler is the policy here, so the
    sampler log-probs are TRL's old log-probs and the correction weights are 1)."""
    objective = Objective(level="sequence", trust_region="cispo", correction="tis", kl_estimator="low_var_kl",
                          kl_coef=0.01, kl_ratio_weighted=True, advantage_scale="group")
    trainer = make_trainer(objective, from_path=True, beta=0.01)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    change = max(float((a - b.detach()).abs().max()) for a, b in zip(before, trainer.model.parameters()))
    assert change > 1e-4 and trainer.state.global_step == 2
    logged = trainer.state.log_history[0]
    assert {"rollout/weight_mean", "rollout/kl_k3", "loss/kl_ref", "clip/high_frac"} <= set(logged)
    assert logged["rollout/weight_mean"] == pytest.approx(1.0) and logged["rollout/kl_k3"] == pytest.approx(0.0)
