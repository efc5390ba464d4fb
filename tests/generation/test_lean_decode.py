"""The lean CPU decode step (``lmpo.generation.lean``) against the model's own forward: greedy tokens equal to
``model.generate`` and to the generic loop, seeded samples equal to the generic loop's draw for draw, across
left padding, cache lengths past a multiple of 64, rows finishing at different steps, Llama and Qwen2
configurations built in code (grouped-query heads, biases), weights changed between calls, and the one-line
fallback for another architecture."""

import copy
import warnings

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lmpo.generation import HFRollout
from lmpo.generation.lean import LeanDecoder, unsupported
from lmpo.models import load_model_and_tokenizer, load_tokenizer

# left padding: the prompts differ in length by up to 9 tokens
PROMPTS = ["12+34=", "5+6=", "rev abc=", "98+7=", "1+1="]


def _random_model(cls, config_cls, tok, seed: int = 0, **extra):
    """A random-init HF causal LM of ``config_cls`` over the tiny tokenizer (grouped-query heads, no download)."""
    config = config_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, tie_word_embeddings=False, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():  # biases and norms away from their init, so that the step must apply them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def _models():
    tok = load_tokenizer("tiny")
    return {
        "tiny": load_model_and_tokenizer("tiny", seed=0)[0],
        "tiny-wide": load_model_and_tokenizer("tiny-wide", seed=1)[0],
        "llama-gqa-bias": _random_model(LlamaForCausalLM, LlamaConfig, tok, attention_bias=True, mlp_bias=True,
                                        head_dim=24),
        "qwen2": _random_model(Qwen2ForCausalLM, Qwen2Config, tok, seed=1),
    }, tok


def _eos_scaled(model, tok, scale: float):
    """``model`` with its EOS head row scaled (no hook: a hook would take the model off the lean path)."""
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= scale
    return model


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.mark.parametrize("name", ["tiny", "tiny-wide", "llama-gqa-bias", "qwen2"])
def test_greedy_equals_hf_generate_and_the_generic_loop(models, name):
    zoo, tok = models
    model = _eos_scaled(copy.deepcopy(zoo[name]), tok, 0.0)  # a zero EOS logit: no greedy row stops early
    kwargs = dict(max_new_tokens=60, temperature=0.0)  # 9-token prompts + 60 new tokens: the cache crosses 64
    lean = HFRollout(model, tok, **kwargs)
    a = lean.generate(PROMPTS, 2)
    assert lean.decode_mode == "lean"
    generic = HFRollout(model, tok, lean_decode=False, **kwargs)
    b = generic.generate(PROMPTS, 2)
    assert generic.decode_mode == "eager"
    c = HFRollout(model, tok, impl="generate", **kwargs).generate(PROMPTS, 2)
    assert a.completion_ids.shape == (10, 60) and a.completion_mask.all()
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_ids, c.completion_ids)


@pytest.mark.parametrize("name", ["tiny", "llama-gqa-bias", "qwen2"])
def test_step_logits_equal_the_models_forward(models, name):
    """Teacher-forced: the lean step's logits at every position equal one forward over the whole sequence."""
    zoo, tok = models
    model = zoo[name]
    enc = tok(PROMPTS, padding=True, return_tensors="pt", padding_side="left")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    B, P = ids.shape
    T = 8
    cont = torch.randint(4, len(tok), (B, T), generator=torch.Generator().manual_seed(0))
    full_ids, full_mask = torch.cat([ids, cont], 1), torch.cat([mask, torch.ones_like(cont)], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = model(input_ids=full_ids, attention_mask=full_mask, position_ids=positions).logits[:, P:]
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions[:, :P], use_cache=True)
        layers = out.past_key_values.layers
        hd, kv = model.model.layers[0].self_attn.head_dim, model.config.num_key_value_heads
        caches = []
        for layer in layers:
            keys, values = torch.zeros(B, kv, P + T, hd), torch.zeros(B, kv, P + T, hd)
            keys[:, :, :P], values[:, :, :P] = layer.keys, layer.values
            caches.append((keys, values))
        decoder = LeanDecoder(model)
        decoder.refresh()
        for t in range(T):
            blocked = ~full_mask[:, None, None, : P + t + 1].bool()
            got = decoder.step(cont[:, t], positions[:, P + t, None], P + t, blocked, caches)
            torch.testing.assert_close(got, want[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.9, 20)])
@pytest.mark.parametrize("name", ["tiny", "tiny-wide", "llama-gqa-bias", "qwen2"])
def test_sampled_tokens_equal_the_generic_loop_seed_for_seed(models, name, temperature, top_p, top_k):
    zoo, tok = models
    kwargs = dict(max_new_tokens=24, temperature=temperature, top_p=top_p, top_k=top_k, ignore_eos=True,
                  record_logprobs=True)
    a = HFRollout(zoo[name], tok, **kwargs).generate(PROMPTS, 4, seed=3)
    b = HFRollout(zoo[name], tok, lean_decode=False, **kwargs).generate(PROMPTS, 4, seed=3)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)  # bit for bit: the same arithmetic in the same order


def test_rows_finishing_at_different_steps(models):
    """EOS stops rows at different steps and the loop drops finished rows: lean and generic agree throughout."""
    _, tok = models
    model = _eos_scaled(_random_model(LlamaForCausalLM, LlamaConfig, tok, seed=2), tok, 40.0)
    for greedy in (True, False):
        kwargs = dict(max_new_tokens=16, temperature=1.0, record_logprobs=True)
        a = HFRollout(model, tok, **kwargs).generate(PROMPTS, 6, seed=1, greedy=greedy)
        b = HFRollout(model, tok, lean_decode=False, **kwargs).generate(PROMPTS, 6, seed=1, greedy=greedy)
        lengths = a.completion_mask.sum(-1)
        assert 1 < lengths.unique().numel() and (~a.truncated).any()  # rows stopped at several steps
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.completion_mask, b.completion_mask) and torch.equal(a.truncated, b.truncated)
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    ref = HFRollout(model, tok, max_new_tokens=16, temperature=0.0, impl="generate").generate(PROMPTS, 1)
    got = HFRollout(model, tok, max_new_tokens=16, temperature=0.0).generate(PROMPTS, 1)
    assert torch.equal(got.completion_ids, ref.completion_ids)


def test_weights_written_in_place_are_read_again(models):
    """An optimizer step writes the parameters in place: the next call decodes with the new weights."""
    _, tok = models
    model = load_model_and_tokenizer("tiny", seed=3)[0]
    engine = HFRollout(model, tok, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    before = engine.generate(PROMPTS, 1).completion_ids
    optim = torch.optim.SGD(model.parameters(), lr=5.0)
    model(input_ids=torch.tensor([[1, 5, 6, 7]]), labels=torch.tensor([[1, 5, 6, 7]])).loss.backward()
    optim.step()
    after = engine.generate(PROMPTS, 1).completion_ids
    generic = HFRollout(model, tok, max_new_tokens=12, temperature=0.0, ignore_eos=True, lean_decode=False)
    assert torch.equal(after, generic.generate(PROMPTS, 1).completion_ids)
    assert not torch.equal(before, after)
    # a write through .data (as the rollout worker loads pushed weights) bumps no version counter
    for p in model.parameters():
        p.data.mul_(1.5)
    assert torch.equal(engine.generate(PROMPTS, 1).completion_ids, generic.generate(PROMPTS, 1).completion_ids)
    assert not torch.equal(engine.generate(PROMPTS, 1).completion_ids, after)


def test_other_architectures_fall_back_with_one_line():
    tok = load_tokenizer("tiny")
    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    assert unsupported(model).startswith("architecture GPT2LMHeadModel")
    engine = HFRollout(model, tok, max_new_tokens=5, temperature=0.0, ignore_eos=True)
    with pytest.warns(RuntimeWarning, match="lean CPU decode unavailable: architecture GPT2LMHeadModel") as record:
        a = engine.generate(PROMPTS, 1)
    assert len(record) == 1 and engine.decode_mode == "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per model
        engine.generate(PROMPTS, 1)
    b = HFRollout(model, tok, max_new_tokens=5, temperature=0.0, ignore_eos=True, lean_decode=False).generate(
        PROMPTS, 1)
    assert torch.equal(a.completion_ids, b.completion_ids)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LeanDecoder(model)


def test_a_forward_hook_takes_the_model_off_the_lean_path():
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    engine = HFRollout(model, tok, max_new_tokens=3, temperature=0.0)
    engine.generate(PROMPTS, 1)
    assert engine.decode_mode == "lean"
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out)
    with pytest.warns(RuntimeWarning, match="forward hooks on lm_head"):
        engine.generate(PROMPTS, 1)
    assert engine.decode_mode == "eager"
    handle.remove()
    engine.generate(PROMPTS, 1)
    assert engine.decode_mode == "lean"


def test_rollout_lean_decode_switch_reaches_the_engine():
    from lmpo.trainer.config import config_from_dict
    from lmpo.trainer.run.build import build_rollout_engine

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    for on in (True, False):
        cfg = config_from_dict({"model": {"name": "tiny"}, "rollout": {"lean_decode": on, "max_new_tokens": 2}})
        engine = build_rollout_engine(cfg, model, tok)
        engine.generate(PROMPTS[:1], 1)
        assert engine.decode_mode == ("lean" if on else "eager")


@pytest.mark.parametrize("d", [64, 128, 896])
def test_fused_rms_norm_is_llama_rms_norm_bit_for_bit(d):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from lmpo.generation.lean import _rms_norm

    norm = LlamaRMSNorm(d, eps=1e-5)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(d, generator=g))
            x = torch.randn(128, d, generator=g) * (seed + 1)
            assert torch.equal(_rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))
