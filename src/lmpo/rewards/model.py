"""A sequence-classification model as a reward function (what TRL, verl and OpenRLHF call a reward model).

The reward of a completion is the first logit of an ``AutoModelForSequenceClassification`` on the prompt
followed by the completion, written the way TRL's ``GRPOTrainer`` writes it:

- standard data: the text ``prompt + completion``;
- conversational data: ``prompt_messages + [{"role": "assistant", "content": completion}]`` rendered by the
  *reward model's* own chat template (not the policy's).

Texts are tokenized by the reward model's tokenizer without extra special tokens, padded on the right and
scored ``seqs_per_batch`` at a time under ``torch.inference_mode``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from lmpo.errors import InputError
from lmpo.models.chat import has_chat_template
from lmpo.rewards.builtin import completion_text


def _as_messages(completion: Any) -> list[dict[str, Any]]:
    if isinstance(completion, list):
        return list(completion)
    return [{"role": "assistant", "content": str(completion)}]


class RewardModel:
    """Callable reward ``fn(prompts, completions, **columns) -> list[float]`` backed by a classifier.

    Args:
        path: local directory or Hugging Face name of an ``AutoModelForSequenceClassification`` (its first
            logit is the reward) and its tokenizer.
        seqs_per_batch: sequences per forward pass.
        chat_template: Jinja template (text or file path) for conversational data, used instead of the
            reward tokenizer's own (needed when it has none).
        dtype, device: where the reward model runs.
        model, tokenizer: use these instead of loading ``path`` (tests, models already in memory).

    >>> rm = RewardModel("my-reward-model")
    >>> rm(prompts=["2+3="], completions=["5"])          # [0.83]
    """

    def __init__(self, path: str, *, seqs_per_batch: int = 32, chat_template: str | None = None,
                 dtype: str = "float32", device: str | torch.device = "cpu", model=None, tokenizer=None) -> None:
        from lmpo.models.chat import read_chat_template
        from lmpo.models.loading import (
            hf_progress_bars_only_on_a_terminal,
            hub_load_options,
            looks_like_hub_id,
            refuse_pickle_weights,
            resolve_dtype,
        )

        if seqs_per_batch < 1:
            raise InputError(f"reward model {path!r}: seqs_per_batch={seqs_per_batch} must be >= 1.")
        self.path = path
        self.seqs_per_batch = seqs_per_batch
        self.chat_template = read_chat_template(chat_template) if chat_template else None
        if model is None or tokenizer is None:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            if not os.path.isdir(path) and not looks_like_hub_id(path):
                raise InputError(f"reward model {path!r} is neither a local directory nor a Hugging Face "
                                 "'org/name'; give the directory of an AutoModelForSequenceClassification "
                                 "(config.json, weights, tokenizer).")
            try:
                refuse_pickle_weights(path)
                options = hub_load_options(path)
            except InputError as e:
                raise InputError(f"reward model: {e}") from None
            hf_progress_bars_only_on_a_terminal()
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, **options)
            model = model or AutoModelForSequenceClassification.from_pretrained(
                path, dtype=resolve_dtype(dtype) or "auto", **options)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token is None:
                raise InputError(f"the tokenizer of reward model {path!r} has neither a pad nor an EOS token; "
                                 "save it with a pad_token.")
            tokenizer.pad_token = tokenizer.eos_token
        # the classifier reads the logits at the last non-pad token, which it finds through this id
        model.config.pad_token_id = tokenizer.pad_token_id
        self.tokenizer = tokenizer
        self.model = model.to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @property
    def has_chat_template(self) -> bool:
        return has_chat_template(self.tokenizer, self.chat_template)

    def check_conversational(self, source: str = "the task") -> None:
        """Raise InputError now, not at the first step, when conversational data meet a template-less model."""
        if not self.has_chat_template:
            raise InputError(f"{source} is conversational, so reward model {self.path!r} scores conversations, but "
                             "its tokenizer has no chat template. Give one with the reward model's `chat_template` "
                             "(the template text or a file path) or use a reward model trained with one.")

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """What the classifier reads for each (prompt, completion) pair (see the module docstring)."""
        out = []
        for prompt, completion in zip(prompts, completions):
            if isinstance(prompt, list):
                self.check_conversational()
                out.append(self.tokenizer.apply_chat_template(list(prompt) + _as_messages(completion),
                                                              tokenize=False, chat_template=self.chat_template))
            else:
                out.append(str(prompt) + completion_text(completion))
        return out

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.seqs_per_batch):
                enc = self.tokenizer(texts[start:start + self.seqs_per_batch], return_tensors="pt", padding=True,
                                     padding_side="right", add_special_tokens=False).to(device)
                logits = self.model(**enc).logits  # (b, num_labels)
                scores.extend(logits[:, 0].float().cpu().tolist())
        return scores

    def __repr__(self) -> str:
        return f"RewardModel({self.path!r}, seqs_per_batch={self.seqs_per_batch})"
