"""Models: the built-in offline ``tiny`` preset (character tokenizer + small Llama config) and loading of
any Hugging Face causal LM.

>>> model, tokenizer = load_model_and_tokenizer("tiny")          # offline, built in code
>>> model, tokenizer = load_model_and_tokenizer("Qwen/Qwen2.5-0.5B", dtype="bf16", device="cuda")
>>> chat_tokenizer = build_chat_tokenizer()                       # offline, with a ChatML template
"""

from lmpo.models.chat import CHATML_TEMPLATE, build_chat_tokenizer, has_chat_template
from lmpo.models.loading import load_model_and_tokenizer, load_tokenizer, resolve_dtype
from lmpo.models.presets import MODEL_PRESETS, ModelPreset, build_tiny_model, register_model_preset
from lmpo.models.tokenizer import CharTokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "MODEL_PRESETS",
    "CharTokenizer",
    "ModelPreset",
    "build_chat_tokenizer",
    "has_chat_template",
    "build_tiny_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "register_model_preset",
    "resolve_dtype",
]
