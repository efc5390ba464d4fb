"""Weights of a supervised reference policy (``RUN_DIR/policy.safetensors``) and the alphabet they belong to."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from lmpo.errors import InputError
from lmpo.textagent.sac.config import policy_file


def alphabet_digest(alphabet) -> str:
    """SHA-256 of the alphabet's characters in id order: two runs can share weights only when it is equal."""
    return hashlib.sha256("\x00".join(alphabet.chars).encode("utf-8")).hexdigest()


def load_reference_policy(spec: str | Path, alphabet) -> dict[str, torch.Tensor]:
    """The reference's policy weights, refused when its alphabet differs from the run's."""
    from safetensors import safe_open

    path = policy_file(spec)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    digest = alphabet_digest(alphabet)
    if meta.get("alphabet_sha256") != digest:
        raise InputError(f"`init_policy` = {str(spec)!r} was trained on another alphabet (|Σ| "
                         f"{meta.get('alphabet_size', '?')} vs this run's {len(alphabet)}): train the reference "
                         "with the same corpus, extra_train_corpus, leak_filter_chars and split settings.")
    return state
