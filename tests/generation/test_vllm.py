"""VLLMRollout: the conversion of vLLM's outputs (any machine) and the engine itself (CUDA + vLLM only).

The engine tests need a CUDA GPU and the ``vllm`` package (``pip install 'lmpo[vllm]'``); elsewhere they skip
with that reason. The conversion test runs everywhere on objects shaped like vLLM's ``RequestOutput``.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from lmpo.errors import InputError
from lmpo.generation import HFRollout, sequence_logprobs
from lmpo.generation.vllm import VLLMRollout, to_rollout
from lmpo.models import load_model_and_tokenizer

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_gpu_vllm = pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()),
                                    reason="VLLMRollout needs a CUDA GPU and the vllm package (lmpo[vllm])")


def _completion(ids, logps, finish):
    return SimpleNamespace(token_ids=ids, finish_reason=finish,
                           logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logps)])


def test_outputs_become_a_padded_rollout():
    _, tok = load_model_and_tokenizer("tiny")
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a, b, c = tok.convert_tokens_to_ids(["a", "b", "c"])
    prompts = ["1+1=", "22+3="]
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    outputs = [
        SimpleNamespace(outputs=[_completion([a, eos], [-0.5, -0.25], "stop"),
                                 _completion([b, c, a], [-1.0, -2.0, -3.0], "length")]),
        SimpleNamespace(outputs=[_completion([c, eos], [-0.1, -0.2], "stop"),
                                 _completion([eos], [-0.7], "stop")]),
    ]
    ro = to_rollout(outputs, prompts, prompt_ids, 2, tok, [eos], ignore_eos=False, with_logprobs=True)
    assert ro.completion_ids.tolist() == [[a, eos, pad], [b, c, a], [c, eos, pad], [eos, pad, pad]]
    assert ro.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert ro.truncated.tolist() == [False, True, False, False]
    assert ro.completions == ["a", "bca", "c", ""]
    assert ro.group_ids.tolist() == [0, 0, 1, 1] and ro.prompts == ["1+1=", "1+1=", "22+3=", "22+3="]
    torch.testing.assert_close(ro.logprobs, torch.tensor(
        [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0], [-0.1, -0.2, 0.0], [-0.7, 0.0, 0.0]]))
    P = max(len(p) for p in prompt_ids)  # left-padded prompts, the layout of HFRollout
    assert ro.prompt_ids.shape == (4, P) and ro.prompt_mask[0].tolist() == [0] + [1] * (P - 1)
    assert ro.prompt_ids[2].tolist() == prompt_ids[1]


@pytest.mark.skipif(HAS_VLLM, reason="checks the message given when vllm is not installed")
def test_missing_vllm_is_an_input_error_naming_the_extra():
    model, tok = load_model_and_tokenizer("tiny")
    with pytest.raises(InputError, match=r"lmpo\[vllm\]"):
        VLLMRollout(model, tok)


@pytest.fixture(scope="module")
def tiny_cuda():
    model, tok = load_model_and_tokenizer("tiny", device="cuda")
    return model, tok


PROMPTS = ["12+34=", "5+6=", "rev abc="]


@needs_gpu_vllm
def test_greedy_equals_the_hf_engine(tiny_cuda):
    model, tok = tiny_cuda
    ours = HFRollout(model, tok, max_new_tokens=8, temperature=0.0).generate(PROMPTS, 2)
    theirs = VLLMRollout(model, tok, max_new_tokens=8, temperature=0.0, gpu_memory_utilization=0.2).generate(
        PROMPTS, 2)
    n = ours.completion_ids.shape[1]
    assert torch.equal(theirs.completion_mask[:, :n], ours.completion_mask)
    assert torch.equal(theirs.completion_ids[:, :n], ours.completion_ids)


@needs_gpu_vllm
def test_sampler_logprobs_match_the_trainers_and_weights_sync(tiny_cuda):
    model, tok = tiny_cuda
    engine = VLLMRollout(model, tok, max_new_tokens=8, temperature=0.8, gpu_memory_utilization=0.2)
    ro = engine.generate(PROMPTS, 4, seed=0)
    with torch.no_grad():
        ours = sequence_logprobs(model, ro.input_ids, ro.attention_mask, ro.completion_ids.shape[1],
                                 temperature=0.8).logprobs
    mask = ro.completion_mask.bool()
    torch.testing.assert_close(ro.logprobs[mask], ours[mask], atol=2e-3, rtol=0)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # a different policy: after the sync, vLLM's greedy output must be its greedy output
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    try:
        engine.sync_weights(model)
        theirs = engine.generate(PROMPTS, 1, greedy=True)
        ours = HFRollout(model, tok, max_new_tokens=8, temperature=0.0).generate(PROMPTS, 1)
        n = ours.completion_ids.shape[1]
        assert torch.equal(theirs.completion_ids[:, :n], ours.completion_ids)
    finally:
        model.load_state_dict(saved)


# ---------------------------------------------------------------- LoRA: the adapter alone to vLLM (any machine)
def _lora_policy(modules_to_save=None):
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                        modules_to_save=modules_to_save)
    return get_peft_model(model, config), tok


def test_adapter_snapshot_holds_the_adapter_alone_and_replaces_older_versions(tmp_path):
    from safetensors.torch import load_file

    from lmpo.generation.vllm import adapter_snapshot

    model, _ = _lora_policy()
    first = adapter_snapshot(model, tmp_path, 1)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n).add_(1.0)
    second = adapter_snapshot(model, tmp_path, 2)
    assert not first.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["v2"]
    tensors = load_file(second / "adapter_model.safetensors")
    assert tensors and all("lora_" in name for name in tensors)  # no base weight travels
    lora_b = [t for n, t in tensors.items() if "lora_B" in n]
    assert any(bool((t == 1.0).all()) for t in lora_b)  # the new values, not the first snapshot's
    assert (second / "adapter_config.json").exists()


def test_adapter_sync_refuses_what_vllm_would_not_see():
    from lmpo.generation.vllm import check_adapter_syncable

    plain, _ = load_model_and_tokenizer("tiny")
    with pytest.raises(InputError, match="needs a LoRA policy"):
        check_adapter_syncable(plain)
    extra, _ = _lora_policy(modules_to_save=["lm_head"])
    with pytest.raises(InputError, match="outside its adapter"):
        check_adapter_syncable(extra)
    model, _ = _lora_policy()
    assert check_adapter_syncable(model) == 4


class _FakeLLM:
    """Records what VLLMRollout asks of vLLM's ``LLM`` (construction, generate, prefix-cache resets)."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.resets = kwargs, [], 0
        _FakeLLM.instances.append(self)

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, prompts, sampling_params, use_tqdm, **kwargs):
        self.calls.append(kwargs)
        return [SimpleNamespace(outputs=[_completion([5, 6], [-0.5, -0.5], "length")] * p.n)
                for p in sampling_params]


def test_adapter_sync_wiring_with_a_recording_vllm(monkeypatch, tmp_path):
    # the calls VLLMRollout makes to vLLM with lora_sync="adapter" (the engine itself runs only on a GPU)
    import sys
    from types import ModuleType

    from safetensors.torch import load_file

    fake = ModuleType("vllm")
    fake.LLM = _FakeLLM
    fake.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    request = ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, int_id, path: SimpleNamespace(name=name, id=int_id, path=path)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.lora", ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # VLLMRollout fills in the rank-0 rendezvous variables it finds unset (os.environ.setdefault); set here, they
    # are undone after the test instead of leaking into later tests of this process and their subprocesses
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29500")):
        monkeypatch.setenv(key, value)
    model, tok = _lora_policy()
    engine = VLLMRollout(model, tok, max_new_tokens=2, lora_sync="adapter")
    llm = _FakeLLM.instances[-1]
    assert llm.kwargs["enable_lora"] and llm.kwargs["max_lora_rank"] == 4 and llm.kwargs["max_loras"] == 1
    base = load_file(f"{llm.kwargs['model']}/model.safetensors")  # the base weights under the plain names
    assert base and not any("lora_" in n or "base_layer" in n or n.startswith("base_model") for n in base)
    assert "model.layers.0.self_attn.q_proj.weight" in base
    first = engine._lora_request
    engine.sync_weights(model)
    second = engine._lora_request
    assert (first.id, second.id) == (1, 2) and first.path != second.path and llm.resets == 2
    engine.generate(["1+1="], 2, seed=0)
    assert llm.calls[-1]["lora_request"] is second
    fresh = VLLMRollout(_lora_policy()[0], tok, max_new_tokens=2, lora_sync="adapter")
    assert fresh._lora_request.id == 1  # each engine numbers its own adapter versions
    with pytest.raises(InputError, match="vllm_lora_sync"):
        VLLMRollout(model, tok, lora_sync="both")
