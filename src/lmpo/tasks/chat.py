"""Chat templates: conversational prompts become the text the policy sees, rendered by its tokenizer.

TRL's two dataset formats are read (``lmpo.tasks.files``):

- **standard**: ``{"prompt": "What is 2+3?", "answer": "5"}`` — the prompt is fed to the model as it is;
- **conversational**: ``{"prompt": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"}`` — the
  prompt is a list of messages; :func:`render_prompts` turns it into text with
  ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``, exactly as TRL's ``GRPOTrainer``
  does, so the model is asked to write the assistant turn.

``prompt_format`` chooses: ``auto`` renders conversational prompts and leaves string prompts alone (TRL's
behaviour), ``chat`` also wraps every string prompt as one user message (an instruction-tuned model on a
built-in task), ``text`` never renders (conversational data are then an error).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from lmpo.errors import InputError
from lmpo.models.chat import has_chat_template, read_chat_template
from lmpo.tasks.base import Example

PROMPT_FORMATS = ("auto", "chat", "text")


def is_conversation(value: Any) -> bool:
    """True for a non-empty list of ``{"role": ..., "content": ...}`` messages (TRL's conversational format)."""
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value))


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("")["input_ids"][:1] == [bos]


def render_conversation(tokenizer, messages: Sequence[Mapping[str, Any]], chat_template: str | None = None,
                        add_generation_prompt: bool = True, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """``messages`` rendered by the chat template as the text to encode with ``tokenizer(text)``.

    A template that writes the BOS token itself (Llama-style ``{{ bos_token }}``) would get a second one from
    a tokenizer that prepends BOS on encoding, so the rendered BOS is dropped in that case: encoding the
    returned text gives the same ids as ``apply_chat_template(..., tokenize=True)``. ``tools`` are function
    schemas passed to the template as ``tools=`` (templates that know tools list them in the system turn).
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt,
                                         chat_template=chat_template, tools=list(tools) if tools else None)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]
    return text


def needs_chat_template(examples: Sequence[Example], prompt_format: str = "auto") -> bool:
    """Whether :func:`render_prompts` will call the chat template on these examples."""
    return prompt_format == "chat" or (prompt_format == "auto" and any(e.messages is not None for e in examples))


def render_prompts(examples: Sequence[Example], tokenizer, prompt_format: str = "auto",
                   chat_template: str | None = None, *, model_name: str = "the model",
                   source: str = "the task", options: tuple[str, str] = ("task.prompt_format", "task.chat_template")
                   ) -> list[Example]:
    """Examples whose ``prompt`` is the text the policy sees (see the module docstring for ``prompt_format``).

    Rendered examples keep their conversation in ``Example.messages`` (string prompts wrapped by ``chat``
    get ``[{"role": "user", "content": prompt}]``), which is what reward functions receive as ``prompts``.

    Args:
        chat_template: a Jinja template (text or file path) used instead of the tokenizer's own.
        model_name, source: named in errors (the tokenizer's model, the data).
        options: how the caller spells the ``prompt_format`` and ``chat_template`` settings, named in errors
            (the config keys by default; ``lmpo eval`` passes its flags).
    Raises:
        InputError: conversational data with ``prompt_format: text``, or a template is needed and neither the
            tokenizer nor ``chat_template`` has one.
    """
    if prompt_format not in PROMPT_FORMATS:
        raise InputError(f"prompt format {prompt_format!r} is not one of {', '.join(PROMPT_FORMATS)}.")
    format_option, template_option = options
    if prompt_format == "text" and any(e.messages is not None for e in examples):
        raise InputError(f"{source} has conversational prompts (lists of role/content messages) but the prompt "
                         f"format is 'text', which never applies a chat template; set {format_option} to 'auto' "
                         "or give plain-text prompts.")
    if not needs_chat_template(examples, prompt_format):
        return list(examples)
    template = read_chat_template(chat_template) if chat_template else None
    if not has_chat_template(tokenizer, template):
        what = ("has conversational prompts (lists of role/content messages)" if prompt_format == "auto"
                else f"is to be rendered as chat ({format_option} chat)")
        raise InputError(f"{source} {what}, but the tokenizer of {model_name} has no chat template to render them "
                         "with. Use a chat model (one whose tokenizer_config.json has a chat_template), give a Jinja "
                         f"template with {template_option} (the template text or a file path), or use plain-text "
                         "prompts.")
    out = []
    for e in examples:
        messages = e.messages if e.messages is not None else [{"role": "user", "content": e.prompt}]
        prompt = render_conversation(tokenizer, messages, template)
        out.append(dataclasses.replace(e, prompt=prompt, messages=list(messages)))
    return out
