"""A model directory is data, never code: a pickle-format weight file planted in it is refused before
``transformers`` reads anything.

A saved tiny model gets a ``pytorch_model.bin`` (with its ``model.safetensors`` kept, and removed, so that
``from_pretrained`` would pick the pickle) whose unpickling would create a marker file
(``torch.load(weights_only=False)`` and ``pickle.load`` run it). Every command that loads a model directory —
``lmpo train`` with it as ``model.name``, ``model.ref_path`` or ``teacher.name``, and ``lmpo eval`` — must exit
2 with one message naming the file, without a traceback, and the marker must never appear. A reward model's
directory and a ``.pt`` file are refused the same way.
"""

from __future__ import annotations

import pickle
import shutil

import pytest
import yaml
from test_bad_inputs import BASE
from test_planted_files import _Opens, _run


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    from lmpo.models import CharTokenizer, build_tiny_model

    d = tmp_path_factory.mktemp("saved") / "model"
    tok = CharTokenizer()
    build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32).save_pretrained(d)
    tok.save_pretrained(d)
    return d


COMMANDS = {
    "train model.name": lambda m, cfg, run: ["train", cfg, "--model.name", m, "--logging.run_dir", run],
    "train model.ref_path": lambda m, cfg, run: ["train", cfg, "--model.ref_path", m, "--objective.overrides",
                                                 "{kl_coef: 0.1}", "--logging.run_dir", run],
    "train teacher.name": lambda m, cfg, run: ["train", cfg, "--teacher.name", m, "--objective.overrides",
                                               "{distill: reverse_kl}", "--logging.run_dir", run],
    "eval": lambda m, cfg, run: ["eval", m, "--task", "addition", "--n", "2", "--device", "cpu"],
}


@pytest.mark.parametrize("keep_safetensors", [True, False], ids=["beside-safetensors", "alone"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_planted_pickle_weight_file_is_refused_unread(saved_model, tmp_path, command, keep_safetensors,
                                                        one_torch_thread):
    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    if not keep_safetensors:
        (model / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps({"state": _Opens(marker)}, protocol=2))
    cfg = tmp_path / "base.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    code, err = _run(COMMANDS[command](str(model), str(cfg), str(tmp_path / "run")))
    assert not marker.exists(), f"{command}: the planted pickle was loaded"
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("lmpo")]
    assert len(lines) == 1 and "pytorch_model.bin" in lines[0] and "pickle" in lines[0], err


def test_a_pt_file_is_refused_too(saved_model, tmp_path):
    from lmpo.errors import InputError
    from lmpo.models.loading import refuse_pickle_weights

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    refuse_pickle_weights(str(model))  # a directory save_pretrained wrote passes
    (model / "weights.PT").write_bytes(b"\x80\x02N.")
    with pytest.raises(InputError, match="weights.PT"):
        refuse_pickle_weights(str(model))


def test_a_reward_model_directory_with_pickle_weights_is_refused_unread(saved_model, tmp_path):
    from lmpo.errors import InputError
    from lmpo.rewards.model import RewardModel

    model = tmp_path / "rm"
    shutil.copytree(saved_model, model)
    marker = tmp_path / "PWNED"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps({"state": _Opens(marker)}, protocol=2))
    with pytest.raises(InputError, match="reward model: .*pytorch_model.bin"):
        RewardModel(str(model))
    assert not marker.exists()
