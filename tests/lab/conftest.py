"""Lab tests run on one CPU thread with a very small model saved to disk (cells load it by path)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory):
    """A 1-layer, 32-wide Llama saved with its character tokenizer: ``model.name`` for smoke labs."""
    from lmpo.models import CharTokenizer, build_tiny_model

    path = tmp_path_factory.mktemp("lab_model") / "small"
    tok = CharTokenizer()
    model = build_tiny_model(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
