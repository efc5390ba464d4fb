"""The random-initialised stand-in of a published architecture (configs/lab_gpu.yaml without its weights)."""

from __future__ import annotations

import torch

from lmpo.lab import random_init


def test_qwen_architecture_matches_its_published_sizes():
    arch = random_init.ARCHITECTURES["qwen2.5-0.5b"]
    assert (arch["num_hidden_layers"], arch["hidden_size"], arch["intermediate_size"]) == (24, 896, 4864)
    assert (arch["num_attention_heads"], arch["num_key_value_heads"]) == (14, 2)
    assert arch["tie_word_embeddings"] and arch["rope_theta"] == 1e6


def test_random_model_is_seeded_and_loads_as_a_model_name(tmp_path, monkeypatch):
    small = {**random_init.ARCHITECTURES["qwen2.5-0.5b"], "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    monkeypatch.setitem(random_init.ARCHITECTURES, "small", small)
    a, tok = random_init.build_random_model("small", seed=3)
    b, _ = random_init.build_random_model("small", seed=3)
    c, _ = random_init.build_random_model("small", seed=4)
    assert type(a).__name__ == "Qwen2ForCausalLM" and a.config.vocab_size == len(tok)
    assert a.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's attention has biases, Llama's not
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    path = random_init.write_random_model("small", tmp_path / "m", seed=3)
    from lmpo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(path))
    ids = torch.tensor([tokenizer("12+34=")["input_ids"]])
    torch.testing.assert_close(model(input_ids=ids).logits, a(input_ids=ids).logits)
