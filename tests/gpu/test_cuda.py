"""What only a GPU can show (``pytest -m gpu``; skipped without CUDA; run by benchmarks/gpu/run.sh):
bf16 autocast against float32, the fused log-prob head against the naive form on CUDA, the CUDA-graph decode
against Hugging Face ``generate`` and the eager loop, gradient checkpointing, and two trainer steps on CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = ["12+34=", "5+6=", "rev abc=", "7*8="]


def _qwen2(tok, hidden=256, layers=3, dtype=torch.float32, seed=0):
    """A small random-initialised Qwen2 (GQA, tied embeddings) on the GPU over lmpo's character vocabulary."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


@pytest.fixture(scope="module")
def tok():
    from lmpo.models import load_tokenizer

    return load_tokenizer("tiny")


def _batch(tok, seqs=8, prompt=24, completion=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, len(tok), (seqs, prompt + completion), generator=gen).cuda()
    attn = torch.ones_like(ids)
    attn[: seqs // 2, : prompt // 3] = 0  # left padding on half the rows
    adv = torch.randn(seqs, generator=gen).cuda()
    return ids, attn, ids[:, prompt:], adv


def _grpo_grads(model, ids, attn, completion, adv, autocast: bool):
    from lmpo.generation import policy_logprobs
    from lmpo.objectives import Objective

    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else torch.autocast("cuda", enabled=False)
    with ctx:
        fwd = policy_logprobs(model, ids, attn, completion, with_grad=True, with_entropy=True)
    loss, _ = Objective.preset("grpo")(fwd.logp, fwd.logp.detach() + 0.01, adv, torch.ones_like(completion).bool())
    loss.backward()
    return loss.detach(), fwd.logp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_bf16_autocast_step_matches_float32(tok):
    from lmpo.generation import avoid_cudnn_attention

    assert avoid_cudnn_attention()  # what the trainer does on CUDA: cuDNN's backward gave NaN here (H100)
    model = _qwen2(tok)
    ids, attn, completion, adv = _batch(tok)
    loss32, logp32, grad32 = _grpo_grads(model, ids, attn, completion, adv, autocast=False)
    loss16, logp16, grad16 = _grpo_grads(model, ids, attn, completion, adv, autocast=True)
    assert logp16.dtype == torch.float32  # the log-softmax runs in float32 under autocast
    assert (logp16 - logp32).abs().max() < 0.05  # bf16 matmuls: ~3 significant digits in the logits
    assert abs(float(loss16 - loss32)) < 0.02 * max(1.0, abs(float(loss32)))
    cosine = torch.nn.functional.cosine_similarity(grad16, grad32, dim=0)
    assert cosine > 0.99, float(cosine)
    assert 0.9 < float(grad16.norm() / grad32.norm()) < 1.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_head_logprobs_on_cuda_match_naive(dtype):
    from lmpo.generation.logprobs import head_log_softmax

    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, V = 4, 300, 256, 32768
    hidden = torch.randn(B, T, H, device="cuda", generator=gen).to(dtype).requires_grad_()
    head = torch.nn.Linear(H, V, bias=False, device="cuda", dtype=dtype)
    with torch.no_grad():
        head.weight.normal_(0, 0.05, generator=gen)
    index = torch.randint(0, V, (B, T), device="cuda", generator=gen)
    upstream = torch.randn(B, T, device="cuda", generator=gen)
    # reference: float32 logits from the same (rounded) inputs
    h_ref = hidden.detach().float().requires_grad_()
    w_ref = head.weight.detach().float().requires_grad_()
    ref = torch.log_softmax(h_ref @ w_ref.T / 0.7, -1).gather(-1, index[..., None])[..., 0]
    (ref * upstream).sum().backward()
    logp, _ = head_log_softmax(hidden, head, index, temperature=0.7, chunk_rows=256)  # several blocks
    (logp * upstream).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(logp, ref.detach(), atol=tol * 10, rtol=tol)
    for got, want in ((hidden.grad, h_ref.grad), (head.weight.grad, w_ref.grad)):
        rel = (got.float() - want).norm() / want.norm()
        assert rel < tol, (dtype, float(rel))


def test_cuda_graph_decode_matches_hf_generate_and_the_eager_loop(tok):
    from lmpo.generation import HFRollout

    model = _qwen2(tok)
    # greedy, 300 tokens per row whatever the model emits (a random model stops at random places)
    graphs = HFRollout(model, tok, max_new_tokens=300, temperature=0.0, ignore_eos=True, cuda_graphs=True)
    hf = HFRollout(model, tok, max_new_tokens=300, temperature=0.0, ignore_eos=True, impl="generate")
    a, b = graphs.generate(PROMPTS, 2), hf.generate(PROMPTS, 2)
    assert graphs.decode_mode == "cuda_graphs" and len(graphs._graphs.graphs) == 2  # crossed a bucket edge
    assert a.completion_ids.shape == b.completion_ids.shape == (8, 300)
    assert torch.equal(a.completion_ids, b.completion_ids)
    # sampled, with the sampler's log-probs: the replayed graphs draw what the eager loop draws
    graphs = HFRollout(model, tok, max_new_tokens=300, temperature=1.0, record_logprobs=True, cuda_graphs=True)
    eager = HFRollout(model, tok, max_new_tokens=300, temperature=1.0, record_logprobs=True)
    for seed in (1, 2):
        a, b = graphs.generate(PROMPTS, 4, seed=seed), eager.generate(PROMPTS, 4, seed=seed)
        assert torch.equal(a.completion_ids, b.completion_ids)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    assert graphs.decode_mode == "cuda_graphs" and eager.decode_mode == "eager"


def test_gradient_checkpointing_gives_the_same_gradients(tok):
    model = _qwen2(tok)
    ids, attn, completion, adv = _batch(tok)
    model.train()
    loss_a, _, grad_a = _grpo_grads(model, ids, attn, completion, adv, autocast=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss_b, _, grad_b = _grpo_grads(model, ids, attn, completion, adv, autocast=False)
    assert model.is_gradient_checkpointing
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad_b, grad_a, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("autocast", [False, True])
def test_trainer_steps_on_cuda(tmp_path, autocast):
    from lmpo.trainer import Trainer
    from lmpo.trainer.config import config_from_dict

    cfg = config_from_dict({
        "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 2}, "eval_examples": 16},
        "rollout": {"completions_per_prompt": 4, "max_new_tokens": 12},
        "objective": {"preset": "grpo"},
        "loop": {"steps": 2, "prompts_per_step": 4, "device": "cuda", "autocast": autocast,
                 "gradient_checkpointing": True, "minibatches_per_step": 2},
        "eval": {"at_start": False, "max_new_tokens": 8},
        "logging": {"run_dir": str(tmp_path / "run"), "progress_bar": False, "tensorboard": False},
    })
    trainer = Trainer(cfg, log=lambda msg: None)
    result = trainer.train()
    assert result.steps_done == 2
    assert trainer.rollout_engine.decode_mode == "cuda_graphs"
    assert all(torch.isfinite(torch.tensor(h["loss/total"])) for h in result.history)
    assert result.nonfinite_skipped == 0  # left-padded rollouts under autocast: no NaN gradient (cuDNN off)
    assert next(trainer.model.parameters()).is_cuda
