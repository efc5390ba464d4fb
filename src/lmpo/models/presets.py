"""Built-in model presets: small Llama-style configurations built in code, so everything runs offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


@dataclass(frozen=True)
class ModelPreset:
    """Sizes of a small Llama-style causal LM (vocabulary size comes from the tokenizer).

    Parameter count ≈ V·d (tied embeddings) + layers·(4·d² + 3·d·ff) for d = ``hidden_size``.
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    description: str = ""

    def config(self, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                "pick sizes whose ratio is the head dimension."
            )
        return LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            attention_bias=False,
            mlp_bias=False,
        )


MODEL_PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        intermediate_size=256,
        description="669k parameters (d=128, 4 layers, 4 heads, ff=256, tied embeddings)",
    ),
    "tiny-wide": ModelPreset(
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        intermediate_size=512,
        description="2.6M parameters (d=256, 4 layers, 8 heads, ff=512, tied embeddings)",
    ),
}


def register_model_preset(name: str, preset: ModelPreset) -> ModelPreset:
    """Add a preset to ``MODEL_PRESETS`` (refuses to overwrite an existing name)."""
    if name in MODEL_PRESETS:
        raise ValueError(f"model preset {name!r} already exists; choose another name")
    MODEL_PRESETS[name] = preset
    return preset


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    preset: str = "tiny",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    **overrides: Any,
) -> LlamaForCausalLM:
    """A freshly initialised ``LlamaForCausalLM`` of a built-in preset; no file is read or downloaded.

    ``overrides`` replace preset fields (``hidden_size=64``...). The same ``seed`` gives the same weights.
    """
    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; available: {sorted(MODEL_PRESETS)}")
    spec = MODEL_PRESETS[preset]
    if overrides:
        unknown = set(overrides) - set(ModelPreset.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown model preset field(s) {sorted(unknown)}; fields: {sorted(ModelPreset.__dataclass_fields__)}"
            )
        spec = ModelPreset(**{**spec.__dict__, **overrides})
    config = spec.config(tokenizer)
    config._attn_implementation = attn_implementation
    cpu_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(cpu_state)  # building a model must not shift the caller's RNG stream
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.to(dtype)
