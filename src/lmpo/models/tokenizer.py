"""A character-level tokenizer that is a real ``transformers`` tokenizer, built in code (no files to download).

Vocabulary (ids are fixed so that a saved model and a fresh tokenizer always agree)::

    0 <pad>   1 <bos>   2 <eos>   3 <unk>
    4 ...     digits, ASCII letters, ASCII punctuation, space, newline   (96 characters)
    100 ...   ``extra_chars`` in the order given (saved with the tokenizer, so loading restores them)

Every character is one token; ``tokenizer(text)`` prepends ``<bos>`` (``add_special_tokens=False`` to
skip it); unknown characters map to ``<unk>``. Decoding joins characters verbatim (no clean-up of
spaces), so ``decode(encode(s)) == s`` for any string over the vocabulary.
"""

from __future__ import annotations

import json
import os
import string

from transformers import PreTrainedTokenizer

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
BASE_CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


class CharTokenizer(PreTrainedTokenizer):
    """Character tokenizer: one token per character, ``<pad>/<bos>/<eos>/<unk>`` specials.

    Args:
        extra_chars: characters added after the 96 built-in ones (for example accented letters or CJK);
            duplicates of built-in characters are ignored.
        padding_side: ``"left"`` by default because generation pads prompts on the left.
    """

    vocab_files_names = {"vocab_file": "char_vocab.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str | None = None,
        extra_chars: str = "",
        padding_side: str = "left",
        **kwargs,
    ) -> None:
        if vocab_file is not None and os.path.isfile(vocab_file):
            with open(vocab_file, encoding="utf-8") as f:
                extra_chars = json.load(f).get("extra_chars", extra_chars)
        chars = list(BASE_CHARS)
        seen = set(chars)
        for ch in extra_chars:
            if ch not in seen:
                chars.append(ch)
                seen.add(ch)
        self.extra_chars = "".join(chars[len(BASE_CHARS) :])
        self._id_to_char = list(SPECIAL_TOKENS) + chars
        self._char_to_id = {c: i for i, c in enumerate(self._id_to_char)}
        for name in ("pad_token", "bos_token", "eos_token", "unk_token"):
            kwargs.pop(name, None)
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("special_tokens_pattern", "bos")
        super().__init__(
            pad_token="<pad>",
            bos_token="<bos>",
            eos_token="<eos>",
            unk_token="<unk>",
            padding_side=padding_side,
            extra_chars=self.extra_chars,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_char)

    def get_vocab(self) -> dict[str, int]:
        vocab = dict(self._char_to_id)
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self._char_to_id.get(token, self._char_to_id["<unk>"])

    def _convert_id_to_token(self, index: int) -> str:
        if 0 <= index < len(self._id_to_char):
            return self._id_to_char[index]
        return "<unk>"

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + self.vocab_files_names["vocab_file"]
        path = os.path.join(save_directory, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(
                {"extra_chars": self.extra_chars, "id_to_token": self._id_to_char}, f, ensure_ascii=False
            )
        return (path,)

    def to_fast(self):
        """The same tokenizer as a ``PreTrainedTokenizerFast`` (see :func:`char_tokenizer_to_fast`)."""
        return char_tokenizer_to_fast(self)


def char_tokenizer_to_fast(tokenizer: CharTokenizer):
    """A ``PreTrainedTokenizerFast`` (``tokenizers`` WordLevel model) with the same ids as ``tokenizer``.

    Saved with ``save_pretrained`` it loads with ``AutoTokenizer.from_pretrained`` in any ``transformers``
    installation (no lmpo import needed), which is what checkpoints and ``lmpo export`` write. Encoding and
    decoding agree with :class:`CharTokenizer` id for id: one token per character (``[\\s\\S]``, so newlines
    too), ``<unk>`` for a character outside the vocabulary, ``<bos>`` prepended when ``add_special_tokens``,
    the special tokens recognised in text, decoding joins characters verbatim.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(tokenizer._id_to_char)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # "." would not match a newline, and consecutive newlines would then become one (unknown) word
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    bos = tokenizer.bos_token
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tokenizer.bos_token_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=tokenizer.pad_token,
                                   bos_token=bos, eos_token=tokenizer.eos_token, unk_token=tokenizer.unk_token,
                                   padding_side=tokenizer.padding_side, clean_up_tokenization_spaces=False)
    if tokenizer.chat_template is not None:
        fast.chat_template = tokenizer.chat_template
    return fast


def _register_with_auto_tokenizer() -> None:
    """Let ``AutoTokenizer.from_pretrained(dir)`` resolve ``"tokenizer_class": "CharTokenizer"``.

    Only the class-name lookup is registered (not a config -> tokenizer mapping, which would hijack every
    Llama checkpoint). ``load_model_and_tokenizer`` also handles the class explicitly, so this is a
    convenience for code that calls ``AutoTokenizer`` directly (TRL, user scripts).
    """
    try:
        from transformers.models.auto import tokenization_auto
    except ImportError:  # pragma: no cover - layout of an older/newer transformers
        return
    registry = getattr(tokenization_auto, "REGISTERED_TOKENIZER_CLASSES", None)
    if isinstance(registry, dict):
        registry.setdefault("CharTokenizer", CharTokenizer)


_register_with_auto_tokenizer()
