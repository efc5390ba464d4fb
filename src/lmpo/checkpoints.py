"""Checkpoints as atomic directories of plain data, checked against a manifest before anything is loaded.

Used by the trainer (``lmpo train``) and the SAC agent (``lmpo sac train``). A checkpoint is a directory
``RUN_DIR/checkpoints/step_XXXXXXXX/`` holding whatever files its writer puts there (weights, state, later
config and tokenizer files) plus ``manifest.json``::

    {"format": "lmpo-checkpoint", "version": 1, "step": 12,
     "files": {"model.safetensors": {"bytes": 50312, "sha256": "…"}, "state.json": {…}, …}}

Writing (:func:`write_checkpoint`): every file goes into a hidden temporary directory beside the final one
and is flushed to disk (fsync); the manifest is written last, from the bytes on disk; then one rename makes
the checkpoint appear and the parent directory is synced. A kill at any moment leaves either the complete
new checkpoint or none of it (a ``.tmp_*`` directory that the next start removes, :func:`remove_stale`).

Loading (:func:`verify_checkpoint`): the manifest must exist, name the directory's step, and every file it
lists must be present with its size and SHA-256. A partial checkpoint, a file from another checkpoint or a
replaced file is refused with a message; :func:`latest_valid_checkpoint` then falls back to the newest
checkpoint that passes.

State (:func:`save_state` / :func:`load_state`): optimizer states, RNG states, counters, replay buffers and
environment state are written as ``NAME.json`` (the structure, numbers and strings) plus
``NAME.safetensors`` (every tensor and array). Neither format can run code when read; nothing lmpo loads
from a run directory goes through pickle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from lmpo.errors import InputError

MANIFEST = "manifest.json"
FORMAT = "lmpo-checkpoint"
VERSION = 1
TEMP_PREFIX = ".tmp_"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(InputError):
    """A checkpoint that is incomplete, mixed, altered or not written by lmpo (the message says which)."""


# ----------------------------------------------------------------------------------------------------
# Durable files
# ----------------------------------------------------------------------------------------------------


def _default_file_mode() -> int:
    """What ``open(path, "w")`` would give a new file here (0o666 minus the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry (a rename or a new file) to disk; a no-op where directories cannot be opened."""
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


def write_bytes(path: str | os.PathLike, data: bytes, sync: bool = True) -> None:
    """Write ``data`` to ``path`` (and, with ``sync``, flush it to disk before returning). A symbolic link at
    ``path`` is an OSError (ELOOP), not followed: these are files of a run directory (``lmpo.runs``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())


def write_json(path: str | os.PathLike, obj: Any, sync: bool = True) -> None:
    # no indent: json's C encoder only runs without one (a SAC state is ~10^5 values)
    write_bytes(path, (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"), sync)


def replace_file(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temporary file beside it, fsync, rename, sync the folder)."""
    path = Path(path)
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    write_bytes(tmp, data)
    os.chmod(tmp, _default_file_mode())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------
# Plain-data state: NAME.json (structure) + NAME.safetensors (tensors and arrays)
# ----------------------------------------------------------------------------------------------------


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"{where}: numpy arrays of dtype {obj.dtype} cannot be saved as plain data")
        key = f"t{len(tensors)}"
        raw = np.ascontiguousarray(obj).tobytes()
        tensors[key] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return {"__ndarray__": key, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"{where}: numpy scalars of dtype {obj.dtype} cannot be saved as plain data")
        return {"__npscalar__": obj.dtype.str, "value": obj.item()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")]
                              for k, v in obj.items()]}
    raise TypeError(f"{where}: a {type(obj).__name__} cannot be saved as plain data")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        dtype = np.dtype(str(obj["dtype"]))
        if dtype.kind not in "biuf":
            raise ValueError(f"{where}: array dtype {dtype} is not plain numeric data")
        raw = tensors[obj["__ndarray__"]].numpy().tobytes()
        return np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in obj["shape"]]).copy()
    if "__npscalar__" in obj:
        dtype = np.dtype(str(obj["__npscalar__"]))
        if dtype.kind not in "biuf":
            raise ValueError(f"{where}: scalar dtype {dtype} is not plain numeric data")
        return dtype.type(obj["value"])
    if "__bytes__" in obj:
        return base64.b64decode(obj["__bytes__"])
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors, where) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_freeze(_decode(k, tensors, where)): _decode(v, tensors, where) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors, f"{where}.{k}") for k, v in obj.items()}


def _freeze(key: Any) -> Any:
    return tuple(_freeze(k) for k in key) if isinstance(key, (list, tuple)) else key


def save_state(directory: str | os.PathLike, name: str, state: Any, sync: bool = False) -> list[str]:
    """Write ``state`` (dicts, lists, tuples, numbers, strings, tensors, numpy arrays and scalars) as
    ``NAME.json`` + ``NAME.safetensors`` in ``directory``; returns the file names. Not flushed to disk unless
    ``sync``: :func:`write_checkpoint` syncs every file of a checkpoint once, before publishing it."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(state, tensors, name)
    directory = Path(directory)
    write_bytes(directory / f"{name}.safetensors", _st_save(tensors), sync)
    write_json(directory / f"{name}.json", {"format": "lmpo-state", "version": VERSION, "state": structure}, sync)
    return [f"{name}.json", f"{name}.safetensors"]


def load_state(directory: str | os.PathLike, name: str) -> Any:
    """Read what :func:`save_state` wrote. Raises :class:`CheckpointError` for anything else."""
    directory = Path(directory)
    jpath, tpath = directory / f"{name}.json", directory / f"{name}.safetensors"
    try:
        doc = json.loads(jpath.read_bytes().decode("utf-8"))
        tensors = _st_load(tpath.read_bytes())
        if not isinstance(doc, dict) or doc.get("format") != "lmpo-state":
            raise ValueError("not an lmpo state file")
        return _decode(doc["state"], tensors, name)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"{jpath} (with {tpath.name}) cannot be read as lmpo state: {type(e).__name__}: "
                              f"{_short(e)}. The checkpoint is damaged or was not written by lmpo; resume from "
                              "another checkpoint or start the run again with --overwrite.") from None
    except SafetensorError as e:
        raise CheckpointError(f"{tpath} is not a valid safetensors file ({_short(e)}). The checkpoint is "
                              "damaged or was not written by lmpo; resume from another checkpoint or start the "
                              "run again with --overwrite.") from None


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] + ("…" if len(text) > 200 else "")


# ----------------------------------------------------------------------------------------------------
# Checkpoint directories
# ----------------------------------------------------------------------------------------------------


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def step_of(path: str | os.PathLike) -> int | None:
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``step_*`` checkpoint directories of a run, oldest first (not verified; see :func:`verify_checkpoint`)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: step_of(p))  # type: ignore[arg-type, return-value]


def remove_stale(run_dir: str | os.PathLike) -> list[Path]:
    """Delete temporary files and directories a killed writer left in the run and checkpoint folders."""
    removed = []
    for folder in (Path(run_dir), checkpoint_dir(run_dir)):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.name.startswith(TEMP_PREFIX):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def _manifest(tmp: Path, step: int) -> dict:
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    return {"format": FORMAT, "version": VERSION, "step": step, "files": files}


def write_checkpoint(run_dir: str | os.PathLike, step: int, write_files: Callable[[Path], None],
                     keep_last: int = 0) -> Path:
    """Create checkpoint ``step`` atomically: ``write_files(tmp_dir)`` writes its files, then the manifest is
    added and the directory renamed into place. Older checkpoints beyond the newest ``keep_last`` are
    removed afterwards (0 = keep all). Returns the checkpoint's path."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = publish_directory(root / f"step_{step:08d}", step, write_files)
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            # renamed first, so that a kill during the deletion never leaves a half-deleted step_* directory
            doomed = root / f"{TEMP_PREFIX}del_{old.name}_{os.getpid()}"
            os.replace(old, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        fsync_dir(root)
    return final


def publish_directory(final: str | os.PathLike, step: int, write_files: Callable[[Path], None],
                      manifest: bool = True) -> Path:
    """Create directory ``final`` atomically (a checkpoint, or a run's final ``model/``): ``write_files(tmp)``
    writes into a hidden temporary directory beside it, every file is synced, the manifest (with ``manifest``)
    is written last, and one rename publishes it; an existing ``final`` is swapped out. Returns ``final``."""
    final = Path(final)
    root = final.parent
    tmp = root / f"{TEMP_PREFIX}{final.name}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write_files(tmp)
        mode = _default_file_mode()
        for p in tmp.rglob("*"):
            if p.is_file():
                os.chmod(p, mode)  # every file of a checkpoint gets the same permissions (safetensors: 0600)
                fsync_file(p)
        if manifest:
            write_json(tmp / MANIFEST, _manifest(tmp, step))
            os.chmod(tmp / MANIFEST, mode)
        fsync_dir(tmp)
        if final.exists():  # re-writing a step (e.g. the final checkpoint after a resume): swap
            old = root / f"{TEMP_PREFIX}old_{final.name}_{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def verify_checkpoint(path: str | os.PathLike) -> dict:
    """Check a checkpoint directory against its manifest; return the manifest or raise CheckpointError."""
    path = Path(path)
    fix = "Resume from another checkpoint (the newest complete one is used by default) or start the run " \
          "again with --overwrite."
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory. {fix}")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}: it is incomplete, or not an lmpo checkpoint "
                              f"(or written by an lmpo version before manifests). {fix}")
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
        files = manifest["files"]
        step = int(manifest["step"])
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError("not an lmpo checkpoint manifest")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} cannot be read ({_short(e)}). {fix}") from None
    expected_step = step_of(path)
    if expected_step is not None and expected_step != step:
        raise CheckpointError(f"checkpoint {path}: its manifest is for step {step}, not {expected_step} (files "
                              f"from two checkpoints are mixed). {fix}")
    for name, info in files.items():
        f = path / name
        if ".." in Path(name).parts or not f.is_file():
            raise CheckpointError(f"checkpoint {path}: file {name} listed in its manifest is missing. {fix}")
        if f.stat().st_size != int(info["bytes"]) or sha256_file(f) != info["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its manifest (size or SHA-256): the "
                                  f"file was changed, truncated or copied from another checkpoint. {fix}")
    return manifest


#: files whose format :func:`check_plain_files` checks (anything else is opaque data lmpo never parses itself)
_TEXT_SUFFIXES = (".jinja", ".txt", ".md", ".yaml", ".yml")


def check_plain_files(path: str | os.PathLike, manifest: dict | None = None) -> None:
    """Check that every file a manifest lists is plain data of the kind its name says: ``.json`` parses as
    JSON, ``.safetensors`` has a valid safetensors header, ``.jinja`` / ``.txt`` / ``.md`` / ``.yaml`` are
    UTF-8 text. A checkpoint or model directory holds config, tokenizer and generation files that lmpo does
    not read on resume but ``from_pretrained`` would; this refuses a planted or damaged one before any loader
    sees it. Raises :class:`CheckpointError` naming the file."""
    from safetensors import safe_open

    path = Path(path)
    manifest = manifest if manifest is not None else verify_checkpoint(path)
    for name in manifest["files"]:
        f = path / name
        try:
            if name.endswith(".json"):
                json.loads(f.read_bytes().decode("utf-8"))
            elif name.endswith(".safetensors"):
                with safe_open(str(f), framework="pt") as fh:
                    fh.keys()
            elif name.endswith(_TEXT_SUFFIXES):
                f.read_bytes().decode("utf-8")
        except (ValueError, OSError, RecursionError, SafetensorError) as e:
            kind = "JSON" if name.endswith(".json") else "safetensors" if name.endswith(".safetensors") else "text"
            raise CheckpointError(f"{path}: {name} is not valid {kind} ({_short(e)}): the directory is damaged "
                                  "or holds a file not written by lmpo. Use another checkpoint, or write the model "
                                  "again (start the run again with --overwrite).") from None


def latest_valid_checkpoint(run_dir: str | os.PathLike, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest checkpoint of ``run_dir`` that passes :func:`verify_checkpoint` (None when there is none);
    each newer one that fails is reported through ``log`` and skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            if log is not None:
                log(f"skipping {path.name}: {e}")
            continue
        return path
    return None
