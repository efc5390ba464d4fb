"""``lmpo eval MODEL_OR_RUN [--task TASK] [--n N] [--samples K]``: greedy accuracy of any causal LM, with a 95%
confidence interval; with ``--samples K`` also pass@k (k = 1, 2, 4, … K) and avg@K from K sampled completions per
problem (:mod:`lmpo.eval.passk`). A run of a multi-turn environment (``env.id``) without ``--task`` is evaluated
on episodes: greedy success on its held-out examples and, with ``--samples K``, pass@k of K sampled episodes
(:func:`evaluate_env_run`).

``MODEL_OR_RUN`` is a built-in preset (``tiny``), any Hugging Face causal LM (a local directory or a hub name),
or a run directory of ``lmpo train``: its ``model/`` (or newest complete checkpoint; a LoRA adapter is merged
into the run's base model), with the run's own task, held-out examples and prompt format when ``--task`` is
left out (:mod:`lmpo.trainer.run.export`).
``TASK`` is a built-in task (its held-out split), a JSON / JSONL / Parquet file (every row; TRL's standard
or conversational format) or a saved ``datasets`` directory / hub name (one split, ``test`` by default).
A completion is correct when the task's accuracy reward (``exact_match`` for files) is ``>= 1``.

Imports sit inside the functions on purpose: ``lmpo --help`` imports this module to build its parser and
must not pay for torch, transformers and the models (``lmpo.cli``'s docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from lmpo.errors import InputError


@dataclass
class EvalResult:
    """What :func:`evaluate_model` measured."""

    model: str
    task: str
    n: int
    correct: int
    ci95: tuple[float, float]
    length_mean: float
    seconds: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    max_new_tokens: int = 0
    passk: dict[str, float] = field(default_factory=dict)
    """``pass@k`` / ``avg@K`` with ``_low`` / ``_high`` interval ends (``--samples K``), else empty."""
    episodes: dict[str, float] = field(default_factory=dict)
    """A multi-turn run's greedy ``episodes/*`` metrics (``lmpo.generation.episodes.episode_metrics``), else empty:
    ``correct`` then counts successful episodes and ``length_mean`` is the policy's tokens per episode."""

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    def summary(self) -> str:
        lo, hi = self.ci95
        what, length = ("success", "policy tokens per episode") if self.episodes else ("accuracy", "completion length")
        text = (f"{what} {self.accuracy:.3f} ({self.correct}/{self.n}), 95% CI [{lo:.3f}, {hi:.3f}] (Wilson); "
                f"mean {length} {self.length_mean:.1f}")
        if self.episodes:
            e = self.episodes
            text += (f"; turns {e['episodes/turns_mean']:.2f}, tool calls {e['episodes/tool_calls_mean']:.2f} per "
                     f"episode, truncated {e['episodes/truncated_fraction']:.3f}")
        for key, value in self.passk.items():
            if not key.endswith(("_low", "_high")):
                text += (f"\n{key} {value:.3f}, 95% CI [{self.passk[key + '_low']:.3f}, "
                         f"{self.passk[key + '_high']:.3f}] (over problems)")
        return text


def load_eval_examples(task: str, options: dict[str, Any] | None = None):
    """``(examples, accuracy reward name, description)`` of what ``lmpo eval`` scores for ``task``.

    Options: a built-in task's constructor options; for files and datasets ``prompt_field``, ``answer_field``,
    ``prompt_template`` and ``accuracy_reward``, plus ``split`` (default ``test``) and ``subset`` for datasets.
    """
    from lmpo.tasks import FILE_FORMATS, TASKS, make_task, rows_to_examples, task_family
    from lmpo.tasks.files import load_split, read_rows

    options = dict(options or {})
    try:
        if task in TASKS or task_family(task):
            built = make_task(task, **options)
            return built.eval_examples(), built.accuracy_reward, f"{task} (held-out split)"
        accuracy = options.pop("accuracy_reward", "exact_match")
        fields = {k: options.pop(k) for k in ("prompt_field", "answer_field", "prompt_template") if k in options}
        if os.path.splitext(task)[1].lower() in FILE_FORMATS:
            rows, what = read_rows(task), f"{task} (all rows)"
        elif os.path.isdir(task) or "/" in task:
            split = options.pop("split", "test")
            rows, what = load_split(task, split, options.pop("subset", None)), f"{task}[{split}]"
        else:
            raise InputError(f"--task {task!r} is not a built-in task ({', '.join(sorted(TASKS))}), a "
                             f"{' / '.join(FILE_FORMATS)} file, nor a dataset directory or 'org/name'.")
        if options:
            raise InputError(f"--task-options {sorted(options)} do not apply to a file or dataset; accepted: "
                             "prompt_field, answer_field, prompt_template, accuracy_reward, split, subset.")
        return rows_to_examples(rows, source=task, **fields), accuracy, what
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"--task {task!r}: {e.args[0] if e.args else e}") from e


def evaluate_model(model: str, task: str | None, *, options: dict[str, Any] | None = None, n: int = 0,
                   max_new_tokens: int | None = None, seqs_per_batch: int = 64, prompt_format: str | None = None,
                   chat_template: str | None = None, accuracy_reward: str | None = None,
                   success_threshold: float = 1.0, device: str = "auto", dtype: str = "float32", seed: int = 0,
                   samples: int = 0, samples_per_prompt: int = 0, temperature: float = 1.0,
                   top_p: float = 1.0) -> EvalResult:
    """Greedy accuracy of ``model`` on the first ``n`` (0 = all) examples of ``task`` (see the module docstring).

    For a run directory, ``task=None`` evaluates the run's own task (its held-out examples, as many as the
    run's ``task.eval_examples``), and ``max_new_tokens`` / ``prompt_format`` = None take the run's values
    (for anything else: 64 tokens, ``auto``).
    ``samples`` keeps the first few (prompt, completion, answer, correct) records in the result.
    ``samples_per_prompt`` = K > 0 also samples K completions per problem at ``temperature`` / ``top_p`` (seeded
    by ``seed``) and reports pass@k for k = 1, 2, 4, … K and avg@K (``EvalResult.passk``).
    """
    from lmpo.eval.greedy import greedy_completions, judge, nonfinite_parameters, wilson_interval
    from lmpo.models import MODEL_PRESETS, load_model_and_tokenizer
    from lmpo.models.loading import looks_like_hub_id
    from lmpo.rewards import REWARDS, get_reward_fn
    from lmpo.tasks import render_prompts
    from lmpo.trainer.run.build import check_prompt_lengths, resolve_device
    from lmpo.trainer.run.export import is_run_dir, load_run_policy, run_config

    if n < 0:
        raise InputError(f"--n {n} must be >= 0 (0 = every example).")
    if samples_per_prompt < 0 or not temperature > 0 or not 0 < top_p <= 1:
        raise InputError(f"--samples {samples_per_prompt}, --temperature {temperature}, --top-p {top_p}: samples "
                         "must be >= 0 (0 = greedy only), temperature > 0 and top-p in (0, 1].")
    if (max_new_tokens is not None and max_new_tokens < 1) or seqs_per_batch < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens} and --seqs-per-batch {seqs_per_batch} must be >= 1.")
    run = model if model not in MODEL_PRESETS and is_run_dir(model) else None
    if run is None and model not in MODEL_PRESETS:
        if os.path.isdir(model) and not os.path.isfile(os.path.join(model, "config.json")):
            raise InputError(f"model {model!r} is a directory without config.json, so neither a Hugging Face model "
                             "nor a run of `lmpo train` (config.yaml with model/ or checkpoints/); give a directory "
                             "written by save_pretrained, a run directory, or a built-in preset "
                             f"({', '.join(sorted(MODEL_PRESETS))}).")
        if not os.path.isdir(model) and not looks_like_hub_id(model):
            raise InputError(f"model {model!r} is neither a built-in preset ({', '.join(sorted(MODEL_PRESETS))}), a "
                             "local directory, a run directory, nor a Hugging Face 'org/name'.")
    cfg = run_config(run) if run is not None else None
    if task is None and cfg is not None and cfg.env.id is not None:
        if accuracy_reward is not None or max_new_tokens is not None or prompt_format is not None:
            raise InputError(f"the run trained on episodes of `env.id` = {cfg.env.id!r}, which its environment "
                             "judges within its `env.budget`: --accuracy-reward, --max-new-tokens and --prompt-format "
                             "do not apply (give --task to evaluate single-turn completions instead).")
        return evaluate_env_run(model, cfg, n=n, device=device, seed=seed, samples=samples,
                                samples_per_prompt=samples_per_prompt, temperature=temperature, top_p=top_p)
    if task is None:
        if cfg is None:
            raise InputError(f"model {model!r}: --task is missing; give a built-in task, a data file or a "
                             "dataset (only a run directory brings its own task).")
        examples, task_reward, what = _run_task_examples(cfg)
        task = cfg.task.name
        if accuracy_reward is None and task_reward not in REWARDS:
            # a run directory is data: the import path its config names is used only when the user names it too
            raise InputError(f"the run's config.yaml names the accuracy reward {task_reward!r} (task.options."
                             "accuracy_reward), code that lmpo does not import on a run directory's word. Pass "
                             f"--accuracy-reward {task_reward} to import it, or another reward.")
    else:
        examples, task_reward, what = load_eval_examples(task, options)
    if cfg is not None:
        prompt_format = prompt_format or cfg.task.prompt_format
        chat_template = chat_template or cfg.task.chat_template
        max_new_tokens = max_new_tokens or cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    prompt_format, max_new_tokens = prompt_format or "auto", max_new_tokens or 64
    examples = examples[:n] if n else examples
    if not examples:
        raise InputError(f"--task {task!r} has no examples to evaluate.")
    try:
        accuracy_fn = get_reward_fn(accuracy_reward or task_reward)
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        raise InputError(f"--accuracy-reward {accuracy_reward!r}: {e}") from e
    t0 = time.perf_counter()
    dev = resolve_device(device)
    if run is not None:
        policy, tokenizer, source, _ = load_run_policy(run, device=str(dev))
        model = f"{model} ({source.name})"
    else:
        policy, tokenizer = load_model_and_tokenizer(model, dtype=dtype, device=dev, seed=seed)
    broken = nonfinite_parameters(policy)
    if broken:
        raise InputError(f"model {model!r}: {len(broken)} parameter tensors hold NaN or infinite values (the first: "
                         f"{broken[0]}), so every completion it generates is noise and its accuracy would read 0. "
                         "Evaluate an earlier checkpoint (`lmpo export RUN OUT --step N`, then `lmpo eval OUT`) or "
                         "train again from one.")
    examples = render_prompts(examples, tokenizer, prompt_format, chat_template, model_name=f"model {model!r}",
                              source=f"task {task!r}", options=("--prompt-format", "--chat-template"))
    check_prompt_lengths(examples, tokenizer, policy, max_new_tokens, budget="--max-new-tokens", what=f"--task {task!r}",
                         fix="Shorten or drop the long rows, lower --max-new-tokens, or evaluate a model with a longer "
                             "context.")
    texts, lengths = greedy_completions(policy, tokenizer, [e.prompt for e in examples],
                                        max_new_tokens=max_new_tokens, seqs_per_batch=seqs_per_batch, device=dev)
    correct = judge(examples, texts, accuracy_fn, success_threshold)
    kept = [{"prompt": e.messages if e.messages is not None else e.prompt, "completion": t, "answer": e.answer,
             "correct": c} for e, t, c in list(zip(examples, texts, correct))[:samples]]
    passk: dict[str, float] = {}
    if samples_per_prompt > 0:
        from lmpo.eval.passk import pass_at_k_metrics, sampled_correct

        sampled, _ = sampled_correct(policy, tokenizer, examples, accuracy_fn, samples_per_prompt=samples_per_prompt,
                                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                     prompts_per_batch=max(1, seqs_per_batch // samples_per_prompt),
                                     success_threshold=success_threshold)
        passk = pass_at_k_metrics(sampled, prefix="")
    return EvalResult(model=model, task=what, n=len(examples), correct=sum(correct),
                      ci95=wilson_interval(sum(correct), len(examples)), length_mean=sum(lengths) / len(lengths),
                      seconds=time.perf_counter() - t0, samples=kept, max_new_tokens=max_new_tokens, passk=passk)


def evaluate_env_run(run: str, cfg, *, n: int = 0, device: str = "auto", seed: int = 0, samples: int = 0,
                     samples_per_prompt: int = 0, temperature: float = 1.0, top_p: float = 1.0) -> EvalResult:
    """A multi-turn run (``env.id``) on its held-out examples: greedy episodes under the run's ``env`` section
    (its imports, options, budget and chat template), success as the trainer judges it (a turn with
    ``info["correct"]``, else a positive return), with a Wilson interval; with ``samples_per_prompt`` = K, K
    sampled episodes per example (``temperature``, ``top_p``, seeded by ``seed``) give pass@k and avg@K."""
    import torch

    from lmpo.envs.checker import episode_succeeded
    from lmpo.envs.plugins import import_env_modules
    from lmpo.eval.greedy import wilson_interval
    from lmpo.generation.episodes import episode_metrics
    from lmpo.trainer.run.build import TASK_ERRORS, build_task, resolve_device, task_error
    from lmpo.trainer.run.export import load_run_policy
    from lmpo.trainer.step.multiturn import ensure_chat_template, env_factory, make_runner

    t0 = time.perf_counter()
    import_env_modules(cfg.env.imports, where=f"env.import (of {run}/config.yaml)")
    try:
        task = build_task(cfg.task, cfg.env)
    except TASK_ERRORS as e:
        raise task_error(cfg.task, e, cfg.env) from None
    examples = task.eval_examples()[: cfg.task.eval_examples]
    examples = examples[:n] if n else examples
    dev = resolve_device(device)
    policy, tokenizer, source, _ = load_run_policy(run, device=str(dev))
    ensure_chat_template(tokenizer, cfg.env, cfg.model.name)
    greedy = make_runner(policy, tokenizer, cfg.env, temperature=0.0).run(env_factory(cfg.env), examples, 1,
                                                                          seed=cfg.loop.seed)
    correct = [episode_succeeded(e.rewards, e.infos) for e in greedy]
    passk: dict[str, float] = {}
    if samples_per_prompt > 0:
        from lmpo.eval.passk import pass_at_k_metrics

        K = samples_per_prompt
        runner = make_runner(policy, tokenizer, cfg.env, temperature=temperature, top_p=top_p)
        sampled = runner.run(env_factory(cfg.env), examples, K, seed=cfg.loop.seed,
                             generator=torch.Generator(dev).manual_seed(seed))
        rows = [[episode_succeeded(e.rewards, e.infos) for e in sampled[i * K:(i + 1) * K]] for i in range(len(examples))]
        passk = pass_at_k_metrics(rows, prefix="")
    kept = [{"prompt": e.example.messages if e.example is not None else None, "messages": e.messages,
             "answer": e.example.answer if e.example is not None else None, "correct": c, "return": e.episode_return,
             "end_reason": e.end_reason} for e, c in list(zip(greedy, correct))[:samples]]
    metrics = episode_metrics(greedy)
    return EvalResult(model=f"{run} ({source.name})", task=f"{cfg.env.id} (the run's held-out examples)",
                      n=len(examples), correct=sum(correct), ci95=wilson_interval(sum(correct), len(examples)),
                      length_mean=metrics["episodes/policy_tokens_mean"], seconds=time.perf_counter() - t0,
                      samples=kept, max_new_tokens=cfg.env.budget.max_new_tokens_per_turn, passk=passk,
                      episodes=metrics)


def _run_task_examples(cfg):
    """The held-out examples a run evaluated (its ``task`` section), its accuracy reward and a description."""
    from lmpo.trainer.run.build import TASK_ERRORS, build_task

    try:
        task = build_task(cfg.task)
    except TASK_ERRORS as e:
        raise InputError(f"the run's task ({cfg.task.name!r}, from its config.yaml) cannot be built: {e}; give "
                         "--task instead.") from None
    examples = task.eval_examples()[: cfg.task.eval_examples]
    return examples, getattr(task, "accuracy_reward", "exact_match"), f"{task.name} (the run's held-out examples)"


def register_eval(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="greedy accuracy of a model on a task, with a 95%% confidence interval",
        description="Greedy accuracy of MODEL (a built-in preset such as `tiny`, any Hugging Face causal LM "
                    "directory or hub name, or a run directory of `lmpo train`: its model/ or newest checkpoint, "
                    "and its own task when --task is left out) on TASK: a built-in task's held-out split, every row of a "
                    "JSON/JSONL/Parquet file (TRL's standard or conversational format), or one split of a "
                    "saved `datasets` directory. Prints accuracy with a 95%% Wilson confidence interval. A run of "
                    "a multi-turn environment (env.id) without --task plays its held-out episodes greedily (success "
                    "as the trainer judges it; --samples K: pass@k of K sampled episodes per example).",
    )
    p.add_argument("model", metavar="MODEL_OR_RUN",
                   help="built-in preset, Hugging Face model directory / name, or `lmpo train` run directory")
    p.add_argument("--task", default=None,
                   help="built-in task name, data file, or dataset directory / name (default for a run: its task)")
    p.add_argument("--n", type=int, default=0, help="evaluate the first N examples (default 0: all)")
    p.add_argument("--task-options", default=None, metavar="YAML",
                   help="task options as a YAML mapping, e.g. '{max_digits: 3}' or '{prompt_field: question}'")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="completion budget in tokens (default 64; for a run, its eval / rollout budget)")
    p.add_argument("--seqs-per-batch", type=int, default=64, help="prompts per generation batch (default 64)")
    p.add_argument("--prompt-format", default=None, choices=["auto", "chat", "text"],
                   help="chat template use, as task.prompt_format in training (default auto; for a run, its own)")
    p.add_argument("--chat-template", default=None, help="Jinja chat template (text or file) for a tokenizer without one")
    p.add_argument("--accuracy-reward", default=None,
                   help="reward whose value >= 1 counts as correct (default: the task's, exact_match for files)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--samples", type=int, default=0, metavar="K", dest="samples_per_prompt",
                   help="also sample K completions per problem and print pass@k (k = 1, 2, 4, ... K, the unbiased "
                        "estimator of Chen et al. 2021) and avg@K, with 95%% intervals over problems (default 0: "
                        "greedy only)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of --samples (default 1)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass of --samples (default 1: off)")
    p.add_argument("--seed", type=int, default=0,
                   help="initialisation seed of a built-in preset, and the sampling seed of --samples")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the result and every completion here")
    p.set_defaults(func=_run_eval)


def _run_eval(args: argparse.Namespace) -> int:
    import yaml

    try:
        options = yaml.safe_load(args.task_options) if args.task_options else {}
        if not isinstance(options, dict):
            raise InputError(f"--task-options {args.task_options!r} must be a YAML mapping such as "
                             "'{max_digits: 3}'.")
        result = evaluate_model(args.model, args.task, options=options, n=args.n, max_new_tokens=args.max_new_tokens,
                                seqs_per_batch=args.seqs_per_batch, prompt_format=args.prompt_format,
                                chat_template=args.chat_template, accuracy_reward=args.accuracy_reward,
                                device=args.device, dtype=args.dtype, seed=args.seed,
                                samples=sys.maxsize if args.json else 0, samples_per_prompt=args.samples_per_prompt,
                                temperature=args.temperature, top_p=args.top_p)
    except (InputError, yaml.YAMLError) as e:
        print(f"lmpo eval: {e}", file=sys.stderr)
        return 2
    budget = "tokens per turn" if result.episodes else "new tokens"
    print(f"lmpo eval: model {result.model!r} on {result.task}, {result.n} {'episodes' if result.episodes else 'examples'}"
          f", greedy, at most {result.max_new_tokens} {budget} ({result.seconds:.0f} s)")
    print(result.summary())
    if args.json:
        record = {"model": result.model, "task": result.task, "n": result.n, "correct": result.correct,
                  "accuracy": result.accuracy, "ci95": list(result.ci95), "length_mean": result.length_mean,
                  "pass_at_k": result.passk, "episodes": result.episodes, "samples": result.samples}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1, ensure_ascii=False)
        print(f"completions: {args.json}")
    return 0
