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


#: the pre-tokenizer split of Llama 3's and Qwen2's tokenizers (letters, 1–3 digits, punctuation runs, newlines)
BPE_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")


def bpe_template_tokenizer(chat_template: str, special_tokens: list[str], eos: str, bos: str | None, corpus: list[str],
                           add_bos: bool = False):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus`` (600 tokens, so that merges span
    words, digits and newlines), with Llama 3's / Qwen2's pre-tokenizer split and a real family's special
    tokens; ``add_bos``: it prepends BOS on encoding, as Llama 3's tokenizer does."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(BPE_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<pad>", *special_tokens], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))])
    others = [t for t in special_tokens if t not in (eos, bos)]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token=eos, bos_token=bos,
                                        additional_special_tokens=others, padding_side="left")
    tokenizer.chat_template = chat_template
    return tokenizer


def train_two_env_steps(tmp_path, env_id: str, task_options: dict, max_new_tokens_per_turn: int) -> list[dict]:
    """Two GRPO steps of a 1-layer tiny model with the ChatML tokenizer on ``env_id`` (an adapter's smoke run);
    returns the metric rows after checking each has a finite loss and at least one turn per episode."""
    import math

    from lmpo.models import build_chat_tokenizer, build_tiny_model
    from lmpo.trainer import Trainer
    from lmpo.trainer.config import config_from_dict

    tok = build_chat_tokenizer()
    model = build_tiny_model(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    cfg = config_from_dict({
        "env": {"id": env_id, "budget": {"max_turns": 3, "max_total_tokens": 200,
                                         "max_new_tokens_per_turn": max_new_tokens_per_turn}},
        "task": {"eval_examples": 2, "options": task_options},
        "rollout": {"completions_per_prompt": 2}, "objective": {"preset": "grpo"},
        "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 4, "seed": 0, "device": "cpu"},
        "eval": {"at_start": False}, "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(tmp_path / "run"), "progress_bar": False, "tensorboard": False, "plots": False},
    })
    result = Trainer(cfg, model=model, tokenizer=tok, log=lambda msg: None).train()
    assert result.steps_done == 2
    for row in result.history:
        assert math.isfinite(row["loss/total"]) and row["episodes/turns_mean"] >= 1
    return result.history
