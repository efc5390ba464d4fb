"""HFRollout on the tiny model: shapes, left padding, EOS masking, groups, seeding, greedy and sampled output
against a cache-free slow loop, sampler log-probs against teacher forcing, prefill once, finished rows dropped."""

from dataclasses import replace

import pytest
import torch

from lmpo.generation import HFRollout, Rollout, RolloutEngine, sequence_logprobs
from lmpo.generation.hf import _filter_top_k_top_p, sample_categorical
from lmpo.models import load_model_and_tokenizer
from lmpo.models.presets import MODEL_PRESETS

PROMPTS = ["12+34=", "5+6=", "rev abc="]


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny", seed=0)


def _eos_heavy(preset: str):
    """A preset's model with the EOS logit raised, so that rows stop at different steps."""
    model, tok = load_model_and_tokenizer(preset, seed=0)
    bias_hook = model.lm_head.register_forward_hook(
        lambda mod, inp, out: (
            out + torch.nn.functional.one_hot(torch.tensor(tok.eos_token_id), out.shape[-1]) * 3.5
        )
    )
    yield model, tok
    bias_hook.remove()


@pytest.fixture(scope="module")
def eos_heavy(tiny):
    """The tiny model with the EOS logit raised, so that rows stop at different steps."""
    yield from _eos_heavy("tiny")


@pytest.fixture
def eos_heavy_two_layers(monkeypatch):
    """``eos_heavy`` with 2 of the tiny preset's 4 layers: torch.compile traces and lowers every layer, so the
    compiled-decode test compiles half as much; 2 layers still check the static cache's per-layer buffers."""
    monkeypatch.setitem(MODEL_PRESETS, "tiny-2-layers", replace(MODEL_PRESETS["tiny"], num_layers=2))
    yield from _eos_heavy("tiny-2-layers")


def test_shapes_padding_groups(tiny):
    model, tok = tiny
    engine = HFRollout(model, tok, max_new_tokens=6, temperature=1.0)
    assert isinstance(engine, RolloutEngine)
    ro = engine.generate(PROMPTS, completions_per_prompt=4, seed=0)
    assert isinstance(ro, Rollout) and len(ro) == 12
    prompt_len = max(len(p) for p in PROMPTS) + 1  # + BOS
    assert ro.prompt_ids.shape == (12, prompt_len) and ro.completion_ids.shape[0] == 12
    assert ro.completion_ids.shape[1] <= 6
    assert ro.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert ro.prompts == [p for p in PROMPTS for _ in range(4)]
    # left padding: pads first, then BOS, then the prompt characters
    row = 4  # "5+6=" is BOS + 4 chars = 5 tokens, padded on the left to the 9 of "rev abc="
    assert ro.prompt_mask[row].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert ro.prompt_ids[row, :4].tolist() == [tok.pad_token_id] * 4
    assert ro.prompt_ids[row, 4] == tok.bos_token_id
    assert tok.decode(ro.prompt_ids[row], skip_special_tokens=True) == "5+6="
    assert ro.input_ids.shape == ro.attention_mask.shape == (12, prompt_len + ro.completion_ids.shape[1])


def test_eos_masking(eos_heavy):
    model, tok = eos_heavy
    engine = HFRollout(model, tok, max_new_tokens=12, temperature=1.0)
    ro = engine.generate(PROMPTS, completions_per_prompt=8, seed=3)
    eos = tok.eos_token_id
    lengths = []
    for ids, mask, text, truncated in zip(
        ro.completion_ids, ro.completion_mask, ro.completions, ro.truncated
    ):
        ids, mask = ids.tolist(), mask.tolist()
        if eos in ids:
            first = ids.index(eos)
            assert mask == [1] * (first + 1) + [0] * (len(ids) - first - 1)  # EOS itself is kept
            assert ids[first + 1 :] == [tok.pad_token_id] * (len(ids) - first - 1)
            assert not truncated
            lengths.append(first + 1)
        else:
            assert all(mask) and truncated
            lengths.append(len(ids))
        assert text == tok.decode(ids[: sum(mask)], skip_special_tokens=True)
    assert ro.completion_lengths.tolist() == lengths
    assert len(set(lengths)) > 1  # rows really stopped at different steps
    assert ro.completion_ids.shape[1] == max(lengths)  # generation stops when every row has ended


def test_seed_reproducibility(tiny):
    model, tok = tiny
    engine = HFRollout(model, tok, max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=20)
    a = engine.generate(PROMPTS, 3, seed=11)
    b = engine.generate(PROMPTS, 3, seed=11)
    c = engine.generate(PROMPTS, 3, seed=12)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # generation must not consume the global RNG when a seed is given (bit-for-bit resume depends on it)
    state = torch.random.get_rng_state()
    engine.generate(PROMPTS, 2, seed=5)
    assert torch.equal(state, torch.random.get_rng_state())


def _slow_greedy(model, tok, prompt, max_new_tokens):
    """Reference: no cache, no padding, the full sequence re-run at every step."""
    ids = tok(prompt, return_tensors="pt")["input_ids"][0]
    out = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.cat([ids, torch.tensor(out, dtype=torch.long)])[None]).logits[
                0, -1
            ]
        token = int(logits.argmax())
        out.append(token)
        if token == tok.eos_token_id:
            break
    return out


@pytest.mark.parametrize("impl", ["loop", "generate"])
def test_greedy_matches_slow_reference(tiny, impl):
    model, tok = tiny
    engine = HFRollout(model, tok, max_new_tokens=7, temperature=0.0, impl=impl)
    ro = engine.generate(PROMPTS, completions_per_prompt=2)
    for i, prompt in enumerate(PROMPTS):
        ref = _slow_greedy(model, tok, prompt, 7)
        for row in (2 * i, 2 * i + 1):
            n = int(ro.completion_mask[row].sum())
            assert ro.completion_ids[row, :n].tolist() == ref


def test_sampling_logprobs_consistent_with_teacher_forcing(eos_heavy):
    # what the loop sampled from (cached, left-padded) must be what sequence_logprobs scores (full pass)
    model, tok = eos_heavy
    engine = HFRollout(model, tok, max_new_tokens=6, temperature=0.0)
    ro = engine.generate(PROMPTS, 1)
    with torch.no_grad():
        out = sequence_logprobs(model, ro.input_ids, ro.attention_mask, ro.completion_ids.shape[1])
    # greedy tokens are the argmax, so their log-prob is the max log-prob: check via entropy-free identity
    with torch.no_grad():
        logits = model(
            input_ids=ro.input_ids,
            attention_mask=ro.attention_mask,
            position_ids=(ro.attention_mask.cumsum(-1) - 1).clamp(min=0),
        ).logits
    T = ro.completion_ids.shape[1]
    best = torch.log_softmax(logits[:, -T - 1 : -1].float(), -1).max(-1).values
    mask = ro.completion_mask.bool()
    torch.testing.assert_close(out.logprobs[mask], best[mask], atol=1e-5, rtol=0)


def test_ignore_eos_gives_fixed_length(eos_heavy):
    model, tok = eos_heavy
    ro = HFRollout(model, tok, max_new_tokens=5, ignore_eos=True).generate(PROMPTS, 2, seed=0)
    assert ro.completion_ids.shape == (6, 5) and bool(ro.completion_mask.all())


def test_top_k_top_p_filter_hand_case():
    # probs [0.5, 0.3, 0.15, 0.05]: top_p=0.7 keeps {0.5, 0.3} (0.5 < 0.7, 0.8 crosses); top_k=1 keeps {0.5}
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept_p = torch.isfinite(_filter_top_k_top_p(logits, 0, 0.7))
    kept_k = torch.isfinite(_filter_top_k_top_p(logits, 1, 1.0))
    assert kept_p.tolist() == [[True, True, False, False]]
    assert kept_k.tolist() == [[True, False, False, False]]


def test_bad_arguments(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="max_new_tokens"):
        HFRollout(model, tok, max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        HFRollout(model, tok, top_p=0.0)
    with pytest.raises(ValueError, match="completions_per_prompt"):
        HFRollout(model, tok).generate(PROMPTS, 0)


def _slow_sample(model, tok, prompts, G, max_new_tokens, seed, temperature, top_p=1.0, top_k=0):
    """Reference for the sampled loop: every prompt repeated G times, no cache, the whole left-padded batch
    re-run at every step, ``torch.multinomial`` on all rows with one generator (finished rows draw too)."""
    enc = tok(list(prompts), padding=True, return_tensors="pt", padding_side="left")
    ids = enc["input_ids"].repeat_interleave(G, 0)
    mask = enc["attention_mask"].repeat_interleave(G, 0)
    gen = torch.Generator().manual_seed(seed)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    out = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask,
                           position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1].float()
        probs = _filter_top_k_top_p(logits / temperature, top_k, top_p).softmax(-1)
        token = torch.multinomial(probs, 1, generator=gen).squeeze(-1).masked_fill(finished, tok.pad_token_id)
        out.append(token)
        mask = torch.cat([mask, (~finished).long()[:, None]], 1)
        ids = torch.cat([ids, token[:, None]], 1)
        finished = finished | (token == tok.eos_token_id)
        if bool(finished.all()):
            break
    return torch.stack(out, 1)


@pytest.mark.parametrize("top_p, top_k", [(1.0, 0), (0.9, 20)])
def test_sampled_tokens_match_the_cache_free_reference(eos_heavy, top_p, top_k):
    # rows stop at different steps, so the decode batch is compacted along the way; the draws must not move
    model, tok = eos_heavy
    engine = HFRollout(model, tok, max_new_tokens=10, temperature=0.9, top_p=top_p, top_k=top_k)
    ro = engine.generate(PROMPTS, 4, seed=7)
    ref = _slow_sample(model, tok, PROMPTS, 4, 10, seed=7, temperature=0.9, top_p=top_p, top_k=top_k)
    assert len(set(ro.completion_lengths.tolist())) > 1
    assert torch.equal(ro.completion_ids, ref)


def test_each_prompt_prefilled_once_and_finished_rows_dropped(eos_heavy):
    model, tok = eos_heavy
    batches = []
    handle = model.register_forward_pre_hook(lambda mod, args, kw: batches.append(kw["input_ids"].shape),
                                             with_kwargs=True)
    try:
        ro = HFRollout(model, tok, max_new_tokens=12, temperature=1.0).generate(PROMPTS, 8, seed=3)
    finally:
        handle.remove()
    P = ro.prompt_ids.shape[1]
    assert batches[0] == (len(PROMPTS), P)  # the 3 prompts once, not their 24 rows
    decode_rows = [b[0] for b in batches[1:]]
    assert all(b[1] == 1 for b in batches[1:])
    assert decode_rows == sorted(decode_rows, reverse=True) and decode_rows[-1] < 24  # rows left the batch
    # never fewer rows than are still running at that step
    running = [(ro.completion_lengths > t + 1).sum().item() for t in range(len(decode_rows))]
    assert all(d >= r for d, r in zip(decode_rows, running))


def test_sample_categorical_is_multinomial_draw_for_draw():
    for seed, (rows, vocab) in enumerate([(1, 5), (7, 100), (64, 300)]):
        probs = (3 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))).softmax(-1)
        expected = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed + 10)).squeeze(-1)
        got = sample_categorical(probs.clone(), torch.Generator().manual_seed(seed + 10))
        assert torch.equal(got, expected)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_teacher_forced_logprobs(eos_heavy, temperature):
    model, tok = eos_heavy
    ro = HFRollout(model, tok, max_new_tokens=8, temperature=temperature, record_logprobs=True).generate(
        PROMPTS, 3, seed=1)
    with torch.no_grad():
        tf = sequence_logprobs(model, ro.input_ids, ro.attention_mask, ro.completion_ids.shape[1],
                               temperature=temperature).logprobs
    mask = ro.completion_mask.bool()
    torch.testing.assert_close(ro.logprobs[mask], tf[mask], atol=1e-5, rtol=0)
    assert bool((ro.logprobs[~mask] == 0).all()) and bool((ro.logprobs[mask] < 0).all())
    assert HFRollout(model, tok, max_new_tokens=2).generate(PROMPTS, 1, seed=1).logprobs is None


def test_greedy_loop_matches_hf_generate_with_rows_finishing_early(tiny):
    model, tok = tiny
    prompts = PROMPTS + ["7*8=", "hello", "x"]  # greedy completions of 1, 5 and 12 tokens
    loop = HFRollout(model, tok, max_new_tokens=12, temperature=0.0).generate(prompts, 2)
    ref = HFRollout(model, tok, max_new_tokens=12, temperature=0.0, impl="generate").generate(prompts, 2)
    assert len(set(loop.completion_lengths.tolist())) > 1
    assert torch.equal(loop.completion_mask, ref.completion_mask[:, : loop.completion_mask.shape[1]])
    assert torch.equal(loop.completion_ids, ref.completion_ids[:, : loop.completion_ids.shape[1]])


@pytest.mark.slow  # ~60 s on a cold torch.compile cache (CPU)
def test_compiled_decode_step_samples_what_the_eager_loop_samples(eos_heavy_two_layers):
    # rows finish at different steps (the compiled loop keeps them in the batch, masked); one engine, one shape
    model, tok = eos_heavy_two_layers
    compiled = HFRollout(model, tok, max_new_tokens=8, temperature=1.0, record_logprobs=True, compile_decode=True)
    eager = HFRollout(model, tok, max_new_tokens=8, temperature=1.0, record_logprobs=True)
    for kwargs in ({"greedy": True}, {"seed": 1}, {"seed": 2}):
        a, b = compiled.generate(PROMPTS, 3, **kwargs), eager.generate(PROMPTS, 3, **kwargs)
        assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert len(set(b.completion_lengths.tolist())) > 1
    assert compiled._compiled is not None and compiled._compiled.cache is not None
    with pytest.raises(ValueError, match="compile_decode"):
        HFRollout(model, tok, impl="generate", compile_decode=True)


def test_graph_decode_step_samples_what_the_eager_loop_samples(eos_heavy, monkeypatch):
    # the CUDA-graph path's fixed-shape step (all rows kept, a bucket of positions under the mask, inputs in
    # static buffers), run eagerly on CPU: the same tokens and log-probs as the eager loop, across buckets
    import lmpo.generation.hf as hf

    monkeypatch.setattr(hf, "_GRAPH_BUCKET", 8)  # prompts of 9 tokens + 12 new ones cross two bucket edges
    model, tok = eos_heavy
    static = HFRollout(model, tok, max_new_tokens=12, temperature=1.0, record_logprobs=True, cuda_graphs=True)
    eager = HFRollout(model, tok, max_new_tokens=12, temperature=1.0, record_logprobs=True)
    for kwargs in ({"greedy": True}, {"seed": 1}, {"seed": 2}):
        a, b = static.generate(PROMPTS, 3, **kwargs), eager.generate(PROMPTS, 3, **kwargs)
        assert static.decode_mode == "static" and eager.decode_mode == "eager"
        assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert len(set(b.completion_lengths.tolist())) > 1
    # a second call of the same shape reuses the buffers; fixed-length output through ignore_eos
    buffers = static._graphs.cache.layers[0].keys
    fixed = HFRollout(model, tok, max_new_tokens=12, temperature=1.0, ignore_eos=True, cuda_graphs=True)
    ref = HFRollout(model, tok, max_new_tokens=12, temperature=1.0, ignore_eos=True)
    a, b = fixed.generate(PROMPTS, 2, seed=4), ref.generate(PROMPTS, 2, seed=4)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.completion_ids.shape[1] == 12
    static.generate(PROMPTS, 3, seed=5)
    assert static._graphs.cache.layers[0].keys is buffers
    with pytest.raises(ValueError, match="cuda_graphs"):
        HFRollout(model, tok, cuda_graphs=True, compile_decode=True)
