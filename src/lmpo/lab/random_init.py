"""A randomly initialised model of a published architecture, for a lab run where the weights are not at hand.

``python -m lmpo.lab.random_init qwen2.5-0.5b DIR [--seed 0]`` writes a Hugging Face model directory (config,
safetensors, the character tokenizer of ``lmpo.models``) that ``train.model.name`` can point at, offline: the
architecture's sizes are written here (from the model's published ``config.json``), nothing is downloaded. The
vocabulary is the character tokenizer's (the architecture's own tokenizer is not at hand either), so the model
differs from the published one in its embedding rows only. Such a model knows nothing: the lab's supervised
warm-up teaches it the task, and its numbers say nothing about the pretrained model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ARCHITECTURES: dict[str, dict] = {
    # Qwen/Qwen2.5-0.5B-Instruct config.json (Qwen2ForCausalLM): 24 layers, d 896, 14 query / 2 key-value heads
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                     "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                     "hidden_act": "silu"},
}
"""Architecture name → Qwen2 config fields (vocabulary and special tokens come from the tokenizer)."""


def build_random_model(arch: str, *, seed: int = 0):
    """``(model, tokenizer)``: the architecture with random weights (``torch.manual_seed(seed)``) and the
    character tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lmpo.models import CharTokenizer

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; available: {', '.join(ARCHITECTURES)}")
    tok = CharTokenizer()
    fields = dict(ARCHITECTURES[arch])
    rope_theta = fields.pop("rope_theta")
    config = Qwen2Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, **fields)
    config.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def write_random_model(arch: str, path: str | Path, *, seed: int = 0) -> Path:
    """Save :func:`build_random_model`'s model and tokenizer to ``path`` (a ``model.name`` for the trainer)."""
    model, tok = build_random_model(arch, seed=seed)
    path = Path(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lmpo.lab.random_init", description=__doc__.split("\n\n")[0])
    p.add_argument("arch", choices=sorted(ARCHITECTURES))
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = write_random_model(args.arch, args.dir, seed=args.seed)
    print(f"{args.arch} with random weights (seed {args.seed}) written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
