"""The GPU check's measurements (``benchmarks/gpu/run.sh`` runs this after ``pytest -m gpu``).

Models are random-initialised Hugging Face ``Qwen2ForCausalLM``s of the real Qwen2.5 shapes (no weights are
downloaded: only speed and memory are measured, and those depend on the shapes alone), in bfloat16, with a
152k-token word-level tokenizer built in code whose first ids are lmpo's character vocabulary (prompts are
the built-in addition task's). Sections, each measured side by side in this one process:

- ``decode``: tokens/s sampling 128 sequences (16 prompts × 8) of exactly T new tokens (EOS ignored), 0.5B
  model, temperature 1: lmpo's ``HFRollout`` with CUDA-graph decode against Hugging Face ``generate`` (the
  path TRL takes without vLLM), at T = 512 and 2,048. lmpo's first call (graph capture) is a warm-up.
- ``step``: a whole GRPO step, lmpo's ``Trainer`` against TRL's ``GRPOTrainer`` at equal settings (0.5B
  bf16, 16 prompts × 8 completions of exactly 256 tokens, microbatches of 32, one optimizer step per step,
  beta 0, ``loss_type="grpo"``), the two stepping in turn (``benchmarks/trainer_vs_trl.py``'s baton); the
  ratio is the median of TRL step time / lmpo step time over the steps after the first.
- ``memory``: peak GPU memory of one training step (forward, backward, AdamW step) on 8 sequences of 4,096
  tokens (512 prompt + 3,584 completion) at V = 152k, 0.5B bf16, gradient checkpointing in both: lmpo's
  update (``policy_logprobs`` + a ``grpo`` ``Objective`` + AdamW) against TRL's ``GRPOTrainer.compute_loss``
  on the same tensors + AdamW. Reported above the memory held before the step (weights, inputs).
- ``mfu``: model FLOPs utilisation of lmpo's update (forward with gradient, objective, backward, gradient
  clipping, AdamW step) on the 1.5B model, bf16, 8 sequences × 1,024 tokens, with and without the fused
  log-prob head and under ``torch.compile`` (as ``loop.compile: true``); ``--mfu-seqs 8 16`` adds 16
  sequences (materialised logits, eager and compiled): FLOPs = 6·N_body·tokens + 6·V·H·completion tokens + 12·L·H·S·tokens (PaLM's count, the
  head counted only where logits are taken), over the GPU's dense bf16 peak.

``--dry-run`` runs every section with a two-layer model on the CPU in seconds (sizes shrunk, same code), so
that the script is exercised by the default test suite between GPU runs.

    python benchmarks/gpu/bench.py --out runs/gpu                 # on a GPU
    python benchmarks/gpu/bench.py --dry-run --out /tmp/gpu-dry   # anywhere
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the paired-steps helpers

# Qwen2.5 shapes (vocabulary 151,936, tied embeddings, 2 key/value heads)
SHAPES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936},
    "dry": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 1024},
}

# dense bf16 peak FLOP/s by device name (the vendors' datasheets, without sparsity)
PEAK_BF16 = {"H200": 989.4e12, "H100 80GB HBM3": 989.4e12, "H100 SXM": 989.4e12, "H100 PCIe": 756.0e12,
             "H100 NVL": 835.0e12, "A100": 312.0e12, "L40S": 362.0e12}


class Setup:
    """Sizes of one run: the real ones on a GPU, shrunk ones for ``--dry-run``."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.device = torch.device("cpu" if dry else "cuda")
        self.dtype = torch.float32 if dry else torch.bfloat16
        self.small = "dry" if dry else "0.5b"
        self.large = "dry" if dry else "1.5b"
        self.decode_lengths = (16, 32) if dry else (512, 2048)
        self.decode_prompts, self.group = (4, 2) if dry else (16, 8)
        self.step_prompts, self.step_length, self.step_microbatch = (4, 8, 4) if dry else (16, 256, 32)
        self.step_steps = 3 if dry else 4
        self.memory_seqs, self.memory_prompt, self.memory_completion = (2, 16, 48) if dry else (8, 512, 3584)
        self.mfu_prompt, self.mfu_completion = (8, 24) if dry else (128, 896)
        self.mfu_seqs: tuple[int, ...] = (2,) if dry else (8,)  # batch sizes (sequences) of the MFU section
        self.mfu_repeats = 2 if dry else 5
        self.mfu_compile = not dry  # torch.compile's first call takes a minute or more: not in the dry run
        self.hf_lengths: tuple[int, ...] | None = None  # decode lengths with an HF baseline (None: all)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def wide_tokenizer(vocab_size: int):
    """A ``PreTrainedTokenizerFast`` of ``vocab_size`` ids: lmpo's character vocabulary, then ``<t{id}>`` words.

    Any id a random model samples decodes to text (rewards see text), and prompts encode as characters.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lmpo.models import load_tokenizer

    chars = load_tokenizer("tiny")
    vocab = {token: i for i, token in enumerate(chars._id_to_char)}
    vocab.update({f"<t{i}>": i for i in range(len(vocab), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left",
                                   clean_up_tokenization_spaces=False)


def qwen2(shape: str, tok, setup: Setup, seed: int = 0, gradient_checkpointing: bool = False):
    """A random-initialised ``Qwen2ForCausalLM`` of ``SHAPES[shape]``, built on the device in ``setup.dtype``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
                         rms_norm_eps=1e-6, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, use_cache=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(setup.device):
        model = Qwen2ForCausalLM(config).to(setup.dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def addition_prompts(n: int) -> list[dict]:
    from lmpo.tasks import make_task

    task = make_task("addition", min_digits=1, max_digits=2)
    return [{"prompt": e.prompt, "answer": e.answer} for e in task.train_examples(seed=0)[:n]]


def parity_reward(prompts, completions, **kwargs) -> list[float]:
    """A reward that varies within groups (a random model solves nothing): the completion text's CRC parity."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


# ------------------------------------------------------------------------------------------------ decode
def bench_decode(setup: Setup) -> list[dict]:
    from lmpo.generation import HFRollout

    tok = wide_tokenizer(SHAPES[setup.small]["vocab_size"])
    model = qwen2(setup.small, tok, setup)
    prompts = [p["prompt"] for p in addition_prompts(setup.decode_prompts)]
    rows = []
    for length in setup.decode_lengths:
        seqs = len(prompts) * setup.group
        baseline = setup.hf_lengths is None or length in setup.hf_lengths
        lmpo = HFRollout(model, tok, max_new_tokens=length, temperature=1.0, ignore_eos=True, cuda_graphs=True)
        hf = HFRollout(model, tok, max_new_tokens=length, temperature=1.0, ignore_eos=True, impl="generate")
        warm = HFRollout(model, tok, max_new_tokens=8, temperature=1.0, ignore_eos=True, impl="generate")
        if baseline:
            warm.generate(prompts, setup.group, seed=0)  # kernels and allocator warm for HF generate
        timings = {"lmpo": [], "hf": []}
        lmpo.generate(prompts, setup.group, seed=0)  # captures the graphs of every bucket up to this length
        for rep in range(2):
            for name, engine in (("lmpo", lmpo), ("hf", hf)):
                if name == "hf" and (not baseline or (rep and length > 1024 and not setup.dry)):
                    continue  # one call of HF generate at the long length (about two minutes on an H100)
                sync(setup.device)
                t0 = time.perf_counter()
                out = engine.generate(prompts, setup.group, seed=rep + 1)
                sync(setup.device)
                timings[name].append(time.perf_counter() - t0)
                assert out.completion_ids.shape == (seqs, length), out.completion_ids.shape
        lmpo_s, hf_s = min(timings["lmpo"]), min(timings["hf"]) if timings["hf"] else None
        rows.append({"section": "decode", "model": setup.small, "seqs": seqs, "new_tokens": length,
                     "lmpo_decode_mode": lmpo.decode_mode, "lmpo_s": lmpo_s, "hf_generate_s": hf_s,
                     "lmpo_tokens_per_s": seqs * length / lmpo_s,
                     "hf_tokens_per_s": seqs * length / hf_s if hf_s else None,
                     "ratio": hf_s / lmpo_s if hf_s else None, "target": 3.0 if length == 512 else None})
    del model
    return rows


# ------------------------------------------------------------------------------------------------ step
def bench_step(setup: Setup) -> list[dict]:
    from lmpo.trainer import Trainer
    from lmpo.trainer.config import config_from_dict
    from trainer_vs_trl import Baton, Party, quartiles, run_in_turn

    tok = wide_tokenizer(SHAPES[setup.small]["vocab_size"])
    steps, seqs = setup.step_steps, setup.step_prompts * setup.group
    baton = Baton("lmpo", "trl")
    lmpo_party, trl_party = Party("lmpo", baton), Party("trl", baton)

    cfg = config_from_dict({
        "model": {"name": "tiny", "dtype": "bfloat16" if not setup.dry else "float32"},
        "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 2}, "eval_examples": 8},
        "rewards": {"functions": ["bench:parity_reward"]},  # this file, importable as `bench` (its directory
        # is on sys.path when it runs as a script): the same reward as TRL's below
        "rollout": {"completions_per_prompt": setup.group, "max_new_tokens": setup.step_length,
                    "temperature": 1.0, "ignore_eos": True},
        "objective": {"preset": "grpo"},
        "optim": {"lr": 1e-6, "max_grad_norm": 1.0},
        "loop": {"steps": steps, "prompts_per_step": setup.step_prompts, "seqs_per_microbatch": setup.step_microbatch,
                 "seed": 0, "device": setup.device.type},
        "eval": {"at_start": False, "max_new_tokens": 4},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": tempfile.mkdtemp(prefix="lmpo_gpu_step_"), "progress_bar": False,
                    "tensorboard": False},
    })
    lmpo = Trainer(cfg, model=qwen2(setup.small, tok, setup), tokenizer=tok, log=lambda msg: None)
    real_step = lmpo.rl_step

    def lmpo_step(i):
        lmpo_party.begin()
        out = real_step(i)
        sync(setup.device)
        lmpo_party.end()
        return out

    lmpo.rl_step = lmpo_step
    trl = _trl_trainer(setup, tok, qwen2(setup.small, tok, setup), trl_party, steps)
    run_in_turn(baton, lmpo.train, trl.train)
    n = min(len(lmpo_party.durations), len(trl_party.durations))
    pairs = list(range(1, n)) if n > 1 else [0]
    ratios = [trl_party.durations[i] / lmpo_party.durations[i] for i in pairs]
    q1, med, q3 = quartiles(ratios)
    return [{"section": "step", "model": setup.small, "seqs": seqs, "new_tokens": setup.step_length,
             "microbatch_seqs": setup.step_microbatch, "pairs": len(pairs),
             "lmpo_decode_mode": lmpo.rollout_engine.decode_mode,
             "lmpo_step_s": statistics.median(lmpo_party.durations[i] for i in pairs),
             "trl_step_s": statistics.median(trl_party.durations[i] for i in pairs),
             "ratio": med, "ratio_q1": q1, "ratio_q3": q3, "target": 2.0}]


def _trl_trainer(setup: Setup, tok, model, party, steps: int, gradient_checkpointing: bool = False):
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    seqs = setup.step_prompts * setup.group
    micro = setup.step_microbatch

    class Turn(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if party is not None:
                party.begin()

        def on_step_end(self, args, state, control, **kw):
            if party is not None:
                sync(setup.device)
                party.end()

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_gpu_"), use_cpu=setup.dry, report_to="none", bf16=False,
        per_device_train_batch_size=micro, num_generations=setup.group, generation_batch_size=seqs,
        gradient_accumulation_steps=seqs // micro, num_iterations=1, beta=0.0, learning_rate=1e-6,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_completion_length=setup.step_length, generation_kwargs={"min_new_tokens": setup.step_length},
        temperature=1.0, top_p=1.0, loss_type="grpo", scale_rewards="group", max_steps=steps, logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0, shuffle_dataset=False,
        log_completions=False, gradient_checkpointing=gradient_checkpointing,
    )
    dataset = Dataset.from_list(addition_prompts(setup.step_prompts * steps))
    trainer = GRPOTrainer(model=model, reward_funcs=parity_reward, args=config, train_dataset=dataset,
                          processing_class=tok, callbacks=[Turn()])
    trainer.remove_callback(PrinterCallback)
    return trainer


# ------------------------------------------------------------------------------------------------ memory
def _training_inputs(setup: Setup, vocab: int, seqs: int, prompt: int, completion: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(4, vocab, (seqs, prompt), generator=gen)
    completion_ids = torch.randint(4, vocab, (seqs, completion), generator=gen)
    adv = torch.randn(seqs, generator=gen)
    to = {"device": setup.device}
    return prompt_ids.to(**to), completion_ids.to(**to), adv.to(**to)


def lmpo_update(model, optimizer, prompt_ids, completion_ids, adv, objective, fused_head: bool | None = None,
                forward=None) -> float:
    """One lmpo update on these sequences: ``policy_logprobs`` with gradient → objective → backward → clip →
    AdamW; returns the loss. ``fused_head``: None = lmpo's own choice; ``forward``: what is called for the
    forward (the model, or a compiled view of it)."""
    from lmpo.generation import policy_logprobs

    ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.ones_like(ids)
    mask = torch.ones_like(completion_ids, dtype=torch.bool)
    optimizer.zero_grad(set_to_none=True)
    fwd = policy_logprobs(forward or model, ids, attn, completion_ids, with_grad=True, fused_head=fused_head)
    loss, _ = objective(fwd.logp, fwd.logp.detach(), adv, mask)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


def _step_peak(run, device: torch.device) -> tuple[int, int]:
    """(peak bytes above the start, bytes held at the start) of ``run()``, after one call that allocates
    AdamW's state (the measured call is a steady step)."""
    run()
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        return torch.cuda.max_memory_allocated() - before, before
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    run()
    return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before), before


def _lmpo_memory(setup: Setup, tok, inputs) -> tuple[int, int]:
    from lmpo.objectives import Objective

    model = qwen2(setup.small, tok, setup, gradient_checkpointing=True).train()
    assert model.is_gradient_checkpointing
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    objective = Objective.preset("grpo")
    return _step_peak(lambda: lmpo_update(model, optimizer, *inputs, objective), setup.device)


def _trl_memory(setup: Setup, tok, inputs) -> tuple[int, int]:
    prompt_ids, completion_ids, adv = inputs
    trainer = _trl_trainer(setup, tok, qwen2(setup.small, tok, setup), None, 1, gradient_checkpointing=True)
    # Trainer.train() turns gradient checkpointing on; compute_loss alone does not, so it is done here as there
    trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
    assert trainer.model.is_gradient_checkpointing, "TRL's model must checkpoint like lmpo's"
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's own loop, which is not run here
    model, optimizer = trainer.model, trainer.optimizer
    model.train()
    batch = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
             "completion_mask": torch.ones_like(completion_ids), "advantages": adv,
             "num_items_in_batch": torch.tensor(float(completion_ids.numel()), device=setup.device)}

    def run() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())

    return _step_peak(run, setup.device)


def bench_memory(setup: Setup) -> list[dict]:
    tok = wide_tokenizer(SHAPES[setup.small]["vocab_size"])
    vocab = SHAPES[setup.small]["vocab_size"]
    seqs, P, T = setup.memory_seqs, setup.memory_prompt, setup.memory_completion
    inputs = _training_inputs(setup, vocab, seqs, P, T)
    peaks = {}
    for name, measure in (("lmpo", _lmpo_memory), ("trl", _trl_memory)):
        peaks[name] = measure(setup, tok, inputs)  # the model and optimizer are freed when it returns
        if setup.device.type == "cuda":
            torch.cuda.empty_cache()
    return [{"section": "memory", "model": setup.small, "seqs": seqs, "tokens_per_seq": P + T, "vocab": vocab,
             "gradient_checkpointing": True, "lmpo_peak_gib": peaks["lmpo"][0] / 2**30,
             "trl_peak_gib": peaks["trl"][0] / 2**30, "held_before_gib": peaks["lmpo"][1] / 2**30,
             "ratio": peaks["lmpo"][0] / max(peaks["trl"][0], 1), "target": 1.0,
             "measure": "max_memory_allocated above the step's start" if setup.device.type == "cuda"
             else "ru_maxrss growth (CPU dry run: not comparable)"}]


# ------------------------------------------------------------------------------------------------ MFU
def peak_flops(device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, platform.processor() or "cpu"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16.items():
        if key in name:
            return value, name
    return None, name


def bench_mfu(setup: Setup) -> list[dict]:
    from lmpo.objectives import Objective

    tok = wide_tokenizer(SHAPES[setup.large]["vocab_size"])
    shape = SHAPES[setup.large]
    model = qwen2(setup.large, tok, setup)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=setup.device.type == "cuda")
    P, T = setup.mfu_prompt, setup.mfu_completion
    objective = Objective.preset("grpo")
    N, H, V, L = params(model), shape["hidden_size"], shape["vocab_size"], shape["num_hidden_layers"]
    S = P + T
    peak, device_name = peak_flops(setup.device)
    rows = []
    variants = [("fused head", True, None), ("materialised logits", False, None)]
    if setup.mfu_compile:
        from lmpo.trainer.step.stages import CompiledCalls

        variants.append(("materialised logits, torch.compile", False, CompiledCalls(model)))
    # the first batch size with every variant; larger ones (whose longer matrix products raise the tensor-core
    # occupancy) with the materialised-logits variants only
    runs = [(setup.mfu_seqs[0], v) for v in variants] + [(n, v) for n in setup.mfu_seqs[1:] for v in variants[1:]]
    for seqs, (label, fused, forward) in runs:
        prompt_ids, completion_ids, adv = _training_inputs(setup, shape["vocab_size"], seqs, P, T)
        flops = 6 * (N - V * H) * seqs * S + 6 * V * H * seqs * T + 12 * L * H * S * seqs * S
        t_start = time.perf_counter()
        for _ in range(2):  # warm-up (and, compiled, the compilation)
            lmpo_update(model, optimizer, prompt_ids, completion_ids, adv, objective, fused, forward)
        sync(setup.device)
        warmup_s = time.perf_counter() - t_start
        times = []
        for _ in range(setup.mfu_repeats):
            t0 = time.perf_counter()
            lmpo_update(model, optimizer, prompt_ids, completion_ids, adv, objective, fused, forward)
            sync(setup.device)
            times.append(time.perf_counter() - t0)
        step_s = statistics.median(times)
        rows.append({"section": "mfu", "model": setup.large, "params": N, "seqs": seqs, "tokens_per_seq": S,
                     "variant": label, "fused_head": fused, "compiled": forward is not None, "step_s": step_s,
                     "warmup_s": warmup_s, "model_tflops_per_s": flops / step_s / 1e12, "device": device_name,
                     "peak_tflops": peak / 1e12 if peak else None,
                     "mfu": flops / step_s / peak if peak else None, "target": 0.40})
    return rows


# ------------------------------------------------------------------------------------------------ report
SECTIONS = {"decode": bench_decode, "step": bench_step, "memory": bench_memory, "mfu": bench_mfu}


def versions() -> dict:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:
        out["trl"] = None
    return out


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value)


def markdown(report: dict) -> str:
    v = report["versions"]
    lines = [f"Device: {v['device']}; torch {v['torch']} (CUDA {v['cuda']}), transformers {v['transformers']}, "
             f"trl {v['trl']}; {'dry run (CPU, shrunk sizes)' if report['dry_run'] else 'full run'}.", "",
             "| measurement | lmpo | baseline | ratio | target | pass |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        s = r["section"]
        if s == "decode":
            lines.append(f"| decode tokens/s, {r['model']}, {r['seqs']} seqs × {r['new_tokens']} new tokens "
                         f"({r['lmpo_decode_mode']}) | {r['lmpo_tokens_per_s']:,.0f} | "
                         f"{_fmt(r['hf_tokens_per_s'], 0)} (HF generate) | {_fmt(r['ratio'])}× | "
                         f"{_target(r, '× HF')} | {_pass(r)} |")
        elif s == "step":
            lines.append(f"| GRPO step, {r['model']}, {r['seqs']} seqs × {r['new_tokens']} tokens "
                         f"({r['pairs']} paired steps) | {r['lmpo_step_s']:.2f} s | {r['trl_step_s']:.2f} s (TRL "
                         f"GRPOTrainer) | {r['ratio']:.2f}× (IQR {r['ratio_q1']:.2f}–{r['ratio_q3']:.2f}) | "
                         f"{_target(r, '× TRL')} | {_pass(r)} |")
        elif s == "memory":
            lines.append(f"| peak training-step memory, {r['model']}, {r['seqs']} × {r['tokens_per_seq']} tokens, "
                         f"V = {r['vocab']:,} | {r['lmpo_peak_gib']:.2f} GiB | {r['trl_peak_gib']:.2f} GiB (TRL) | "
                         f"{r['ratio']:.2f}× | ≤ TRL | {_pass(r, lower=True)} |")
        elif s == "mfu":
            lines.append(f"| update MFU, {r['model']} bf16, {r['seqs']} × {r['tokens_per_seq']} tokens, "
                         f"{r['variant']} | {_fmt(r['mfu'] * 100 if r['mfu'] else None, 1)}% "
                         f"({r['model_tflops_per_s']:.0f} TFLOP/s, {r['step_s'] * 1000:.0f} ms) | peak "
                         f"{_fmt(r['peak_tflops'], 0)} TFLOP/s | – | ≥ 40% | {_pass(r, key='mfu')} |")
    for s, err in report["errors"].items():
        lines.append(f"| {s}: FAILED | {err.splitlines()[-1][:200] if err else ''} | | | | no |")
    return "\n".join(lines) + "\n"


def _target(r: dict, unit: str) -> str:
    return f"≥ {r['target']:.0f}{unit}" if r.get("target") else "–"


def _pass(r: dict, key: str = "ratio", lower: bool = False) -> str:
    if r.get("target") is None or r.get(key) is None:
        return "–"
    return "yes" if (r[key] <= r["target"] if lower else r[key] >= r["target"]) else "no"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="the same code on the CPU with a two-layer model")
    p.add_argument("--out", default="runs/gpu", help="directory for gpu.json and gpu.md")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--hf-lengths", type=int, nargs="*", default=None,
                   help="decode lengths that also time HF generate (default: all; HF takes ~2 min at 2,048)")
    p.add_argument("--mfu-seqs", type=int, nargs="+", default=None,
                   help="batch sizes (sequences of 1,024 tokens) of the MFU section: every variant at the first, "
                        "the materialised-logits ones at the others (default: 8)")
    args = p.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run", file=sys.stderr)
        return 2
    setup = Setup(args.dry_run)
    setup.hf_lengths = tuple(args.hf_lengths) if args.hf_lengths is not None else None
    if args.mfu_seqs:
        setup.mfu_seqs = tuple(args.mfu_seqs)
    if args.dry_run:
        torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"dry_run": args.dry_run, "versions": versions(), "rows": [], "errors": {}, "seconds": {}}
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            rows = SECTIONS[name](setup)
            report["rows"].extend(rows)
            for r in rows:
                print(json.dumps(r), flush=True)
        except Exception:  # noqa: BLE001 - one failing section must not hide the others' numbers
            report["errors"][name] = traceback.format_exc()
            print(f"section {name} FAILED:\n{report['errors'][name]}", flush=True)
        report["seconds"][name] = time.perf_counter() - t0
        print(f"section {name}: {report['seconds'][name]:.1f} s", flush=True)
        if setup.device.type == "cuda":
            torch.cuda.empty_cache()
        (out / "gpu.json").write_text(json.dumps(report, indent=1))  # after each section: nothing lost on a kill
        (out / "gpu.md").write_text(markdown(report))
    print(markdown(report))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
