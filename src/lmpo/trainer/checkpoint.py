"""Atomic, ``weights_only``-loadable checkpoints.

Layout of one checkpoint (``RUN_DIR/checkpoints/step_00000012/``)::

    model.safetensors   policy parameters and buffers (safetensors; tied weights handled)
    ref.safetensors     the frozen reference model, when the run has one (so that resume needs no re-init)
    state.pt            optimizer, schedule, RNG states, controller states, data position, counters
                        (``torch.save``; read back with ``torch.load(weights_only=True)``)

A checkpoint is written into a hidden temporary directory beside its final place and renamed into
place only once every file is complete and flushed, so a crash or kill mid-write leaves the previous
checkpoints untouched and never exposes a half-written one. ``latest_checkpoint`` only considers
``step_*`` directories, which exist only after the rename.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

_STEP_DIR = re.compile(r"^step_(\d{8})$")
MODEL_FILE = "model.safetensors"
REF_FILE = "ref.safetensors"
STATE_FILE = "state.pt"


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_files(tmp: Path, model: torch.nn.Module, state: dict, ref_model: torch.nn.Module | None) -> None:
    """Write every file of a checkpoint into ``tmp`` (a separate function so tests can interrupt it)."""
    save_model(model, str(tmp / MODEL_FILE))
    if ref_model is not None:
        save_model(ref_model, str(tmp / REF_FILE))
    with open(tmp / STATE_FILE, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def save_checkpoint(run_dir: str | os.PathLike, step: int, model: torch.nn.Module, state: dict,
                    ref_model: torch.nn.Module | None = None, keep_last: int = 0) -> Path:
    """Write checkpoint ``step`` atomically and prune to the newest ``keep_last`` (0 = keep all)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _write_files(tmp, model, state, ref_model)
        _fsync_dir(tmp)
        if final.exists():  # re-writing a step (e.g. after resume): swap, never leave a gap without it
            trash = root / f".old_step_{step:08d}_{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    ref_model: torch.nn.Module | None = None) -> dict:
    """Load weights into ``model`` (and ``ref_model``) in place; return the state dict (weights_only)."""
    path = Path(path)
    if not (path / STATE_FILE).exists() or not (path / MODEL_FILE).exists():
        raise FileNotFoundError(f"{path} is not a complete lmpo checkpoint (needs {MODEL_FILE} and {STATE_FILE})")
    load_model(model, str(path / MODEL_FILE))
    if ref_model is not None and (path / REF_FILE).exists():
        load_model(ref_model, str(path / REF_FILE))
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)


def resolve_resume(resume: str | None, run_dir: str | os.PathLike) -> Path | None:
    """``--resume`` value → checkpoint path. ``auto``: the latest in run_dir (or None when there is none)."""
    if resume is None or resume is False:
        return None
    if resume in ("auto", "latest", True):
        return latest_checkpoint(run_dir)
    p = Path(resume)
    if (p / STATE_FILE).exists():
        return p
    if checkpoint_dir(p).is_dir():  # a run directory
        latest = latest_checkpoint(p)
        if latest is not None:
            return latest
    raise FileNotFoundError(f"--resume {resume!r}: not a checkpoint directory nor a run directory with "
                            "checkpoints; pass RUN_DIR/checkpoints/step_XXXXXXXX or `auto`.")
