"""``VLLMRollout``: generation by vLLM colocated with the training model on one GPU (``rollout.engine: vllm``).

The engine runs vLLM in the trainer's own process (``distributed_executor_backend="external_launcher"``, as
TRL's colocate mode does) next to the training model on the same GPU, and keeps its own copy of the weights:

- construction writes the policy's config and current weights to a temporary directory for vLLM to load
  (vLLM loads models from files; prompts are passed as token ids, so no tokenizer files are needed);
- ``sync_weights(model)`` (called by the trainer after its optimizer steps, before the next generation)
  copies every parameter into vLLM's model with its ``load_weights``, LoRA adapters merged first, and resets
  vLLM's prefix cache (it holds keys/values of the old weights); with ``lora_sync="adapter"`` a LoRA policy's
  adapter alone is handed over instead (vLLM serves it on top of the base weights it loaded once, as a new
  ``LoRARequest`` per sync): megabytes per step instead of the whole model, and no merge/unmerge;
- ``generate`` sends each prompt once with ``n = G`` and returns a ``Rollout`` whose ``logprobs`` are vLLM's
  sampler log-probs of the sampled tokens in ``processed_logprobs`` mode: ``log softmax(logits / τ)``, the
  distribution the trainer's log-probs use, when top-k / top-p are off (with them on, vLLM reports the
  filtered, renormalised distribution).

Needs the ``vllm`` package (``pip install 'lmpo[vllm]'``) and a CUDA GPU; the HF engine stays the default.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lmpo.errors import InputError
from lmpo.generation.rollout import Rollout, SamplingEngine, completion_mask


def vllm_named_weights(model: nn.Module):
    """``(name, tensor)`` of every parameter under the names of the plain Hugging Face model.

    A PEFT model must have its adapters merged (``merge_adapter``) while this is read: the adapter tensors
    are skipped and ``base_model.model.`` / ``.base_layer`` are removed from the names, as vLLM knows only
    the base architecture.
    """
    prefix = getattr(model, "prefix", None)  # PEFT's adapter parameter marker, e.g. "lora_"
    for name, param in model.named_parameters():
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if prefix and prefix in name or "original_module" in name:
            continue
        yield name.replace("modules_to_save.default.", ""), param.data


def adapter_snapshot(model: nn.Module, root: str | os.PathLike, version: int) -> Path:
    """Write a PEFT model's trainable adapter to ``root/v{version}`` (``adapter_config.json`` and
    ``adapter_model.safetensors``, as ``save_pretrained`` writes them: the adapter tensors only, no base
    weights) and delete the older versions under ``root``; returns the new directory."""
    root = Path(root)
    path = root / f"v{version}"
    model.save_pretrained(str(path))
    for old in root.iterdir():
        if old != path and old.name.startswith("v"):
            shutil.rmtree(old, ignore_errors=True)
    return path


def check_adapter_syncable(model: nn.Module) -> int:
    """The LoRA rank of a PEFT policy whose adapter vLLM can serve alone; an InputError naming what is wrong
    otherwise (not a PEFT model, several adapters, or parameters trained outside the adapter)."""
    config = getattr(model, "peft_config", None)
    if not config:
        raise InputError("rollout.vllm_lora_sync = 'adapter' needs a LoRA policy (model.lora.enabled: true); "
                         "this policy has no adapter. Use vllm_lora_sync: merged for a full model.")
    if len(config) != 1:
        raise InputError(f"rollout.vllm_lora_sync = 'adapter' serves one adapter; the policy has {len(config)} "
                         f"({sorted(config)}). Keep one adapter or use vllm_lora_sync: merged.")
    (adapter,) = config.values()
    if getattr(adapter, "modules_to_save", None):
        raise InputError(f"rollout.vllm_lora_sync = 'adapter': the policy also trains {adapter.modules_to_save} "
                         "outside its adapter, which vLLM would not see; use vllm_lora_sync: merged.")
    return int(adapter.r)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_rollout(outputs, prompts: Sequence[str], prompt_ids: list[list[int]], completions_per_prompt: int,
               tokenizer, eos_ids: Sequence[int], ignore_eos: bool, with_logprobs: bool) -> Rollout:
    """vLLM ``RequestOutput`` s (one per prompt, ``n = G`` completions each) -> a padded ``Rollout``.

    Reads only ``outputs[i].outputs[j].token_ids``, ``.logprobs`` (one ``{token_id: Logprob}`` per position)
    and ``.finish_reason``.
    """
    G, pad = completions_per_prompt, tokenizer.pad_token_id
    rows, lps, finished = [], [], []
    for out in outputs:
        if len(out.outputs) != G:
            raise RuntimeError(f"vLLM returned {len(out.outputs)} completions for a prompt, expected {G}")
        for c in out.outputs:
            ids = list(c.token_ids)
            rows.append(ids)
            finished.append(c.finish_reason == "stop" and not ignore_eos)
            if with_logprobs:
                if c.logprobs is None:
                    raise RuntimeError("vLLM returned no logprobs although SamplingParams.logprobs=0 was set")
                lps.append([float(step[tok].logprob) for tok, step in zip(ids, c.logprobs)])
    B, P = len(rows), max(len(p) for p in prompt_ids)
    T = max(1, max(len(r) for r in rows))
    completion_ids = torch.full((B, T), pad, dtype=torch.long)
    logprobs = torch.zeros(B, T, dtype=torch.float32) if with_logprobs else None
    for i, ids in enumerate(rows):
        completion_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        if with_logprobs:
            logprobs[i, : len(ids)] = torch.tensor(lps[i], dtype=torch.float32)
    mask = completion_mask(completion_ids, eos_ids, ignore_eos)
    if not ignore_eos:  # a completion vLLM cut at max_tokens counts its length in full, one that stopped ends at EOS
        lengths = torch.tensor([len(r) for r in rows])
        mask = mask * (torch.arange(T)[None, :] < lengths[:, None]).long()
    completion_ids = completion_ids.masked_fill(mask == 0, pad)
    if logprobs is not None:
        logprobs = logprobs.masked_fill(mask == 0, 0.0)
    prompt_tensor = torch.full((B, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for i, ids in enumerate(prompt_ids):
        for r in range(i * G, (i + 1) * G):
            prompt_tensor[r, P - len(ids):] = torch.tensor(ids, dtype=torch.long)
            prompt_mask[r, P - len(ids):] = 1
    texts = tokenizer.batch_decode([r[: int(n)] for r, n in zip(completion_ids.tolist(), mask.sum(-1).tolist())],
                                   skip_special_tokens=True)
    return Rollout(
        prompt_ids=prompt_tensor, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=mask,
        group_ids=torch.arange(len(prompt_ids)).repeat_interleave(G), prompts=[p for p in prompts for _ in range(G)],
        completions=texts, truncated=~torch.tensor(finished, dtype=torch.bool), logprobs=logprobs,
    )


class VLLMRollout(SamplingEngine):
    """Sampling by vLLM in this process, on the training model's GPU (see the module docstring).

    Args:
        model, tokenizer: the training policy (its weights are copied into vLLM now and at every
            ``sync_weights``) and its tokenizer (used to encode prompts and decode completions).
        max_new_tokens, temperature, top_p, top_k, ignore_eos: as for ``HFRollout``.
        record_logprobs: return vLLM's sampler log-probs as ``Rollout.logprobs`` (on by default: vLLM
            computes them anyway).
        gpu_memory_utilization: fraction of the GPU vLLM may take for weights and KV cache (the rest is left
            to training).
        max_model_len: longest prompt + completion vLLM must hold (default: the model's context).
        seed: seed of vLLM's engine; each ``generate`` call also seeds its requests from its own seed.
        lora_sync: ``"merged"`` (default: the adapters merged into the base weights, which are copied) or
            ``"adapter"`` (a LoRA policy: vLLM loads the base weights once and receives only the adapter at
            each ``sync_weights``, through a directory of its files; ``enable_lora`` with the adapter's rank).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        ignore_eos: bool = False,
        record_logprobs: bool = True,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        seed: int = 0,
        lora_sync: str = "merged",
    ) -> None:
        super().__init__(model, tokenizer, max_new_tokens, temperature, top_p, top_k, ignore_eos, record_logprobs)
        if lora_sync not in ("merged", "adapter"):
            raise InputError(f"rollout.vllm_lora_sync = {lora_sync!r}: use 'merged' or 'adapter'.")
        lora_rank = check_adapter_syncable(model) if lora_sync == "adapter" else None
        try:
            import vllm
        except ImportError as e:
            raise InputError("rollout.engine = 'vllm' needs the vLLM package, which is not installed: "
                             "`pip install 'lmpo[vllm]'` (Linux with a CUDA GPU), or use rollout.engine: hf.") from e
        if not torch.cuda.is_available():
            raise InputError("rollout.engine = 'vllm' needs a CUDA GPU and none is visible (torch.cuda.is_available() "
                             "is False); use rollout.engine: hf on this machine.")
        self._vllm = vllm
        self.lora_sync = lora_sync
        self._lora_version = 0
        self._lora_request = None
        self._dir = tempfile.TemporaryDirectory(prefix="lmpo_vllm_")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # the config and the base weights under the plain model's names (a LoRA policy's adapter tensors left out:
        # merged into the weights by sync_weights, or served on their own with lora_sync="adapter")
        base.save_pretrained(self._dir.name, state_dict={n: t.contiguous() for n, t in vllm_named_weights(model)})
        # one process, one GPU: vLLM's worker runs here, set up as rank 0 of a world of one
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(_free_port()))):
            os.environ.setdefault(key, value)
        self.llm = vllm.LLM(
            model=self._dir.name,
            skip_tokenizer_init=True,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            distributed_executor_backend="external_launcher",
            seed=seed,
            logprobs_mode="processed_logprobs",  # after temperature: the trainer's softmax(logits / τ)
            **({"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 1} if lora_rank else {}),
        )
        self.sync_weights(model)

    def sync_weights(self, model: nn.Module) -> None:
        """Copy the policy's current weights into vLLM (adapters merged; with ``lora_sync="adapter"`` the
        adapter alone, as a new LoRA request) and drop its cached prefixes."""
        self.model = model
        if self.lora_sync == "adapter":
            from vllm.lora.request import LoRARequest  # vLLM is optional: imported only where it is used

            self._lora_version += 1  # vLLM caches an adapter by its id: a new id for the new weights
            path = adapter_snapshot(model, Path(self._dir.name) / "adapter", self._lora_version)
            self._lora_request = LoRARequest(f"lmpo_policy_{self._lora_version}", self._lora_version, str(path))
            self.llm.reset_prefix_cache()
            return
        runner_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        peft = hasattr(model, "merge_adapter")
        with torch.no_grad():
            if peft:
                model.merge_adapter()
            try:
                runner_model.load_weights(vllm_named_weights(model))
            finally:
                if peft:
                    model.unmerge_adapter()
        self.llm.reset_prefix_cache()

    def generate(
        self,
        prompts: Sequence[str],
        completions_per_prompt: int = 1,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> Rollout:
        """Sample ``completions_per_prompt`` completions for every prompt (one vLLM request per prompt).

        Request i is seeded with ``seed + i`` (a seed drawn from ``generator`` when no seed is given).
        """
        self.check_request(prompts, completions_per_prompt)
        if seed is None and generator is not None:
            seed = int(torch.randint(0, 2**31 - len(prompts), (1,), generator=generator, device=generator.device))
        greedy = greedy or self.temperature == 0
        prompt_ids = [list(ids) for ids in self.tokenizer(list(prompts))["input_ids"]]
        params = [
            self._vllm.SamplingParams(
                n=completions_per_prompt, temperature=0.0 if greedy else self.temperature, top_p=self.top_p,
                top_k=self.top_k, max_tokens=self.max_new_tokens,
                min_tokens=self.max_new_tokens if self.ignore_eos else 0, ignore_eos=self.ignore_eos,
                stop_token_ids=list(self.eos_token_ids), logprobs=0 if self.record_logprobs else None,
                seed=None if seed is None else seed + i, detokenize=False)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=params,
                                    use_tqdm=False,
                                    **({"lora_request": self._lora_request} if self._lora_request else {}))
        device = next(self.model.parameters()).device
        ro = to_rollout(outputs, prompts, prompt_ids, completions_per_prompt, self.tokenizer, self.eos_token_ids,
                        self.ignore_eos, self.record_logprobs)
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group_ids", "truncated",
                     "logprobs"):
            value = getattr(ro, name)
            if value is not None:
                setattr(ro, name, value.to(device))
        return ro
