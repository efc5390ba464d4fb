"""A run's state (:class:`TrainState`) and its checkpoints: atomic directories checked against a manifest
(:mod:`lmpo.checkpoints`).

Layout of one checkpoint (``RUN_DIR/checkpoints/step_00000012/``)::

    model.safetensors   policy parameters and buffers (safetensors; tied weights handled)
    ref.safetensors     the frozen reference model, when the run has one (so that resume needs no re-init)
    state.json          optimizer, schedule, RNG states, controller states, data position, counters …
    state.safetensors   … and the tensors among them (plain data: nothing is unpickled on load)
    config.json, generation_config.json        the model's config (a full model), so that
                        ``AutoModelForCausalLM.from_pretrained(step dir)`` loads the checkpoint as it is
    adapter_config.json, adapter_model.safetensors   a LoRA run's adapter as PEFT saves it (instead of config.json)
    tokenizer.json, tokenizer_config.json, …   the tokenizer (``AutoTokenizer.from_pretrained``)
    manifest.json       step, and the size and SHA-256 of every file above

The directory appears only once every file is complete and on disk (temporary directory + rename), and a
checkpoint whose files do not match its manifest is refused; ``--resume`` then falls back to the newest
complete one. More files may be added to a checkpoint by its writer: the manifest covers whatever the
directory holds. On resume every listed file is also checked to be plain data of its kind (JSON,
safetensors, text: :func:`lmpo.checkpoints.check_plain_files`), the Hugging Face files included.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from lmpo.checkpoints import (
    CheckpointError,
    check_plain_files,
    checkpoint_dir,
    latest_valid_checkpoint,
    list_checkpoints,
    load_state,
    save_state,
    step_of,
    verify_checkpoint,
    write_checkpoint,
)
from lmpo.errors import InputError
from lmpo.models.saving import write_hf_files

__all__ = ["MODEL_FILE", "REF_FILE", "STATE_FILE", "CheckpointError", "ResumePoint", "TrainState", "checkpoint_dir",
           "latest_checkpoint", "list_checkpoints", "load_checkpoint", "resolve_resume", "restore_rng_state",
           "rng_state", "save_checkpoint", "step_of"]


MODEL_FILE = "model.safetensors"
REF_FILE = "ref.safetensors"
STATE_NAME = "state"
STATE_FILE = f"{STATE_NAME}.json"


def latest_checkpoint(run_dir: str | os.PathLike, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint of a run (None when there is none)."""
    return latest_valid_checkpoint(run_dir, log)


def _write_files(tmp: Path, model: torch.nn.Module, state: dict, ref_model: torch.nn.Module | None) -> None:
    """Write every file of a checkpoint into ``tmp`` (a separate function so tests can interrupt it)."""
    # "format": "pt" is the metadata transformers' from_pretrained asks of a safetensors file
    save_model(model, str(tmp / MODEL_FILE), metadata={"format": "pt"})
    if ref_model is not None:
        save_model(ref_model, str(tmp / REF_FILE), metadata={"format": "pt"})
    save_state(tmp, STATE_NAME, state)


def save_checkpoint(run_dir: str | os.PathLike, step: int, model: torch.nn.Module, state: dict,
                    ref_model: torch.nn.Module | None = None, keep_last: int = 0, tokenizer=None,
                    base_model_name: str | None = None) -> Path:
    """Write checkpoint ``step`` atomically and prune to the newest ``keep_last`` (0 = keep all).

    With the model's config (and ``tokenizer``, when given) beside the weights, the checkpoint directory
    is a Hugging Face model directory too (module docstring); ``base_model_name`` goes into a LoRA adapter's
    config."""

    def write(tmp: Path) -> None:
        _write_files(tmp, model, state, ref_model)
        # model.safetensors above is the full model's weights file already (same name and tensors)
        write_hf_files(tmp, model, tokenizer, weights=False, base_model_name=base_model_name)

    return write_checkpoint(run_dir, step, write, keep_last)


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    try:
        load_model(model, str(path))
    except SafetensorError as e:
        raise CheckpointError(f"{path} is not a valid safetensors file ({e}); the checkpoint is damaged. Resume "
                              "from another checkpoint or start the run again with --overwrite.") from None
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not fit the model ({' '.join(str(e).split())[:300]}): the checkpoint "
                              "belongs to another model (model.name, model.lora). Resume with the run's own "
                              "config, or start a new run.") from None


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    ref_model: torch.nn.Module | None = None) -> dict:
    """Verify ``path`` against its manifest, load weights into ``model`` (and ``ref_model``) in place, and
    return the state dict. Raises :class:`CheckpointError` for a partial, mixed or altered checkpoint."""
    path = Path(path)
    check_plain_files(path, verify_checkpoint(path))
    if not (path / MODEL_FILE).is_file() or not (path / STATE_FILE).is_file():
        raise CheckpointError(f"{path} is not a trainer checkpoint (needs {MODEL_FILE} and {STATE_FILE}).")
    _load_weights(model, path / MODEL_FILE)
    if ref_model is not None and (path / REF_FILE).exists():
        _load_weights(ref_model, path / REF_FILE)
    state = load_state(path, STATE_NAME)
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{path / STATE_FILE} holds no trainer state (no step); the checkpoint was not "
                              "written by `lmpo train`.")
    return state


def resolve_resume(resume: str | os.PathLike | bool | None, run_dir: str | os.PathLike,
                   log: Callable[[str], None] | None = None) -> Path | None:
    """``--resume`` value → a verified checkpoint path (None when not resuming).

    ``auto`` / ``latest`` / True: the newest complete checkpoint of ``run_dir``; a run directory: its newest
    complete checkpoint; a ``step_*`` directory: that checkpoint, verified. A run with no complete checkpoint
    is an error (never a silent fresh start).
    """
    if resume is None or resume is False:
        return None
    target = Path(run_dir) if resume in ("auto", "latest", True) else Path(resume)
    if (target / STATE_FILE).exists() or (target / MODEL_FILE).exists():
        verify_checkpoint(target)
        return target
    if checkpoint_dir(target).is_dir() or (target / "config.yaml").exists():
        latest = latest_valid_checkpoint(target, log)
        if latest is not None:
            return latest
        found = list_checkpoints(target)
        if found:
            try:
                verify_checkpoint(found[-1])
            except CheckpointError as e:
                raise CheckpointError(f"--resume: none of the {len(found)} checkpoints in {checkpoint_dir(target)} "
                                      f"is complete (the newest: {e})") from None
        raise InputError(f"--resume: {str(target)!r} has no checkpoint yet (the run stopped before its first one; "
                         "see checkpoint.every_steps). Start it again with --overwrite instead of --resume.")
    raise InputError(f"--resume {str(resume)!r}: not a checkpoint directory nor a run directory with checkpoints; "
                     "pass RUN_DIR/checkpoints/step_XXXXXXXX, a run directory, or no value (the run's own "
                     "directory).")


def rng_state() -> dict:
    """The process's torch, Python and CUDA random states, as a checkpoint stores them."""
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0], "python_gauss": random.getstate()[2],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_state(rng: dict) -> None:
    """Set the random states that ``rng_state`` returned."""
    torch.set_rng_state(rng["torch"])
    random.setstate((rng["python_version"], tuple(rng["python"]), rng["python_gauss"]))
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


@dataclass(frozen=True)
class ResumePoint:
    """Where a run goes on from: after RL step ``step``, with the first ``metrics_rows`` rows of metrics.jsonl
    (None: a new run's, nothing to keep) and, under ``rollout.async_staleness``, the checkpoint's earlier weight
    versions (``async_weights``: oldest first, name → tensor; None when it has none)."""

    step: int = 0
    metrics_rows: int | None = None
    async_weights: list[dict] | None = None


@dataclass
class TrainState:
    """What a run changes as it trains, and what its checkpoints hold: the policy ``model`` (and the frozen
    ``ref_model``, saved so that a resume needs no re-initialisation), AdamW ``optimizer`` and its ``schedule``
    (``lmpo.trainer.run.optim``), the ``prompts`` cursor (``PromptOrder``), the controllers (``driver``: the
    objective driver's adaptive entropy controller; ``kl_ctrl``: the KL in the reward's), the ``nonfinite``
    counters and whether the final evaluation ran.

    ``save`` writes checkpoint ``step``: the weights, and ``state_dict`` as plain data through
    :mod:`lmpo.checkpoints` (never pickle); ``load`` restores a checkpoint into this state. Under
    ``rollout.async_staleness`` the rollout worker's ``pipeline`` draws prompts ahead of the step: the position
    saved is the one before the next step's draw, with the weight versions the next steps sample with.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Any
    prompts: Any
    driver: Any
    nonfinite: Any
    ref_model: torch.nn.Module | None = None
    kl_ctrl: Any = None
    final_eval_done: bool = False

    def state_dict(self, step: int, *, pipeline=None, metrics_rows: int = 0) -> dict:
        """What a checkpoint after RL step ``step`` holds besides the weights: optimizer, schedule, the
        controllers, prompt order, non-finite counters, random states, the metrics rows written so far."""
        return {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "controller": self.driver.state_dict()["controller"],
            # β of the KL in the reward; absent otherwise, so default checkpoints hold what they always did
            **({"kl_controller": self.kl_ctrl.state_dict()} if self.kl_ctrl is not None else {}),
            # with a rollout worker, the position before the next step's draw (prompts are drawn k steps early)
            "data": self.prompts.state_dict() if pipeline is None else pipeline.data_state(step),
            # rollout.async_staleness = k: the k weight versions before this one, which steps step+1 … step+k sample with
            **({"async": pipeline.state_dict()} if pipeline is not None else {}),
            "nonfinite": {"total": self.nonfinite.total, "in_row": self.nonfinite.in_row},
            "rng": rng_state(),
            # the metrics rows written up to this checkpoint: a resumed run cuts metrics.jsonl back to them
            "metrics_rows": metrics_rows,
            "final_eval_done": self.final_eval_done,
        }

    def save(self, run_dir: str | os.PathLike, step: int, *, pipeline=None, metrics=None, keep_last: int = 0,
             tokenizer=None, base_model_name: str | None = None) -> Path:
        """Checkpoint ``step`` into ``run_dir`` (policy, reference, tokenizer, ``state_dict``), pruned to the newest
        ``keep_last``; ``metrics`` (the run's ``MetricsLogger``) is flushed first, so that the rows the checkpoint
        counts are on disk before it is."""
        if metrics is not None:
            metrics.sync()
        state = self.state_dict(step, pipeline=pipeline, metrics_rows=metrics.rows if metrics is not None else 0)
        return save_checkpoint(run_dir, step, self.model, state, ref_model=self.ref_model, keep_last=keep_last,
                               tokenizer=tokenizer, base_model_name=base_model_name)

    def load(self, path: Path, *, total_optimizer_steps: int, log: Callable[[str], None],
             fall_back: bool = False) -> ResumePoint:
        """Load checkpoint ``path`` into this state (weights, then ``state_dict``'s parts) and say so with ``log``;
        returns where the run goes on from. A state that does not fit the run is a CheckpointError naming the fix.
        ``total_optimizer_steps``: the schedule's length now (a run may be extended with more ``loop.steps``).

        ``fall_back`` (``path`` is the run's newest complete checkpoint, not one the user named): a checkpoint that
        passes its manifest but does not load (a file damaged before the manifest was written, a state that does
        not read) is reported with a ``warning:`` line naming it, and the next older checkpoint is tried; when none
        loads, the newest one's error is raised."""
        older = []
        if fall_back and step_of(path) is not None:
            older = [p for p in reversed(list_checkpoints(path.parent.parent)) if step_of(p) < step_of(path)]
        candidates, first = [Path(path), *older], None
        for i, candidate in enumerate(candidates):
            try:
                return self._restore(candidate, total_optimizer_steps, log)
            except CheckpointError as e:
                first = first or e
                if i + 1 < len(candidates):
                    log(f"warning: checkpoint {candidate} cannot be resumed from ({e}); trying the previous one.")
                elif older:
                    raise CheckpointError(f"{first} (no older checkpoint of the run loads either)") from None
                else:
                    raise
        raise AssertionError("unreachable: the last candidate returns or raises")

    def _restore(self, path: Path, total_optimizer_steps: int, log: Callable[[str], None]) -> ResumePoint:
        state = load_checkpoint(path, self.model, ref_model=self.ref_model)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.schedule.load_state_dict(state["schedule"])
            self.schedule.total_steps = total_optimizer_steps
            self.driver.load_state_dict({"controller": state.get("controller")})
            if self.kl_ctrl is not None and state.get("kl_controller") is not None:
                self.kl_ctrl.load_state_dict(state["kl_controller"])
            self.prompts.load_state_dict(state["data"])
            self.nonfinite.total = int(state["nonfinite"]["total"])
            self.nonfinite.in_row = int(state["nonfinite"]["in_row"])
            restore_rng_state(state["rng"])
            self.final_eval_done = bool(state.get("final_eval_done", False))
            held = state.get("async")
            log(f"resumed from {path} at step {int(state['step'])}")
            return ResumePoint(int(state["step"]), int(state.get("metrics_rows", 0)),
                               None if held is None else [dict(w) for w in held["weights"]])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path}: its state does not fit this run ({type(e).__name__}: "
                                  f"{' '.join(str(e).split())[:200]}); it was written by another kind of run "
                                  "(objective, optimizer, model). Resume with the run's own config.") from None
