"""lmpo's TRL adapter under TRL 1.16's own tool mode (``GRPOTrainer(tools=[...])``), on CPU with a tiny model.

TRL runs the multi-turn loop itself (``GRPOTrainer._tool_call_loop``): it parses the tool calls of each
completion, calls the Python tool, appends the tool's reply (rendered by the chat template) to the completion and
generates the next assistant turn. The reply's tokens stay inside ``completion_ids`` with ``tool_mask`` 0; TRL's
loss multiplies ``completion_mask`` by ``tool_mask`` and counts ``num_items_in_batch`` on that product.

Only the engine call (``_generate_single_turn``) is scripted, so that the random tiny model emits well-formed tool
calls; tool-call parsing, the tool itself (lmpo's calculator), the tool-reply tokens, ``tool_mask``, rewards,
advantages and the loss are TRL's and lmpo's own code. Checked:

- the batch TRL builds has tool-reply tokens inside the completions, masked by ``tool_mask``;
- under every preset the TRL adapter supports, those tokens get exactly zero gradient (log-prob and entropy),
  while the same batch with the mask dropped gives them gradient (so the check can fail);
- lmpo ``grpo`` / ``dapo`` / ``gspo`` equal TRL's own ``_compute_loss`` (loss and parameter gradients) on that
  batch, also with vLLM-style sampler log-probs (TRL writes 0.0 there for tool tokens) and TRL's
  importance-sampling ratios, and with TRL's ``top_entropy_quantile`` / ``off_policy_mask_threshold``;
- a real ``trainer.train()`` step in tool mode runs with lmpo's loss and changes the weights.
"""

from __future__ import annotations

import json
import random
import tempfile

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from lmpo.envs.tools import calculate
from lmpo.integrations.trl import LmpoGRPOTrainer
from lmpo.models import build_chat_tokenizer, build_tiny_model
from lmpo.objectives import PRESETS, Objective

TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)

#: ChatML with Hermes / Qwen-style tool calls: tools listed in a system turn, ``<tool_call>{json}</tool_call>`` in
#: assistant turns, tool replies as ``tool`` turns. Prefix-preserving, as TRL's tool mode requires.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] or '' }}"
    "{%- if m['tool_calls'] is defined and m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: transformers' response schema for that format. TRL's own schemas wrap each call with a jmespath ``transform``;
#: this one parses the call's JSON into ``function`` directly, so parsing never needs jmespath.
RESPONSE_SCHEMA = {
    "x-regex": r"^(?P<content>(?:(?!<tool_call>)[\s\S])*?)"
               r"(?P<tool_calls>(?:<tool_call>(?:(?!</tool_call>)[\s\S])+</tool_call>)+)?(?:<\|im_end\|>)?$",
    "type": "object",
    "properties": {
        "role": {"const": "assistant"},
        "content": {"type": "string"},
        "tool_calls": {
            "type": "array", "x-regex-iterator": r"<tool_call>(.+?)</tool_call>",
            "items": {"type": "object", "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "x-parser": "json", "properties": {
                    "name": {"type": "string"}, "arguments": {"type": "object", "additionalProperties": {}}}}}},
        },
    },
}

CALLS: list[str] = []


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: for example 2+3
    """
    CALLS.append(expression)
    return str(calculate(expression))  # lmpo's calculator (walks the syntax tree, no eval)


def last_turn_digits(completions, **kwargs):
    """Digits in the last assistant turn: varies across a group of scripted completions."""
    return [float(sum(ch.isdigit() for ch in (c[-1].get("content") or ""))) for c in completions]


PROMPTS = [[{"role": "user", "content": f"What is {a}+{b}?"}] for a, b in [(2, 3), (4, 5), (1, 1), (7, 8)]]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One torch thread (see ``one_torch_thread`` in tests/conftest.py), for the module-scoped fixtures too."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def jmespath_guard():
    """TRL 1.16 refuses tools on transformers < 5.13 unless jmespath is installed, because its bundled response
    schemas use jmespath transforms. RESPONSE_SCHEMA has none (parsing is checked in the tests), so the guard
    is lifted when jmespath is missing; with jmespath installed nothing is patched."""
    with pytest.MonkeyPatch.context() as mp:
        if not trl_grpo.is_jmespath_available():
            mp.setattr(trl_grpo, "is_jmespath_available", lambda: True)
        yield


def make_tool_trainer(objective="grpo", **overrides):
    tokenizer = build_chat_tokenizer(TOOL_TEMPLATE)
    tokenizer.response_schema = RESPONSE_SCHEMA
    model = build_tiny_model(tokenizer, seed=0, **TINY)
    args = dict(output_dir=tempfile.mkdtemp(prefix="lmpo_trl_tools_"), per_device_train_batch_size=4,
                num_generations=4, max_completion_length=160, max_steps=1, use_cpu=True, report_to="none", bf16=False,
                logging_steps=1, learning_rate=1e-2, save_strategy="no", gradient_accumulation_steps=2,
                disable_tqdm=True, temperature=0.7)
    args.update(overrides)
    dataset = Dataset.from_dict({"prompt": PROMPTS * 4})
    return LmpoGRPOTrainer(model, last_turn_digits, GRPOConfig(**args), train_dataset=dataset,
                           processing_class=tokenizer, tools=[calculator], objective=objective)


def scripted_engine(trainer, seed, sampler_noise=None):
    """Replaces the engine call only. A first turn is a calculator call (60 %) or a short answer; a turn after a
    tool reply is a number. With ``sampler_noise`` it also returns vLLM-style sampler log-probs (the model's own
    plus noise), as ``use_vllm`` does."""
    tokenizer, model = trainer.processing_class, trainer.model
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completions, logprobs = [], []
        for ids in prompt_ids:
            after_tool = "<|im_start|>tool\n" in tokenizer.decode(ids[-40:])
            if after_tool:
                text = str(rng.randint(0, 999))
            elif rng.random() < 0.6:
                call = {"name": "calculator", "arguments": {"expression": f"{rng.randint(0, 9)}+{rng.randint(0, 9)}"}}
                text = f"<tool_call>{json.dumps(call)}</tool_call>"
            else:
                text = "x" * rng.randint(1, 4) + str(rng.randint(0, 9))
            completion = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            completions.append(completion)
            if sampler_noise is not None:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids + completion])).logits[0, len(ids) - 1:-1]
                    logp = torch.log_softmax(logits.float() / trainer.temperature, -1)
                    logp = logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]
                logprobs.append((logp + sampler_noise * torch.randn(logp.shape, generator=g)).tolist())
        return completions, (logprobs if sampler_noise is not None else None)

    return single_turn


def tool_batch(trainer, monkeypatch, seed=0, sampler_noise=None):
    """One generation batch (2 prompts × 4 completions) scored by TRL's ``_generate_and_score_completions``."""
    monkeypatch.setattr(trainer, "_generate_single_turn", scripted_engine(trainer, seed, sampler_noise))
    return trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS[:2] for _ in range(4)])


@pytest.fixture(scope="module")
def trainer(jmespath_guard):
    return make_tool_trainer()


@pytest.fixture(scope="module")
def batch(trainer):
    CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        inputs = tool_batch(trainer, mp, seed=0)
    inputs = with_old_logps(trainer, trainer.model, inputs, noise=0.0)
    # the model's log-probs, computed once: no test here takes an optimizer step
    inputs["model_logps"] = inputs.pop("old_per_token_logps")
    inputs["calls"] = list(CALLS)
    return inputs


def tool_tokens(inputs):
    """(B, T) bool: completion tokens TRL marked as tool output."""
    return inputs["completion_mask"].bool() & ~inputs["tool_mask"].bool()


def test_trl_tool_mode_puts_masked_tool_replies_inside_the_completions(trainer, batch):
    tokenizer = trainer.processing_class
    parsed = tokenizer.parse_response('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}'
                                      '</tool_call><|im_end|>')
    assert parsed["tool_calls"] == [{"type": "function",
                                     "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]
    assert batch["calls"], "the scripted turns called the tool"
    ids, masked = batch["completion_ids"], tool_tokens(batch)
    model_tokens = batch["completion_mask"].bool() & batch["tool_mask"].bool()
    with_tool = masked.any(-1)
    assert 0 < int(with_tool.sum()) < ids.shape[0]  # some completions called the tool, some did not
    replies = [tokenizer.decode(ids[i][masked[i]]) for i in range(ids.shape[0]) if with_tool[i]]
    results = [str(calculate(e)) for e in batch["calls"]]
    for reply, result in zip(replies, results):
        assert reply.startswith("<|im_start|>tool\n" + result + "<|im_end|>")  # the tool's output, masked
    for i in range(ids.shape[0]):
        if with_tool[i]:  # the call before the reply and the answer after it are the policy's tokens
            first, last = masked[i].nonzero()[[0, -1], 0].tolist()
            assert model_tokens[i, :first].all() and model_tokens[i, last + 1:].any()
    # TRL's dapo normaliser counts the policy's tokens only
    assert int(batch["num_items_in_batch"]) == int(model_tokens.sum())


def per_token_grads(trainer, model, inputs):
    """∂loss/∂log-prob and ∂loss/∂entropy per completion token, from the tensors TRL's forward returns."""
    captured = {}
    forward = trainer._get_per_token_logps_and_entropies

    def capture(*args, **kwargs):
        logps, entropies, aux = forward(*args, **kwargs)
        captured["logps"], captured["entropies"] = logps, entropies
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capture
    try:
        loss = trainer.compute_loss(model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies
    d_logp, d_entropy = torch.autograd.grad(loss, [captured["logps"], captured["entropies"]], allow_unused=True)
    trainer.lmpo_driver.discard_step()
    return d_logp, torch.zeros_like(d_logp) if d_entropy is None else d_entropy


def with_old_logps(trainer, model, inputs, noise, seed=1):
    """The batch with old log-probs = the model's own plus noise, so ratios differ from 1 and clipping binds."""
    inputs = dict(inputs)
    logp = inputs.pop("model_logps", None)
    if logp is None:
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            logp, *_ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                                  inputs["completion_ids"].shape[1])
    g = torch.Generator().manual_seed(seed)
    inputs["old_per_token_logps"] = logp + noise * torch.randn(logp.shape, generator=g)
    return inputs


@pytest.mark.parametrize("name", list(PRESETS))
def test_tool_tokens_get_zero_gradient_under_every_preset(trainer, batch, name):
    objective = Objective.preset(name, advantage_scale="group")
    if objective.adaptive_entropy:
        objective = objective.replace(entropy_target=10.0)  # gate open: the entropy term acts on the tokens
    trainer.objective = objective
    if trainer.entropy_controller is not None:
        trainer.entropy_controller.c = 0.3
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = with_old_logps(trainer, model, batch, noise=2e-4 if objective.is_sequence_level else 0.3)
    d_logp, d_entropy = per_token_grads(trainer, model, inputs)
    tool = tool_tokens(inputs)
    assert torch.equal(d_logp[tool], torch.zeros_like(d_logp[tool]))
    assert torch.equal(d_entropy[tool], torch.zeros_like(d_entropy[tool]))
    assert d_logp[~tool & inputs["completion_mask"].bool()].abs().sum() > 0


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo"])
def test_the_zero_gradient_check_can_fail(trainer, batch, name):
    """The same batch without TRL's tool mask puts gradient on the tool replies (one preset per aggregation and
    level), so the check above would catch an adapter that dropped the mask."""
    objective = Objective.preset(name, advantage_scale="group")
    trainer.objective = objective
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = with_old_logps(trainer, model, batch, noise=2e-4 if objective.is_sequence_level else 0.3)
    d_logp, _ = per_token_grads(trainer, model, {k: v for k, v in inputs.items() if k != "tool_mask"})
    assert d_logp[tool_tokens(inputs)].abs().sum() > 0


def assert_equals_trl(trainer, model, inputs, trl_settings, monkeypatch):
    """lmpo's loss and parameter gradients equal TRL's own ``_compute_loss`` on ``inputs``; dropping the tool mask
    from lmpo's inputs breaks the equality of the gradients (the tool tokens matter for this batch)."""
    params = [p for p in model.parameters() if p.requires_grad]
    got = trainer.compute_loss(model, inputs)
    got_grads = torch.autograd.grad(got, params)
    unmasked = trainer.compute_loss(model, {k: v for k, v in inputs.items() if k != "tool_mask"})
    unmasked_grads = torch.autograd.grad(unmasked, params)
    trainer.lmpo_driver.discard_step()
    for key, value in trl_settings.items():
        monkeypatch.setattr(trainer, key, value)
    want = GRPOTrainer._compute_loss(trainer, model, inputs)
    want_grads = torch.autograd.grad(want, params)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    assert not all(torch.allclose(u, w, rtol=1e-3, atol=1e-6) for u, w in zip(unmasked_grads, want_grads))


TRL_CASES = [
    ("grpo", dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="token"), 0.3),
    ("dapo", dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, importance_sampling_level="token"), 0.3),
    ("gspo", dict(loss_type="grpo", epsilon_low=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence"),
     2e-4),
]


@pytest.mark.parametrize(("name", "trl_settings", "noise"), TRL_CASES, ids=[c[0] for c in TRL_CASES])
def test_loss_equals_trl_own_loss_on_a_tool_batch(trainer, batch, monkeypatch, name, trl_settings, noise):
    trainer.objective = Objective.preset(name, advantage_scale="group")
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = with_old_logps(trainer, model, batch, noise=noise)
    assert_equals_trl(trainer, model, inputs, trl_settings, monkeypatch)


@pytest.mark.parametrize("settings", [dict(top_entropy_quantile=0.2), dict(off_policy_mask_threshold=0.04)],
                         ids=["top_entropy_quantile", "off_policy_mask_threshold"])
def test_trl_token_selection_settings_on_a_tool_batch_equal_trl(trainer, batch, monkeypatch, settings):
    """TRL's high-entropy token selection and its off-policy sequence mask both read the masked tokens only (the
    entropy quantile over them, the sequence KL as their mean); as lmpo parts they give TRL's loss on the batch."""
    for key, value in settings.items():
        monkeypatch.setattr(trainer, key, value)
        monkeypatch.setattr(trainer.args, key, value)
    trainer.objective = Objective.preset("grpo", advantage_scale="group")  # the setting fills in the part
    assert {trainer.objective.parts["credit"].name, trainer.objective.parts["rejection"].name} & {
        "high_entropy", "off_policy_seq"}
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = with_old_logps(trainer, model, batch, noise=0.3)
    if "off_policy_mask_threshold" in settings:  # the threshold rejects some sequences, not all
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        kept = GRPOTrainer.get_off_policy_mask(
            advantages=inputs["advantages"].unsqueeze(1), per_token_logps=batch["model_logps"],
            sampling_per_token_logps=inputs["old_per_token_logps"], mask=mask,
            off_policy_threshold=settings["off_policy_mask_threshold"])
        assert 0 < float(kept.float().mean()) < 1
    assert_equals_trl(trainer, model, inputs, dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2,
                                                   importance_sampling_level="token"), monkeypatch)


VLLM_TOOL_CASES = [
    ("dapo", "token_truncate", 0.8, 1.15, dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28,
                                               importance_sampling_level="token")),
    ("gspo", "sequence_mask", 0.5, 2.0, dict(loss_type="grpo", epsilon_low=3e-4, epsilon_high=4e-4,
                                             importance_sampling_level="sequence")),
]


@pytest.mark.parametrize(("name", "mode", "clip_min", "clip_max", "trl_settings"), VLLM_TOOL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in VLLM_TOOL_CASES])
def test_vllm_sampler_logps_on_a_tool_batch_equal_trl(trainer, monkeypatch, name, mode, clip_min, clip_max,
                                                      trl_settings):
    """With ``use_vllm`` TRL keeps the sampler's log-probs and writes 0.0 for tool tokens; its importance-sampling
    ratios mask them. lmpo's correction from the same log-probs gives TRL's loss and gradients."""
    settings = dict(use_vllm=True, vllm_mode="server", vllm_importance_sampling_correction=True,
                    vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
                    vllm_importance_sampling_clip_max=clip_max)
    for key, value in settings.items():
        monkeypatch.setattr(trainer, key, value, raising=False)
        monkeypatch.setattr(trainer.args, key, value)
    trainer.objective = Objective.preset(name, advantage_scale="group")
    assert trainer.objective.parts["correction"].name == ("tis" if "truncate" in mode else "mis")
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    model.train()
    inputs = tool_batch(trainer, monkeypatch, seed=3, sampler_noise=0.05 if "sequence" in mode else 0.3)
    tool = tool_tokens(inputs)
    assert tool.any() and (inputs["sampling_per_token_logps"][tool] == 0).all()  # TRL's placeholder
    assert_equals_trl(trainer, model, inputs, trl_settings, monkeypatch)


def test_a_training_step_in_trl_tool_mode(jmespath_guard, monkeypatch):
    trainer = make_tool_trainer("dapo", scale_rewards="group")
    monkeypatch.setattr(trainer, "_generate_single_turn", scripted_engine(trainer, seed=5))
    scored = []
    score = trainer._generate_and_score_completions

    def record(*args, **kwargs):
        scored.append(score(*args, **kwargs))
        return scored[-1]

    monkeypatch.setattr(trainer, "_generate_and_score_completions", record)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    change = max(float((a - b.detach()).abs().max()) for a, b in zip(before, trainer.model.parameters()))
    assert change > 1e-4 and trainer.state.global_step == 1
    assert scored and tool_tokens(scored[0]).any()
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] == 0
    assert {"loss/policy", "clip/high_frac", "ratio/mean", "entropy/mean"} <= set(logged)
