"""Writing a model as Hugging Face ``from_pretrained`` reads it: config, weights, generation config, tokenizer.

:func:`write_hf_files` is what checkpoints, a run's final ``model/`` directory and ``lmpo export`` put on disk:

- a full model: ``config.json``, ``generation_config.json`` and (with ``weights``) ``model.safetensors`` —
  ``AutoModelForCausalLM.from_pretrained(dir)`` loads it;
- a PEFT (LoRA) model: the adapter as PEFT saves it, ``adapter_config.json`` + ``adapter_model.safetensors``
  (``PeftModel.from_pretrained(base, dir)``; ``lmpo export --merge`` writes the merged full model instead);
- the tokenizer with ``save_pretrained``; lmpo's :class:`~lmpo.models.tokenizer.CharTokenizer` is converted to
  a ``PreTrainedTokenizerFast`` with the same ids first, so ``AutoTokenizer.from_pretrained(dir)`` loads it
  without lmpo installed.

Every file is JSON, safetensors or text (a chat template): nothing here writes or reads pickle.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
HF_WEIGHTS = "model.safetensors"


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def hf_tokenizer(tokenizer):
    """``tokenizer`` in a form ``AutoTokenizer.from_pretrained`` can load (a CharTokenizer becomes fast)."""
    from lmpo.models.tokenizer import CharTokenizer

    return tokenizer.to_fast() if isinstance(tokenizer, CharTokenizer) else tokenizer


def write_adapter(directory: str | Path, model: torch.nn.Module, base_model_name: str | None = None) -> list[str]:
    """The active adapter of a PEFT model as ``PeftModel.save_pretrained`` writes it (without its model card):
    ``adapter_config.json`` (inference mode) and ``adapter_model.safetensors``."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    directory = Path(directory)
    name = getattr(model, "active_adapter", "default")
    state = get_peft_model_state_dict(model, adapter_name=name)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(directory / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True
    if base_model_name:
        config.base_model_name_or_path = base_model_name
    config.save_pretrained(str(directory))
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]


def write_hf_files(directory: str | Path, model: torch.nn.Module, tokenizer=None, *, weights: bool = True,
                   base_model_name: str | None = None) -> None:
    """Write ``model`` (and ``tokenizer``) into ``directory`` as described in the module docstring.

    ``weights=False`` leaves out a full model's ``model.safetensors`` (a checkpoint writes its own, the same
    tensors, for resuming). ``base_model_name`` goes into a LoRA adapter's config (the model it adapts).
    """
    from safetensors.torch import save_model

    directory = Path(directory)
    if is_peft_model(model):
        write_adapter(directory, model, base_model_name)
        base = model.get_base_model()
        if base.generation_config is not None:
            base.generation_config.save_pretrained(str(directory))
    else:
        model.config.save_pretrained(str(directory))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(directory))
        if weights:
            # the format key is what transformers checks; tied weights are stored once and restored on load
            save_model(model, str(directory / HF_WEIGHTS), metadata={"format": "pt"})
    if tokenizer is not None:
        hf_tokenizer(tokenizer).save_pretrained(str(directory))
