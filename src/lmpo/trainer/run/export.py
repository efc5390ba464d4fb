"""``lmpo export RUN [--step N] OUT [--merge]``: a run's policy as a Hugging Face model directory.

A run directory (``lmpo train``) holds its policy in two places, both Hugging Face model directories as well
as lmpo's own (:mod:`lmpo.models.saving`): ``RUN/model/`` (written when the run finishes,
``checkpoint.final_model``) and every checkpoint ``RUN/checkpoints/step_XXXXXXXX/``. ``lmpo export`` copies
one of them (the latest checkpoint by default, or ``--step N``) into ``OUT`` as ``save_pretrained`` writes it:
``config.json``, ``model.safetensors``, ``generation_config.json`` and the tokenizer, which
``AutoModelForCausalLM.from_pretrained(OUT)`` / ``AutoTokenizer.from_pretrained(OUT)`` load. A LoRA run
exports its adapter (``adapter_config.json`` + ``adapter_model.safetensors``, for ``PeftModel.from_pretrained``);
with ``--merge`` it exports the base model with the adapter merged in, a full model.

Every source directory is checked against its manifest and for plain data (:func:`lmpo.checkpoints.check_plain_files`)
before anything in it is loaded. ``lmpo eval RUN`` loads a run's policy the same way (:func:`load_run_policy`).

Imports sit inside the functions on purpose: ``lmpo --help`` imports this module to build its parser and
must not pay for torch, transformers and the models (``lmpo.cli``'s docstring).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lmpo.errors import InputError

FINAL_MODEL_DIR = "model"


def is_run_dir(path: str | os.PathLike) -> bool:
    """A directory written by ``lmpo train``: its ``config.yaml`` and a ``model/`` or ``checkpoints/`` folder."""
    p = Path(path)
    return (p / "config.yaml").is_file() and ((p / FINAL_MODEL_DIR).is_dir() or (p / "checkpoints").is_dir())


def run_config(run: str | os.PathLike):
    """The ``TrainConfig`` a run stored in its ``config.yaml`` (read as plain YAML)."""
    from lmpo.trainer.config import load_config

    return load_config(Path(run) / "config.yaml")


def _steps_text(run: Path) -> str:
    from lmpo.checkpoints import list_checkpoints, step_of

    steps = [str(step_of(p)) for p in list_checkpoints(run)]
    model = " and model/" if (run / FINAL_MODEL_DIR).is_dir() else ""
    return f"checkpoint steps {', '.join(steps)}{model}" if steps else (f"only{model}" if model else "nothing")


def resolve_source(run: str | os.PathLike, step: int | None = None, *, prefer_final: bool = False) -> Path:
    """The directory of ``run`` that holds the policy to load: checkpoint ``step``; by default the newest
    complete checkpoint (``prefer_final``: ``RUN/model/``, unless a newer checkpoint exists). Verified against its
    manifest and checked for plain data; raises :class:`InputError` naming what the run holds."""
    from lmpo.checkpoints import (
        CheckpointError,
        check_plain_files,
        latest_valid_checkpoint,
        list_checkpoints,
        step_of,
        verify_checkpoint,
    )

    run = Path(run)
    if not run.exists():
        raise InputError(f"run directory {str(run)!r} does not exist; give a directory written by "
                         "`lmpo train` (its logging.run_dir).")
    if (run / "config.yaml").is_file() and not is_run_dir(run):
        raise InputError(f"run {str(run)!r} has no checkpoint and no model/ yet (the run stopped before its first "
                         "checkpoint, see checkpoint.every_steps); continue it with `lmpo train --resume`.")
    if not is_run_dir(run):
        raise InputError(f"{str(run)!r} is not a run directory (it needs the config.yaml and the model/ or "
                         "checkpoints/ folder that `lmpo train` writes); give the run's logging.run_dir.")
    if step is not None:
        source = run / "checkpoints" / f"step_{step:08d}"
        if not source.is_dir():
            raise InputError(f"run {str(run)!r} has no checkpoint of step {step}; it holds "
                             f"{_steps_text(run)}. Give one of those with --step, or leave --step out for the "
                             "newest.")
    else:
        final = run / FINAL_MODEL_DIR
        source = latest_valid_checkpoint(run)
        if prefer_final and final.is_dir():
            # model/ (a damaged one is reported, not skipped) unless a newer checkpoint exists: a finished run
            # extended with more steps, then stopped
            if source is None or int(verify_checkpoint(final)["step"]) >= (step_of(source) or 0):
                source = final
        if source is None:
            found = list_checkpoints(run)
            if (final / "manifest.json").is_file():
                source = final
            elif found:
                try:
                    verify_checkpoint(found[-1])
                except CheckpointError as e:
                    raise CheckpointError(f"run {str(run)!r} holds no complete checkpoint and no model/: none of its "
                                          f"{len(found)} checkpoints passes its manifest check (the newest: {e})"
                                          ) from None
            else:
                raise InputError(f"run {str(run)!r} holds no complete checkpoint and no model/ (it holds "
                                 f"{_steps_text(run)}); the run stopped before its first checkpoint "
                                 "(checkpoint.every_steps). Continue it with `lmpo train --resume`.")
    check_plain_files(source, verify_checkpoint(source))
    return source


def load_policy(source: Path, cfg, *, merge: bool = True, device: str = "cpu"):
    """``(model, tokenizer)`` from a verified source directory of a run with config ``cfg``.

    A full model loads with ``AutoModelForCausalLM.from_pretrained(source)``. A LoRA adapter is put on the
    run's base model (``model.name``, built as the trainer built it) and, with ``merge``, merged into it.
    """
    from lmpo.models import load_model_and_tokenizer, load_tokenizer
    from lmpo.models.saving import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    tokenizer = load_tokenizer(str(source)) if (source / "tokenizer_config.json").is_file() else None
    if (source / ADAPTER_CONFIG).is_file():
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        base, base_tokenizer = load_model_and_tokenizer(cfg.model.name, dtype=cfg.model.dtype, device="cpu",
                                                        seed=cfg.model.init_seed)
        lc = cfg.model.lora
        model = get_peft_model(base, PeftLoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                                                    target_modules=list(lc.target_modules), task_type="CAUSAL_LM"))
        result = set_peft_model_state_dict(model, load_file(str(source / ADAPTER_WEIGHTS)))
        if getattr(result, "unexpected_keys", None):
            raise InputError(f"{source / ADAPTER_WEIGHTS} does not fit the run's LoRA config (model.lora): "
                             f"unexpected {sorted(result.unexpected_keys)[:3]}. Export with the run's own "
                             "config.yaml.")
        if merge:
            model = model.merge_and_unload()
        tokenizer = tokenizer or base_tokenizer
    elif (source / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        from lmpo.models.loading import hf_progress_bars_only_on_a_terminal

        hf_progress_bars_only_on_a_terminal()
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype="auto")
        tokenizer = tokenizer or load_tokenizer(cfg.model.name)
    else:  # a checkpoint written before checkpoints held config.json: the run's model with its weights
        from lmpo.trainer.run.state import MODEL_FILE, _load_weights

        model, base_tokenizer = load_model_and_tokenizer(cfg.model.name, dtype=cfg.model.dtype, device="cpu",
                                                         seed=cfg.model.init_seed)
        _load_weights(model, source / MODEL_FILE)
        tokenizer = tokenizer or base_tokenizer
    if tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device), tokenizer


def load_run_policy(run: str | os.PathLike, step: int | None = None, *, merge: bool = True, device: str = "cpu"):
    """``(model, tokenizer, source directory, run config)`` of a run: ``RUN/model/`` if the run finished,
    else its newest complete checkpoint (or checkpoint ``step``); LoRA adapters merged unless ``merge=False``."""
    source = resolve_source(run, step, prefer_final=step is None)
    cfg = run_config(run)
    model, tokenizer = load_policy(source, cfg, merge=merge, device=device)
    return model, tokenizer, source, cfg


def publish_final_model(run_dir: str | os.PathLike, step: int, model, tokenizer, *,
                        base_model_name: str | None = None) -> Path:
    """RUN_DIR/model/ after RL step ``step``: the policy as ``save_pretrained`` writes it (a LoRA run: its
    adapter), with the tokenizer; published atomically with a manifest like a checkpoint (:mod:`lmpo.checkpoints`)."""
    from lmpo.checkpoints import publish_directory
    from lmpo.models.saving import write_hf_files

    return publish_directory(Path(run_dir) / FINAL_MODEL_DIR, step, lambda tmp: write_hf_files(
        tmp, model, tokenizer, base_model_name=base_model_name))


def export_run(run: str | os.PathLike, out: str | os.PathLike, step: int | None = None, *, merge: bool = False,
               log=print) -> Path:
    """Write the policy of ``run`` (checkpoint ``step``, default the newest) to ``out`` (see module docstring)."""
    from lmpo.checkpoints import publish_directory
    from lmpo.models.saving import is_peft_model, write_hf_files

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"output {str(out)!r} already exists and is not an empty directory; choose "
                         "a new path (export never overwrites files).")
    source = resolve_source(run, step)
    cfg = run_config(run)
    model, tokenizer = load_policy(source, cfg, merge=merge)
    lora = is_peft_model(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    publish_directory(out, 0, lambda tmp: write_hf_files(tmp, model, tokenizer, base_model_name=cfg.model.name),
                      manifest=False)
    kind = ("the LoRA adapter (PeftModel.from_pretrained(base, OUT); --merge for a full model)" if lora else
            "a full model (AutoModelForCausalLM.from_pretrained(OUT))")
    log(f"lmpo export: {source} -> {out}: {kind}")
    return out


def register_export(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="write a run's policy as a Hugging Face model directory (from_pretrained)",
        description="Write the policy of RUN (a directory written by `lmpo train`) to OUT as `save_pretrained` "
                    "does: config, weights, generation config and tokenizer, loadable with "
                    "`AutoModelForCausalLM.from_pretrained(OUT)`. Default: the newest complete checkpoint. A LoRA "
                    "run exports its PEFT adapter, or with --merge the base model with the adapter merged in.",
    )
    p.add_argument("run", metavar="RUN", help="run directory (logging.run_dir of `lmpo train`)")
    p.add_argument("out", metavar="OUT", help="new output directory")
    p.add_argument("--step", type=int, default=None, help="export checkpoint step N (default: the newest)")
    p.add_argument("--merge", action="store_true", help="LoRA runs: merge the adapter into the base model")
    p.set_defaults(func=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    export_run(args.run, args.out, args.step, merge=args.merge)
    return 0
