"""Run directories, resume config checks, durable metrics files and plain-data state (lmpo.runs, lmpo.checkpoints)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lmpo.checkpoints import CheckpointError, load_state, save_state
from lmpo.errors import InputError
from lmpo.runs import JsonlAppender, RunLock, check_resume_config, prepare_run_dir, read_jsonl, truncate_jsonl

ENTRIES = ("config.yaml", "metrics.jsonl", "checkpoints")


def test_one_run_per_directory(tmp_path):
    run = tmp_path / "run"
    prepare_run_dir(run, ENTRIES, resume=False, overwrite=False, dir_option="logging.run_dir")  # new: created
    (run / "config.yaml").write_text("a: 1\n")
    (run / "notes.txt").write_text("mine")
    (run / ".tmp_step_00000003_123").mkdir()
    with pytest.raises(InputError, match=r"already holds a run \(config.yaml\)\. Add --resume"):
        prepare_run_dir(run, ENTRIES, resume=False, overwrite=False, dir_option="logging.run_dir")
    prepare_run_dir(run, ENTRIES, resume=True, overwrite=False, dir_option="logging.run_dir")
    assert not (run / ".tmp_step_00000003_123").exists()  # a killed writer's temporary directory is removed
    prepare_run_dir(run, ENTRIES, resume=False, overwrite=True, dir_option="logging.run_dir")
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # only lmpo's files are deleted
    with pytest.raises(InputError, match="holds no run to continue"):
        prepare_run_dir(run, ENTRIES, resume=True, overwrite=False, dir_option="logging.run_dir")
    with pytest.raises(InputError, match="contradict"):
        prepare_run_dir(run, ENTRIES, resume=True, overwrite=True, dir_option="logging.run_dir")


def test_links_where_a_run_writes_are_refused_and_never_followed(tmp_path):
    """A link among a run's entries (or under its folders) is refused before the run starts; a link planted after
    that check is still not written through: appends and the lock file open with O_NOFOLLOW."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "mine.txt").symlink_to(victim)  # a link lmpo does not write: the user's business
    prepare_run_dir(run, ENTRIES, resume=False, overwrite=False, dir_option="logging.run_dir")
    for name in ("metrics.jsonl", "checkpoints/step_00000001/model.safetensors", "plots/reward.png"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).symlink_to(victim)
        with pytest.raises(InputError, match=rf"{name.split('/')[-1]} is a symbolic link .*choose another --run-dir"):
            prepare_run_dir(run, ENTRIES, resume=True, overwrite=False, dir_option="--run-dir")
        (run / name).unlink()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(InputError, match="metrics.jsonl is a symbolic link"):
        JsonlAppender(run / "metrics.jsonl")
    (run / ".lmpo-lock").symlink_to(victim)
    with pytest.raises(InputError, match=".lmpo-lock is a symbolic link"):
        RunLock(run, dir_option="logging.run_dir").acquire()
    assert victim.read_text() == "keep\n"
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(tmp_path / "made_by_lmpo.txt")  # a dangling link: O_CREAT would create it
    with pytest.raises(InputError, match="symbolic link"):
        JsonlAppender(run / "metrics.jsonl")
    assert not (tmp_path / "made_by_lmpo.txt").exists()


def test_resume_config_changes_are_named_and_only_allowed_keys_pass(tmp_path):
    stored = {"loop": {"steps": 10, "seed": 0}, "optim": {"lr": 1e-5}, "logging": {"run_dir": "a"},
              "task": {"options": {"max_digits": 2}}}
    allowed = ("loop.steps", "logging.*")
    longer = {**stored, "loop": {"steps": 20, "seed": 0}, "logging": {"run_dir": "b"}}
    assert [k for k, _, _ in check_resume_config(stored, longer, allowed, allow_change=False,
                                                 stored_path="c.yaml")] == ["logging.run_dir", "loop.steps"]
    changed = {**stored, "optim": {"lr": 1e-4}, "task": {"options": {"max_digits": 3}}}
    with pytest.raises(InputError, match=r"in `optim.lr` 1e-05 -> 0.0001; `task.options.max_digits` 2 -> 3\. "
                                         r".*only loop.steps, logging.… may change"):
        check_resume_config(stored, changed, allowed, allow_change=False, stored_path="c.yaml")
    assert len(check_resume_config(stored, changed, allowed, allow_change=True, stored_path="c.yaml")) == 2


def test_metrics_file_torn_last_line_is_reported_and_cut_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    out = JsonlAppender(path)
    for step in range(4):
        out.append({"step": step, "x": 0.1 * step})
    out.close()
    whole = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"step": 4, "x"')  # a kill in the middle of a line
    notes = []
    assert [r["step"] for r in read_jsonl(path, on_torn=notes.append)] == [0, 1, 2, 3]
    assert len(notes) == 1 and "last line is incomplete (15 bytes" in notes[0]
    assert truncate_jsonl(path, 3, on_torn=None) == 3
    assert path.read_bytes() == b"".join(whole.splitlines(keepends=True)[:3])  # kept lines byte for byte
    assert not list(tmp_path.glob(".tmp_*"))
    path.write_bytes(whole.replace(b'{"step": 1', b'\x00{"ste', 1))
    with pytest.raises(InputError, match=r"metrics.jsonl: line 2 is not a JSON record"):
        read_jsonl(path)


def test_plain_data_state_roundtrip_is_exact_and_refuses_other_files(tmp_path):
    gen = np.random.default_rng(3)
    gen.random(5)
    state = {
        "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(), "numpy_legacy": np.random.get_state(),
        "pcg64": gen.bit_generator.state, "adam": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 3)}},
        "betas": (0.9, 0.999), "arrays": [np.arange(5, dtype=np.int32), np.zeros((0, 4), dtype=np.uint8)],
        "scalar": np.float32(1.5), "flags": np.array([True, False]), "nan": float("nan"), "big": 2**100,
        "__dunder": "kept", "none": None,
    }
    save_state(tmp_path, "s", state)
    back = load_state(tmp_path, "s")
    assert torch.equal(back["torch_rng"], state["torch_rng"]) and back["python_rng"] == state["python_rng"]
    assert back["numpy_legacy"][0] == "MT19937" and np.array_equal(back["numpy_legacy"][1], state["numpy_legacy"][1])
    assert back["pcg64"] == state["pcg64"] and back["betas"] == (0.9, 0.999) and back["big"] == 2**100
    assert torch.equal(back["adam"][0]["exp_avg"], state["adam"][0]["exp_avg"]) and 0 in back["adam"]
    assert back["arrays"][0].dtype == np.int32 and back["arrays"][1].shape == (0, 4)
    assert type(back["scalar"]) is np.float32 and back["flags"].dtype == bool and back["__dunder"] == "kept"
    np.random.set_state(back["numpy_legacy"])  # RNG states load back into their generators
    random.setstate(back["python_rng"])
    with pytest.raises(TypeError, match=r"t.obj: a object cannot be saved"):
        save_state(tmp_path, "t", {"obj": object()})
    (tmp_path / "s.json").write_text('{"format": "lmpo-state", "version": 1, "state": {"__ndarray__": "t0", '
                                     '"dtype": "|O", "shape": [1]}}')
    with pytest.raises(CheckpointError, match="not plain numeric data"):
        load_state(tmp_path, "s")


def test_run_directory_files_are_never_written_through_a_link(tmp_path):
    """The temporary file of an atomic replace (and every checkpoint file) is opened with O_NOFOLLOW."""
    import errno

    from lmpo.checkpoints import replace_file, write_bytes

    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (tmp_path / "state.json").symlink_to(victim)
    with pytest.raises(OSError) as err:
        write_bytes(tmp_path / "state.json", b"{}")
    assert err.value.errno == errno.ELOOP
    (tmp_path / f".tmp_config.yaml.{__import__('os').getpid()}").symlink_to(victim)  # planted where replace writes
    with pytest.raises(OSError):
        replace_file(tmp_path / "config.yaml", b"a: 1\n")
    replace_file(tmp_path / "state.json", b"{}")  # a link at the destination is replaced, not followed
    assert victim.read_text() == "keep\n" and not (tmp_path / "state.json").is_symlink()
