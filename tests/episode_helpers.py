"""Policies for the multi-turn tests: a scripted ``TurnSampler`` that writes given texts, tokenised once, with
made-up log-probs, and records every context it was asked to continue; a tiny model biased to end its turns."""

from __future__ import annotations

from torch import nn

from lmpo.generation.episodes import SampledTurn

#: the ChatML generation prompt (``lmpo.models.CHATML_TEMPLATE``): counting it in a context gives the turn
GENERATION_PROMPT = "<|im_start|>assistant\n"


class ScriptedSampler:
    """Writes ``script[k]`` at turn k, or ``script(context_text, k)`` when ``script`` is a function; a text given as
    ``(text, False)`` is written without a stop token. The turn k is read from the context (the number of
    ``turn_marker`` — the template's generation prompt — in it, minus one). Records ``contexts`` and ``turns``."""

    def __init__(self, tokenizer, script, turn_marker: str = GENERATION_PROMPT):
        self.tokenizer, self.script, self.turn_marker = tokenizer, script, turn_marker
        self.stop_token_ids = [tokenizer.eos_token_id]
        self.contexts, self.turns = [], []

    def sample(self, contexts, max_new_tokens, generator=None):
        out = []
        for context, limit in zip(contexts, max_new_tokens):
            text_so_far = self.tokenizer.decode(context)
            k = text_so_far.count(self.turn_marker) - 1
            reply = self.script(text_so_far, k) if callable(self.script) else self.script[k]
            text, stop = reply if isinstance(reply, tuple) else (reply, True)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + ([self.tokenizer.eos_token_id] if stop else [])
            stopped = stop and len(ids) <= limit
            ids = ids[:limit]
            turn = SampledTurn(ids, [-0.01 * (j + 1) - k for j in range(len(ids))], stopped)
            self.contexts.append(list(context))
            self.turns.append(turn)
            out.append(turn)
        return out


class EosBias(nn.Module):
    """A causal LM with its stop-token logit raised by ``bias``, so that a randomly initialised tiny model still
    ends its turns within a few tokens (multi-turn tests need turns that stop)."""

    def __init__(self, model, eos: int, bias: float):
        super().__init__()
        self.model, self.eos, self.bias = model, eos, bias

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits[..., self.eos] += self.bias
        return out


def template_tokenizer(chat_template: str, special_tokens: list[str], eos: str, bos: str | None = None):
    """A character-level ``PreTrainedTokenizerFast`` (printable ASCII, one token per character) whose special
    tokens are those of a real model family, so that its real chat template can be rendered and encoded offline.
    Nothing is prepended on encoding (templates that want a BOS write it)."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.digits + string.ascii_letters + string.punctuation + " \n"
    vocab = {t: i for i, t in enumerate(["<pad>", *special_tokens, *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    others = [t for t in special_tokens if t not in (eos, bos)]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token=eos, bos_token=bos,
                                        additional_special_tokens=others, padding_side="left")
    tokenizer.chat_template = chat_template
    return tokenizer
