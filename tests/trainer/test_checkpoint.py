"""Atomic checkpoints: an interrupted write leaves the previous checkpoint loadable; keep-last-N; resume paths."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import small_model

import lmpo.trainer.run.state as ckpt
from lmpo.checkpoints import MANIFEST, remove_stale
from lmpo.errors import InputError


def _state(step: int) -> dict:
    return {"step": step, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "rng": {"torch": torch.get_rng_state()}}


def test_roundtrip_with_weights_only_and_tied_embeddings(tmp_path):
    model, _ = small_model(seed=0)
    path = ckpt.save_checkpoint(tmp_path, 3, model, _state(3))
    assert path.name == "step_00000003"
    other, _ = small_model(seed=1)
    state = ckpt.load_checkpoint(path, other)
    assert state["step"] == 3
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), k
    # the output head stays tied to the input embedding after loading
    assert other.get_output_embeddings().weight.data_ptr() == other.get_input_embeddings().weight.data_ptr()


def test_interrupted_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, _ = small_model(seed=0)
    ckpt.save_checkpoint(tmp_path, 1, model, _state(1))
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

    real_write = ckpt._write_files

    def killed_mid_write(tmp, model, state, ref_model):
        real_write(tmp, model, state, ref_model)  # every file written ...
        (tmp / ckpt.STATE_FILE).write_bytes(b"\x00garbage")  # ... one of them torn ...
        raise KeyboardInterrupt("killed")  # ... and the process dies before the rename

    monkeypatch.setattr(ckpt, "_write_files", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 2, model, _state(2))
    monkeypatch.setattr(ckpt, "_write_files", real_write)

    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_00000001"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_00000001"
    fresh, _ = small_model(seed=7)
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path), fresh)
    assert state["step"] == 1
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, reference[k]), k


def test_stale_temp_dir_is_ignored(tmp_path):
    model, _ = small_model(seed=0)
    ckpt.save_checkpoint(tmp_path, 1, model, _state(1))
    (ckpt.checkpoint_dir(tmp_path) / ".tmp_step_00000002_99999").mkdir()  # left by a killed process
    assert ckpt.latest_checkpoint(tmp_path).name == "step_00000001"
    assert ckpt.resolve_resume("auto", tmp_path).name == "step_00000001"
    assert ckpt.resolve_resume(str(tmp_path), tmp_path / "elsewhere").name == "step_00000001"
    with pytest.raises(InputError, match="not a checkpoint directory"):
        ckpt.resolve_resume(str(tmp_path / "nothing"), tmp_path)


def test_keep_last_prunes_oldest(tmp_path):
    model, _ = small_model(seed=0)
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(tmp_path, step, model, _state(step), keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    # re-writing an existing step replaces it in place
    ckpt.save_checkpoint(tmp_path, 4, model, _state(4), keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]


def test_manifest_refuses_partial_mixed_and_altered_checkpoints_and_resume_falls_back(tmp_path):
    model, _ = small_model(seed=0)
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, model, _state(step))
    one, two, three = ckpt.list_checkpoints(tmp_path)
    # partial: a file the manifest lists is gone
    (three / ckpt.MODEL_FILE).unlink()
    with pytest.raises(ckpt.CheckpointError, match=r"step_00000003: file model.safetensors .* is missing"):
        ckpt.load_checkpoint(three, model)
    # mixed: the state of another checkpoint copied in
    (two / ckpt.STATE_FILE).write_bytes((one / ckpt.STATE_FILE).read_bytes())
    with pytest.raises(ckpt.CheckpointError, match=r"state.json does not match its manifest"):
        ckpt.load_checkpoint(two, model)
    # resume falls back to the newest complete checkpoint and says which ones it skipped
    skipped = []
    assert ckpt.resolve_resume("auto", tmp_path, log=skipped.append) == one
    assert [m.split(":")[0] for m in skipped] == ["skipping step_00000003", "skipping step_00000002"]
    # a manifest moved between checkpoints names the wrong step
    (one / MANIFEST).write_bytes((two / MANIFEST).read_bytes())
    with pytest.raises(ckpt.CheckpointError, match="manifest is for step 2, not 1"):
        ckpt.load_checkpoint(one, model)
    with pytest.raises(ckpt.CheckpointError, match="none of the 3 checkpoints .* is complete"):
        ckpt.resolve_resume("auto", tmp_path)


def test_files_get_one_permission_and_stale_temp_dirs_are_removed(tmp_path):
    model, _ = small_model(seed=0)
    path = ckpt.save_checkpoint(tmp_path, 1, model, _state(1))
    modes = {p.name: p.stat().st_mode & 0o777 for p in path.iterdir()}
    assert len(set(modes.values())) == 1, modes  # safetensors writes 0600 on its own; state files 0644
    stale = ckpt.checkpoint_dir(tmp_path) / ".tmp_step_00000002_99999"
    stale.mkdir()
    assert remove_stale(tmp_path) == [stale] and not stale.exists()
