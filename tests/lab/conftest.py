"""Lab tests run on one CPU thread with a very small model saved to disk (cells load it by path)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _save_small_model(path, tok) -> str:
    """A 1-layer, 32-wide Llama for ``tok``, saved with it to ``path``."""
    from lmpo.models import build_tiny_model

    model = build_tiny_model(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory):
    """The small Llama with its character tokenizer: ``model.name`` for smoke labs."""
    from lmpo.models import CharTokenizer

    return _save_small_model(tmp_path_factory.mktemp("lab_model") / "small", CharTokenizer())


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """The small Llama with the offline ChatML tokenizer: multi-turn labs render episodes with a chat template."""
    from lmpo.models import build_chat_tokenizer

    return _save_small_model(tmp_path_factory.mktemp("lab_chat_model") / "small_chat", build_chat_tokenizer())
