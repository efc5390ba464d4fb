"""Rollouts: G sampled completions per prompt, batched, with a KV cache.

``RolloutEngine`` is the interface (a vLLM engine on GPU can implement it later); ``HFRollout`` implements
it for any Hugging Face causal LM with a hand-written sampling loop over the model's KV cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lmpo.trainer.logprobs import position_ids_from_mask


@dataclass
class Rollout:
    """A batch of B = N·G sequences: N prompts, each repeated for its G completions (rows ``i·G … i·G+G−1``).

    prompt_ids:      (B, P) long, left-padded with the pad token.
    prompt_mask:     (B, P) long, 1 on real prompt tokens.
    completion_ids:  (B, T) long, right-padded with the pad token after EOS.
    completion_mask: (B, T) long, 1 up to and including the first EOS, 0 after it.
    group_ids:       (B,) long, the prompt's index in this batch (0 … N−1): the advantage groups.
    prompts:         B prompt strings (repeated G times each).
    completions:     B completion strings, decoded without special tokens.
    truncated:       (B,) bool, True where no EOS was produced within ``max_new_tokens``.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group_ids: torch.Tensor
    prompts: list[str]
    completions: list[str]
    truncated: torch.Tensor

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) prompt followed by completion, for ``sequence_logprobs``."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + T) mask of real tokens."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """(B,) long, tokens per completion including EOS."""
        return self.completion_mask.sum(-1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: torch.Tensor | Sequence[int]) -> Rollout:
        """The sub-batch at ``rows`` (long indices), e.g. for minibatches or zero-variance filtering."""
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        cpu_rows = rows_t.tolist()
        dev = self.prompt_ids.device
        rows_t = rows_t.to(dev)
        return Rollout(
            prompt_ids=self.prompt_ids[rows_t],
            prompt_mask=self.prompt_mask[rows_t],
            completion_ids=self.completion_ids[rows_t],
            completion_mask=self.completion_mask[rows_t],
            group_ids=self.group_ids[rows_t],
            prompts=[self.prompts[i] for i in cpu_rows],
            completions=[self.completions[i] for i in cpu_rows],
            truncated=self.truncated[rows_t],
        )


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a generation engine.

    ``generate`` returns N·G completions for N prompts, G each, as a ``Rollout``; ``sync_weights`` is
    called after every optimiser step so that an engine holding its own copy of the weights (vLLM) can
    refresh it (an engine that shares the training model's parameters does nothing).
    """

    def generate(
        self,
        prompts: Sequence[str],
        completions_per_prompt: int = 1,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> Rollout: ...

    def sync_weights(self, model: nn.Module) -> None: ...


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) logits with tokens outside the top-k and outside the nucleus of mass ``top_p`` set to −inf.

    Nucleus: keep the smallest set of most probable tokens whose probability sum reaches ``top_p``
    (the token that crosses the threshold is kept), as in Hugging Face's ``TopPLogitsWarper``.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Remove a token when the mass before it already reaches top_p.
        remove_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def eos_token_ids(tokenizer, model) -> set[int]:
    """Every id that ends a completion: the tokenizer's EOS and those of the model's generation config."""
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        eos.add(gen_eos)
    elif gen_eos is not None:
        eos.update(gen_eos)
    return eos


class HFRollout:
    """Batched sampling from a Hugging Face causal LM with its KV cache.

    Args:
        model: a causal LM (shared with the trainer; generation runs under ``no_grad`` in eval mode).
        tokenizer: its tokenizer; prompts are encoded with its special tokens (a BOS for the tiny preset).
        max_new_tokens: completion budget per sequence.
        temperature: sampling temperature τ; 0 means greedy (argmax).
        top_p, top_k: nucleus mass (1.0 = off) and top-k (0 = off).
        impl: ``"loop"`` (default, the hand-written loop below) or ``"generate"`` (``model.generate``).
        ignore_eos: generate exactly ``max_new_tokens`` tokens per sequence, EOS included as an ordinary
            token, with every completion position masked in (fixed-length benchmarks).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        impl: str = "loop",
        ignore_eos: bool = False,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p} must be in (0, 1]")
        if top_k < 0:
            raise ValueError(f"top_k={top_k} must be >= 0 (0 = off)")
        if impl not in ("loop", "generate"):
            raise ValueError(f"impl={impl!r} must be 'loop' or 'generate'")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token; set tokenizer.pad_token = tokenizer.eos_token")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.impl = impl
        self.ignore_eos = ignore_eos
        eos = eos_token_ids(tokenizer, model)
        if not eos:
            raise ValueError("neither the tokenizer nor the model's generation_config defines an EOS token")
        self.eos_token_ids = sorted(eos)

    def sync_weights(self, model: nn.Module) -> None:
        """Nothing to do: this engine samples from the training model's own parameters."""
        self.model = model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _encode(self, prompts: Sequence[str], completions_per_prompt: int):
        enc = self.tokenizer(list(prompts), padding=True, return_tensors="pt", padding_side="left")
        prompt_ids = enc["input_ids"].repeat_interleave(completions_per_prompt, dim=0)  # (B, P)
        prompt_mask = enc["attention_mask"].repeat_interleave(completions_per_prompt, dim=0)  # (B, P)
        return prompt_ids.to(self.device), prompt_mask.to(self.device)

    def _next_token(
        self, logits: torch.Tensor, greedy: bool, generator: torch.Generator | None
    ) -> torch.Tensor:
        """(B, V) last-position logits -> (B,) sampled token ids."""
        if greedy:
            return logits.argmax(-1)
        logits = logits.float() / self.temperature
        logits = _filter_top_k_top_p(logits, self.top_k, self.top_p)
        probs = logits.softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    @contextlib.contextmanager
    def _eval_mode(self):
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():  # not inference_mode: the ids are reused as inputs of a graph later
                yield
        finally:
            self.model.train(was_training)

    def generate(
        self,
        prompts: Sequence[str],
        completions_per_prompt: int = 1,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> Rollout:
        """Sample ``completions_per_prompt`` completions for every prompt.

        Randomness comes from ``generator`` if given, else from a new generator seeded with ``seed``, else
        from the global RNG. ``greedy=True`` (or ``temperature == 0``) takes the argmax at every step.
        """
        if completions_per_prompt < 1:
            raise ValueError(f"completions_per_prompt={completions_per_prompt} must be >= 1")
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        greedy = greedy or self.temperature == 0
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        prompt_ids, prompt_mask = self._encode(prompts, completions_per_prompt)
        with self._eval_mode():
            if self.impl == "loop":
                completion_ids, finished = self._sample_loop(prompt_ids, prompt_mask, greedy, generator)
            else:
                completion_ids, finished = self._sample_hf_generate(
                    prompt_ids, prompt_mask, greedy, generator
                )
        completion_mask = self._completion_mask(completion_ids)
        pad = self.tokenizer.pad_token_id
        completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)
        num_prompts = len(prompts)
        group_ids = torch.arange(num_prompts, device=self.device).repeat_interleave(completions_per_prompt)
        texts = self.tokenizer.batch_decode(
            [row[: int(n)] for row, n in zip(completion_ids.tolist(), completion_mask.sum(-1).tolist())],
            skip_special_tokens=True,
        )
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            group_ids=group_ids,
            prompts=[p for p in prompts for _ in range(completions_per_prompt)],
            completions=texts,
            truncated=~finished,
        )

    def _completion_mask(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) long: 1 up to and including the first EOS, 0 after it (all 1 with ``ignore_eos``)."""
        if self.ignore_eos:
            return torch.ones_like(completion_ids)
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=completion_ids.device))
        # eos seen strictly before position t  <=>  cumsum up to t minus is_eos[t] > 0
        seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        return (~seen_before).long()

    def _sample_loop(self, prompt_ids, prompt_mask, greedy, generator):
        """Prefill the prompts once, then one token per step from the KV cache; stop when all rows ended."""
        batch = prompt_ids.shape[0]
        eos = torch.tensor(self.eos_token_ids, device=prompt_ids.device)
        pad = self.tokenizer.pad_token_id
        attention_mask = prompt_mask
        position_ids = position_ids_from_mask(prompt_mask)
        out = self.model(
            input_ids=prompt_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        next_position = position_ids[:, -1:] + 1  # (B, 1)
        finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
        tokens = []
        for step in range(self.max_new_tokens):
            next_ids = self._next_token(out.logits[:, -1, :], greedy, generator)  # (B,)
            next_ids = next_ids.masked_fill(finished, pad)
            tokens.append(next_ids)
            # The EOS token itself is attended to (mask 1); tokens after it are padding (mask 0).
            attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=1)
            if not self.ignore_eos:
                finished = finished | torch.isin(next_ids, eos)
            if bool(finished.all()) or step == self.max_new_tokens - 1:
                break
            out = self.model(
                input_ids=next_ids[:, None],
                attention_mask=attention_mask,
                position_ids=next_position,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            next_position = next_position + 1
        return torch.stack(tokens, dim=1), finished

    def _sample_hf_generate(self, prompt_ids, prompt_mask, greedy, generator):
        if generator is not None:
            # model.generate draws from the global RNG: seed it from the generator, restore it afterwards.
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
            fork = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
        else:
            seed, fork = None, contextlib.nullcontext()
        with fork:
            if seed is not None:
                torch.manual_seed(seed)
            kwargs = (
                {"do_sample": False}
                if greedy
                else {
                    "do_sample": True,
                    "temperature": self.temperature,
                    "top_p": self.top_p,
                    "top_k": self.top_k if self.top_k > 0 else None,
                }
            )
            out = self.model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                max_new_tokens=self.max_new_tokens,
                min_new_tokens=self.max_new_tokens if self.ignore_eos else None,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        completion_ids = out[:, prompt_ids.shape[1] :]
        if self.ignore_eos:
            return completion_ids, torch.zeros(out.shape[0], dtype=torch.bool, device=out.device)
        finished = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=out.device)).any(-1)
        return completion_ids, finished
