"""An offline chat tokenizer: a real ``PreTrainedTokenizerFast`` (``tokenizers`` backend) with a ChatML template.

For examples and tests that need a chat model without downloading one: one token per printable ASCII
character plus Qwen2's special tokens, and Qwen2's chat format (``<|im_start|>role\\n…<|im_end|>\\n``). Saved with
``save_pretrained`` it loads back with ``AutoTokenizer.from_pretrained``, template included.

>>> tok = build_chat_tokenizer()
>>> tok.apply_chat_template([{"role": "user", "content": "2+3="}], tokenize=False, add_generation_prompt=True)
'<|im_start|>user\\n2+3=<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import os
import string

from lmpo.errors import InputError

#: Qwen2's ChatML chat template without its tool-calling branches
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: the chat template a built-in preset's character tokenizer gets on a multi-turn run (``model.name: tiny`` with
#: ``env.id``): ``role: content`` lines, each ended by the tokenizer's EOS (the stop token of an assistant turn),
#: and, when the environment has tools, a first line naming each tool with its parameters, ``tools:
#: calculator(expression)``. The full JSON schemas are not written: at one token per character they would fill
#: most of the tiny model's 256 positions.
TINY_CHAT_TEMPLATE = (
    "{% if tools %}tools: {% for t in tools %}{% set f = t['function'] if 'function' in t else t %}"
    "{% set p = f.get('parameters') or {} %}{{ f['name'] }}({{ (p.get('properties') or {}) | join(', ') }})"
    "{% if not loop.last %}, {% endif %}{% endfor %}{{ eos_token }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
#: pad, start of a turn, end of a turn (EOS of an assistant reply), as in Qwen2 chat models
CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def has_chat_template(tokenizer, chat_template: str | None = None) -> bool:
    """Whether conversations can be rendered: a template is given, or the tokenizer carries its own."""
    return bool(chat_template or getattr(tokenizer, "chat_template", None))


def build_chat_tokenizer(chat_template: str | None = CHATML_TEMPLATE):
    """A character-level ``PreTrainedTokenizerFast``: pad ``<|endoftext|>``, EOS ``<|im_end|>``, no BOS, left
    padding; ``chat_template=None`` gives the same tokenizer without a template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.digits + string.ascii_letters + string.punctuation + " \n"
    vocab = {token: i for i, token in enumerate(list(CHAT_SPECIAL_TOKENS) + list(chars))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=CHAT_SPECIAL_TOKENS[0]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=CHAT_SPECIAL_TOKENS[0],
                                        eos_token=CHAT_SPECIAL_TOKENS[2],
                                        additional_special_tokens=[CHAT_SPECIAL_TOKENS[1]], padding_side="left")
    tokenizer.chat_template = chat_template
    return tokenizer


def read_chat_template(template: str) -> str:
    """A Jinja chat template given as its text (contains ``{{`` or ``{%``) or as the path of a file holding it."""
    if "{{" in template or "{%" in template:
        return template
    if not os.path.isfile(template):
        raise InputError(f"chat template {template!r} is neither a Jinja template (no '{{{{' or '{{%') nor an "
                         "existing file; give the template text or the path of a .jinja file.")
    with open(template, encoding="utf-8") as fh:
        return fh.read()
