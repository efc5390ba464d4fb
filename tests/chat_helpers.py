"""Offline Hugging Face pieces for the chat-template and reward-model tests: a real ``PreTrainedTokenizerFast``
with or without a template (``lmpo.models.build_chat_tokenizer``) and a small randomly initialised sequence
classifier."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from lmpo.models import CHATML_TEMPLATE, build_chat_tokenizer

CHATML = CHATML_TEMPLATE
#: Llama-style: the template writes BOS itself
BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def fast_tokenizer(chat_template: str | None = CHATML):
    """``lmpo.models.build_chat_tokenizer``: one token per character, pad ``<|endoftext|>``, EOS ``<|im_end|>``."""
    return build_chat_tokenizer(chat_template)


def save_classifier(path, tokenizer, seed: int = 0) -> LlamaForSequenceClassification:
    """A randomly initialised 1-label Llama classifier (a reward model) and its tokenizer, saved to ``path``."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512, num_labels=1,
                      pad_token_id=tokenizer.pad_token_id)
    model = LlamaForSequenceClassification(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model
