"""Offline Hugging Face pieces for the chat-template and reward-model tests: a real ``PreTrainedTokenizerFast``
(one token per character, ChatML specials) and a small randomly initialised sequence classifier."""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

#: Qwen2-style ChatML, as in Qwen's tokenizer_config.json (without the tool-calling branches)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Llama-style: the template writes BOS itself
BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def fast_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """A ``tokenizers``-backed tokenizer over printable ASCII, one token per character; pad ``<|endoftext|>``,
    EOS ``<|im_end|>`` (the end of an assistant turn, as in Qwen2 chat models), no BOS."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(string.digits + string.ascii_letters + string.punctuation
                                                        + " \n"))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"], padding_side="left")
    tok.chat_template = chat_template
    return tok


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
