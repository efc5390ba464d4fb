"""``load_model_and_tokenizer``: the built-in tiny preset or any Hugging Face causal LM path.

Before ``transformers`` is asked for a model, the name is resolved here so that a user's first mistakes cost
seconds, not a minute of Hub retries: a name that reads as a local path is never looked up on the Hub, a hub id
is not requested while the Hub is offline or unreachable (a cached copy is then loaded from the cache), and a
model directory holding a pickle-format weight file is refused before anything reads it.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
from urllib.parse import urlsplit

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lmpo.errors import InputError
from lmpo.models.presets import MODEL_PRESETS, build_tiny_model
from lmpo.models.tokenizer import CharTokenizer

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``torch.bfloat16`` -> ``torch.bfloat16``; ``None``/``"auto"`` -> ``None``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


#: prefixes of a name that is a path on this machine (``runs/``: where lmpo writes run and model directories)
PATH_PREFIXES = (".", "/", "~", "runs/")
#: files ``from_pretrained`` would read with pickle (``torch.load``); lmpo loads safetensors weights only
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_TIMEOUT_S = 3.0


def looks_like_local_path(name: str) -> bool:
    """A name meant as a directory on this machine: it starts with ``.``, ``/``, ``~`` or ``runs/``, holds a
    backslash, or the directory it would sit in exists here (``models/mine`` next to a ``models/`` directory)."""
    if name.startswith(PATH_PREFIXES) or "\\" in name:
        return True
    parent = os.path.dirname(name)
    return bool(parent) and os.path.isdir(parent)


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` (one slash, not a path by :func:`looks_like_local_path`): a name ``from_pretrained`` may
    download. A missing local path such as ``runs/x`` or ``./model`` is not one, so it is reported as missing
    instead of being looked up on the Hub."""
    return name.count("/") == 1 and not looks_like_local_path(name)


def _truthy(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def _hub_unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be reached from here, or None when a TCP connection opens within
    ``HUB_TIMEOUT_S`` (or a proxy is configured: the proxy decides). Name resolution has no timeout of its own,
    so the probe runs in a thread that is abandoned after the timeout."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=HUB_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{host}:{port} cannot be reached ({type(e).__name__}: {e})")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S + 0.5)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {HUB_TIMEOUT_S:g} s"


def hub_load_options(name: str) -> dict:
    """``from_pretrained`` keywords for ``name``: ``{}`` for a local directory or a hub id while the Hub is
    reachable; ``{"local_files_only": True}`` for a hub id this machine has cached while the Hub is offline
    (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) or unreachable, instead of a minute of retries first.
    Raises InputError for a name that reads as a missing local path, and for a hub id that can be neither
    downloaded nor found in the cache."""
    if name in MODEL_PRESETS or os.path.isdir(name):
        return {}
    if not looks_like_hub_id(name):
        raise InputError(f"model {name!r} is not a directory (working directory: {os.getcwd()}) and reads as a "
                         "local path, not a Hugging Face hub id `org/name`. Fix the path, or write the model "
                         "there first.")
    from huggingface_hub import constants, try_to_load_from_cache

    if _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE") or constants.HF_HUB_OFFLINE:
        why = "the Hugging Face Hub is switched off here (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set)"
    else:
        why = _hub_unreachable(constants.ENDPOINT)
        if why is None:
            return {}
        why = f"the Hugging Face Hub cannot be reached ({why})"
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return {"local_files_only": True}
    raise InputError(f"model {name!r} is a Hugging Face hub id, but {why} and this machine's Hugging Face cache "
                     "(HF_HUB_CACHE) holds no copy of it. Download it once where the Hub is reachable "
                     f"(`hf download {name}`), or give a local model directory or a built-in preset "
                     f"({', '.join(sorted(MODEL_PRESETS))}).")


def refuse_pickle_weights(path: str) -> None:
    """Raise InputError when the model directory ``path`` holds a pickle-format weight file: ``from_pretrained``
    would read it with ``torch.load``, and a pickle can run code; lmpo reads safetensors weights only."""
    if not os.path.isdir(path):
        return
    found = sorted(f for f in os.listdir(path) if f.lower().endswith(PICKLE_WEIGHTS))
    if found:
        raise InputError(f"model directory {path!r} holds {', '.join(found)}: pickle-format weights, which can run "
                         "code when loaded, and lmpo loads safetensors weights only. Convert the model to "
                         "safetensors where you trust it (`model.save_pretrained(dir)` writes model.safetensors) "
                         "and remove the pickle files, or point at a directory without them.")


def hf_progress_bars_only_on_a_terminal() -> None:
    """Switch off transformers' weight-loading progress bars when stderr is not a terminal: piped into a log
    they are carriage-return redraws, not lines (lmpo's own console follows the same rule)."""
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _saved_tokenizer_class(path: str) -> str | None:
    config_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        return json.load(f).get("tokenizer_class")


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Tokenizer for a preset name or a path; pad token falls back to EOS, padding on the left."""
    if name_or_path in MODEL_PRESETS:
        tokenizer = CharTokenizer()
    elif os.path.isdir(name_or_path) and _saved_tokenizer_class(name_or_path) == "CharTokenizer":
        tokenizer = CharTokenizer.from_pretrained(name_or_path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                                  **hub_load_options(name_or_path))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer of {name_or_path!r} has neither a pad nor an EOS token; set tokenizer.pad_token"
            )
        # Pad positions are masked out everywhere, so reusing EOS as pad changes nothing numerically.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model_and_tokenizer(
    name_or_path: str,
    dtype: str | torch.dtype | None = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return ``(model, tokenizer)`` ready for generation and training.

    - a name in ``MODEL_PRESETS`` (``"tiny"``): a ``CharTokenizer`` and a fresh Llama-style model
      initialised with ``seed``; nothing is read from disk or the network;
    - anything else: ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (a saved
      tiny model directory loads back exactly). ``dtype="auto"`` keeps the checkpoint's dtype. A missing local
      path, a hub id while the Hub is offline or unreachable and not cached, or a directory with pickle-format
      weights is an InputError before ``transformers`` reads anything (:func:`hub_load_options`,
      :func:`refuse_pickle_weights`).

    The tokenizer pads on the left and its pad token falls back to EOS; the model's
    ``generation_config`` gets the tokenizer's pad/EOS ids.
    """
    torch_dtype = resolve_dtype(dtype)
    if name_or_path in MODEL_PRESETS:
        tokenizer = load_tokenizer(name_or_path)
        model = build_tiny_model(
            tokenizer,
            preset=name_or_path,
            seed=seed,
            dtype=torch_dtype or torch.float32,
            attn_implementation=attn_implementation or "sdpa",
        )
    else:
        if not os.path.exists(name_or_path) and "/" not in name_or_path:
            raise ValueError(
                f"model {name_or_path!r} is neither a built-in preset ({sorted(MODEL_PRESETS)}), "
                "a local directory, nor a Hugging Face 'org/name' id"
            )
        refuse_pickle_weights(name_or_path)
        extra = hub_load_options(name_or_path)
        tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
        hf_progress_bars_only_on_a_terminal()
        if attn_implementation:
            extra["attn_implementation"] = attn_implementation
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=torch_dtype or "auto", trust_remote_code=trust_remote_code, **extra
        )
    model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        if model.generation_config.eos_token_id is None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.to(device), tokenizer


def warmup_command(config_text: str, directory: str) -> str | None:
    r"""The command a config's comments give for writing ``directory`` (the warm-up run that saves the model the
    config trains from), joined across ``\`` line continuations; None when the comments name none. A command
    is a comment that starts with ``python``, ``lmpo`` or ``make`` (after ``VAR=value`` settings) and has
    ``directory`` as one of its arguments.

    >>> warmup_command("#   python sft.py --steps 8 \\\n#       --save runs/warm\nmodel: {name: runs/warm}", "runs/warm")
    'python sft.py --steps 8 --save runs/warm'
    """
    target = os.path.normpath(directory)
    command = ""
    for line in config_text.splitlines():
        text = line.strip()
        if not text.startswith("#"):
            command = ""
            continue
        text = text.lstrip("#").strip()
        command = f"{command} {text}".strip() if command else text
        if command.endswith("\\"):
            command = command[:-1].rstrip()
            continue
        words = command.split()
        program = next((w for w in words if "=" not in w), "")
        if (os.path.basename(program) in ("python", "python3", "lmpo", "make")
                and any(os.path.normpath(w.strip("'\"`,;")) == target for w in words[1:])):
            return command
        command = ""
    return None
