"""A model name is resolved before ``transformers`` sees it, so a user's first mistakes cost seconds.

A name that reads as a local path is never looked up on the Hugging Face Hub; a hub id while the Hub is offline
or unreachable is loaded from the local cache when it is there and refused at once (exit 2) when it is not; a
config whose comments name the warm-up command that writes its model directory says which command. None of these
tests opens a connection to the Hub: ``socket.getaddrinfo`` and ``socket.create_connection`` fail the test if
anything resolves a host other than 127.0.0.1.
"""

from __future__ import annotations

import io
import socket
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest
import yaml

from lmpo.errors import InputError
from lmpo.models import loading
from lmpo.models.loading import hub_load_options, looks_like_hub_id, looks_like_local_path, warmup_command


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    """No connection leaves this machine; a fresh reachability probe per test; no proxy."""
    real_getaddrinfo = socket.getaddrinfo

    def local_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost"):
            raise AssertionError(f"a test tried to resolve {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", local_only)
    for variable in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    loading._hub_unreachable.cache_clear()
    yield
    loading._hub_unreachable.cache_clear()


@pytest.mark.parametrize("name", ["runs/does_not_exist", "./model", "/abs/model", "~/model", "..\\model",
                                  "runs/a/b"])
def test_a_path_shaped_name_is_not_a_hub_id(name):
    assert looks_like_local_path(name) and not looks_like_hub_id(name)


def test_a_name_whose_parent_directory_exists_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert looks_like_hub_id("models/mine") and looks_like_hub_id("Qwen/Qwen2.5-0.5B")
    (tmp_path / "models").mkdir()
    assert looks_like_local_path("models/mine") and not looks_like_hub_id("models/mine")


def _lmpo(argv):
    from lmpo.cli import main

    err = io.StringIO()
    start = time.monotonic()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue(), time.monotonic() - start


BASE = {"task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 1, "num_eval": 8},
                 "eval_examples": 4},
        "rollout": {"completions_per_prompt": 2, "max_new_tokens": 2},
        "loop": {"steps": 1, "prompts_per_step": 2, "seqs_per_microbatch": 4, "device": "cpu"},
        "logging": {"progress_bar": False, "tensorboard": False}}


def test_a_missing_run_directory_is_refused_at_once_without_the_hub(tmp_path, monkeypatch):
    """It took 52 s of Hub retries before; now config validation refuses it (the Hub is never asked)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(BASE))
    code, err, seconds = _lmpo(["train", "c.yaml", "--model.name", "runs/does_not_exist"])
    assert code == 2 and "runs/does_not_exist" in err and "never looked up" in err, err
    assert seconds < 10, f"{seconds:.1f} s to refuse a missing local model"


def test_the_config_comments_name_the_warm_up_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = ("# warm up first:\n#   PYTHONPATH=src python examples/warm.py --steps 8 \\\n#       --save runs/warm\n"
            "#   lmpo train c.yaml\n" + yaml.safe_dump({**BASE, "model": {"name": "runs/warm"}}))
    (tmp_path / "c.yaml").write_text(text)
    code, err, _ = _lmpo(["train", "c.yaml"])
    assert code == 2 and "`PYTHONPATH=src python examples/warm.py --steps 8 --save runs/warm`" in err, err
    assert warmup_command(text, "runs/other") is None
    assert warmup_command("# the model in runs/warm is the warm-up\n", "runs/warm") is None  # prose, not a command


def test_every_shipped_config_with_a_local_model_names_the_command_that_writes_it():
    """A shipped config whose model is a directory (a warm-up's output) says in its comments which command writes
    it, so that the refusal can name it; today every shipped config starts from a built-in or hub model."""
    from pathlib import Path

    for config in sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")):
        data = yaml.safe_load(config.read_text())
        name = ((data.get("train") or data).get("model") or {}).get("name")
        if name and looks_like_local_path(name):
            assert warmup_command(config.read_text(), name), f"{config.name}: model.name {name!r}"


def test_a_hub_id_offline_and_not_cached_is_refused_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    start = time.monotonic()
    with pytest.raises(InputError, match="switched off here") as e:
        hub_load_options("no-such-org/no-such-model")
    assert "hf download no-such-org/no-such-model" in str(e.value) and time.monotonic() - start < 5


def _cache(root, repo: str) -> None:
    """The layout huggingface_hub's cache has for a downloaded model: refs/main -> snapshots/<commit>/."""
    d = root / ("models--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text("0" * 40)
    (d / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (d / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


def test_an_unreachable_hub_reads_a_cached_model_from_the_cache_and_refuses_the_rest(monkeypatch, tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: the connection is refused at once
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache(tmp_path / "hub", "some-org/cached-model")
    assert hub_load_options("some-org/cached-model") == {"local_files_only": True}
    with pytest.raises(InputError, match="cannot be reached"):
        hub_load_options("some-org/other-model")


def test_a_reachable_hub_is_left_to_transformers(monkeypatch):
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    try:
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert hub_load_options("some-org/some-model") == {}
    finally:
        listening.close()


def test_a_local_or_preset_name_needs_no_hub(tmp_path):
    assert hub_load_options("tiny") == {} and hub_load_options(str(tmp_path)) == {}
    with pytest.raises(InputError, match="reads as a local path"):
        hub_load_options("runs/nothing_here")
