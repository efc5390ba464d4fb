"""``load_model_and_tokenizer``: the built-in tiny preset or any Hugging Face causal LM path."""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lmpo.models.presets import MODEL_PRESETS, build_tiny_model
from lmpo.models.tokenizer import CharTokenizer

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``torch.bfloat16`` -> ``torch.bfloat16``; ``None``/``"auto"`` -> ``None``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` (one slash, not a relative or absolute path): a name ``from_pretrained`` may download.

    A missing local path such as ``runs/x/model`` or ``./model`` is not one, so it is reported as missing
    instead of being looked up on the Hub.
    """
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def hf_progress_bars_only_on_a_terminal() -> None:
    """Switch off transformers' weight-loading progress bars when stderr is not a terminal: piped into a log
    they are carriage-return redraws, not lines (lmpo's own console follows the same rule)."""
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _saved_tokenizer_class(path: str) -> str | None:
    config_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        return json.load(f).get("tokenizer_class")


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Tokenizer for a preset name or a path; pad token falls back to EOS, padding on the left."""
    if name_or_path in MODEL_PRESETS:
        tokenizer = CharTokenizer()
    elif os.path.isdir(name_or_path) and _saved_tokenizer_class(name_or_path) == "CharTokenizer":
        tokenizer = CharTokenizer.from_pretrained(name_or_path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer of {name_or_path!r} has neither a pad nor an EOS token; set tokenizer.pad_token"
            )
        # Pad positions are masked out everywhere, so reusing EOS as pad changes nothing numerically.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model_and_tokenizer(
    name_or_path: str,
    dtype: str | torch.dtype | None = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return ``(model, tokenizer)`` ready for generation and training.

    - a name in ``MODEL_PRESETS`` (``"tiny"``): a ``CharTokenizer`` and a fresh Llama-style model
      initialised with ``seed``; nothing is read from disk or the network;
    - anything else: ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (a saved
      tiny model directory loads back exactly). ``dtype="auto"`` keeps the checkpoint's dtype.

    The tokenizer pads on the left and its pad token falls back to EOS; the model's
    ``generation_config`` gets the tokenizer's pad/EOS ids.
    """
    torch_dtype = resolve_dtype(dtype)
    if name_or_path in MODEL_PRESETS:
        tokenizer = load_tokenizer(name_or_path)
        model = build_tiny_model(
            tokenizer,
            preset=name_or_path,
            seed=seed,
            dtype=torch_dtype or torch.float32,
            attn_implementation=attn_implementation or "sdpa",
        )
    else:
        if not os.path.exists(name_or_path) and "/" not in name_or_path:
            raise ValueError(
                f"model {name_or_path!r} is neither a built-in preset ({sorted(MODEL_PRESETS)}), "
                "a local directory, nor a Hugging Face 'org/name' id"
            )
        tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
        hf_progress_bars_only_on_a_terminal()
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=torch_dtype or "auto", trust_remote_code=trust_remote_code, **extra
        )
    model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        if model.generation_config.eos_token_id is None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.to(device), tokenizer
