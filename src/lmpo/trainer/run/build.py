"""Construction: the only place that builds what a training run is made of from its config.

Each function takes config sections and built objects and returns one thing; the loop (``Trainer``), the lab's
gradient study and ``lmpo eval RUN`` call these, so that the same config builds the same task, rewards, engine,
reference model and KL controller everywhere. ``build_run`` is what ``Trainer(config)`` builds, in this order::

    device = resolve_device(cfg.loop.device)
    objective = validate_config(cfg)                     # the objective is built once, by the config's check
    objective, driver, estimator = build_objective(cfg.objective, objective)
    task = build_task(cfg.task)                          # InputError naming task.* on failure
    model, tokenizer = load_policy(cfg.model, device)    # InputError naming model.name on failure
    scorer, accuracy_fn = build_rewards(cfg.rewards, task, examples, device)
    engine = build_rollout_engine(cfg, model, tokenizer, record_logprobs=driver.needs.rollout_logp)
    ref = build_reference(cfg, model, device)             # when a KL term or the KL in the reward needs it
    kl_ctrl = build_kl_controller(cfg.objective)          # None unless objective.kl_in_reward

At the start of ``Trainer.train``: ``build_reference`` (when needed), the optimizer, ``build_logs`` and the rollout
engine, or ``build_async_pipeline`` under ``rollout.async_staleness``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from lmpo.errors import InputError
from lmpo.generation import ENGINES
from lmpo.generation.worker import AsyncRollout, model_tensors
from lmpo.models import load_model_and_tokenizer
from lmpo.objectives import Objective, ObjectiveDriver
from lmpo.objectives.advantages import make_estimator
from lmpo.objectives.kl_reward import make_kl_controller
from lmpo.rewards import RewardModel, RewardScorer, RewardSpec, get_reward_fn
from lmpo.rewards.parallel import ParallelRewardScorer
from lmpo.tasks import load_task, render_prompts
from lmpo.trainer.config import RewardModelConfig, TrainConfig, check_estimator, config_to_dict
from lmpo.trainer.run.completions import CompletionLog
from lmpo.trainer.run.metrics import MetricsLogger
from lmpo.trainer.step import multiturn, stages
from lmpo.trainer.step.pipeline import AsyncPipeline
from lmpo.trainer.step.ref_sync import check_sync_compatible
from lmpo.trainer.step.sampling import PromptOrder
from lmpo.trainer.step.stages import LogprobSettings
from lmpo.trainer.step.teacher import Teacher
from lmpo.trainer.step.update import UpdateSettings

#: what building a task raises for bad data or settings (reported as one InputError naming task.*)
TASK_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError)


def resolve_device(name: str) -> torch.device:
    """``loop.device``: ``auto`` is CUDA, else MPS, else CPU; any other name is taken as it is."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def build_objective(ob, objective: Objective) -> tuple[Objective, ObjectiveDriver, object]:
    """The run's objective, its driver and the advantage estimator, from the ``objective`` section and the
    objective its ``validate`` built (``validate_config``'s return: the preset with ``objective.overrides``).

    The trainer checks loss and gradient finiteness once per optimizer step itself (and skips the step), so the
    objective's own per-call check (one host sync per microbatch) is off unless the overrides ask for it.
    """
    if "check_finite" not in ob.overrides:
        objective = objective.replace(check_finite=False)
    estimator = make_estimator(ob.advantage_estimator, default_scale=objective.advantage_scale,
                               **ob.advantage_options)
    return objective, ObjectiveDriver(objective), estimator


def build_task(tk, env=None):
    """The task of a run's ``task`` section through the one loader, ``lmpo.tasks.load_task`` (``task.name`` is a
    built-in task, ``file`` or ``hf``); with an ``env`` section whose ``id`` is set, the environment's task
    (``lmpo.envs.make_env_task``, with ``task.options``). Raises one of ``TASK_ERRORS``; ``task_error`` words it
    for the user."""
    if env is not None and env.id is not None:
        from lmpo.envs import make_env_task

        return make_env_task(env.id, **tk.options)
    if tk.name in ("file", "hf"):
        source = tk.path if tk.name == "file" else tk.hf_name
        return load_task(source, kind=tk.name, prompt_field=tk.prompt_field, answer_field=tk.answer_field,
                         **tk.options)
    return load_task(tk.name, kind="builtin", **tk.options)


def task_error(tk, e: Exception, env=None) -> InputError:
    """A task that cannot be built, as one message naming the config keys to fix."""
    if env is not None and env.id is not None:
        detail = " ".join(str(e).split())
        return InputError(f"the task of `env.id` = {env.id!r} cannot be built with `task.options` = {tk.options!r} "
                          f"({type(e).__name__}: {detail}). Give options of the environment's task "
                          "(lmpo.envs.ENVS[id].task) or none.")
    what = {"file": f"`task.path` = {tk.path!r}", "hf": f"`task.hf_name` = {tk.hf_name!r}"}.get(
        tk.name, f"`task.name` = {tk.name!r} with `task.options` = {tk.options!r}")
    detail = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split())
    return InputError(f"{what}: the task cannot be built ({type(e).__name__}: {detail}). Fix the data or the "
                      "task.* settings (prompt_field, answer_field, options).")


def load_policy(mc, device: torch.device, name: str | None = None, where: str = "model.name"):
    """``(model, tokenizer)`` of a built-in preset, a local model directory or a hub id (default
    ``model.name``, initialised with ``model.init_seed``); a failure is an InputError naming the config key."""
    name = mc.name if name is None else name
    try:
        return load_model_and_tokenizer(name, dtype=mc.dtype, device=device, seed=mc.init_seed)
    except InputError as e:  # already says what is wrong and how to fix it
        raise InputError(f"`{where}`: {e}") from None
    except (OSError, ValueError) as e:
        first = " ".join(str(e).split())[:300]
        raise InputError(f"`{where}` = {name!r} could not be loaded ({type(e).__name__}: {first}). Give a "
                         "built-in preset, a local directory holding a saved Hugging Face model (config.json "
                         "and weights), or a hub id this machine can download (or has cached).") from None


def wrap_lora(model, lc):
    """The model with LoRA adapters of the ``model.lora`` section (only these train)."""
    # peft is imported here: an optional heavy dependency that only LoRA runs load
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                              target_modules=list(lc.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, peft_cfg)


#: the model config keys that give a causal LM's context length, in the order they are looked up
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def check_prompt_lengths(examples, tokenizer, model, max_new_tokens: int, *, budget: str, what: str,
                         fix: str) -> None:
    """Refuse a prompt that, with ``max_new_tokens`` new tokens, does not fit the model's context (its config's
    ``CONTEXT_KEYS``; no check when it has none): generation would allocate attention for the whole sequence (a 1 MB
    row: 10^12 bytes) or run past the positions the model was trained on. ``budget`` names the setting of
    ``max_new_tokens``; ``what`` the source of the prompts; ``fix`` the sentence that ends the message.

    A token covers at least one byte of UTF-8 under the tokenizers lmpo loads (byte-level BPE, SentencePiece with
    byte fall-back, characters), so only prompts longer than the room in bytes are tokenized, and a long one first by
    a prefix (a 1 MB row is refused without tokenizing all of it)."""
    config = getattr(model, "config", None)
    key, context = next(((k, v) for k in CONTEXT_KEYS if isinstance(v := getattr(config, k, None), int) and v > 0),
                        (None, None))
    if context is None:
        return
    room = context - max_new_tokens
    for ex in examples:
        if 2 * len(ex.prompt.encode("utf-8")) + 16 <= room:
            continue
        prefix = ex.prompt[: 8 * (max(room, 0) + 16)]
        tokens = len(tokenizer(prefix)["input_ids"])
        if tokens <= room and len(prefix) < len(ex.prompt):  # over 8 characters a token so far: count them all
            prefix = ex.prompt
            tokens = len(tokenizer(prefix)["input_ids"])
        if tokens > room:
            start = ex.prompt[:40] + ("…" if len(ex.prompt) > 40 else "")
            at_least = "at least " if len(prefix) < len(ex.prompt) else ""
            raise InputError(f"{what}: a prompt of {at_least}{tokens:,} tokens ({len(ex.prompt):,} characters, starting "
                             f"{start!r}) plus {budget} = {max_new_tokens} new tokens does not fit the model's "
                             f"context of {context:,} tokens (its config's {key}); generating it would allocate "
                             f"attention over {at_least}{tokens + max_new_tokens:,} positions. {fix}")


def build_rewards(rw, task, examples, device: torch.device):
    """``(scorer, accuracy_fn)``: the ``rewards`` section's functions (the task's defaults when none are given)
    and the task's accuracy reward. ``examples`` (train and held-out) tell whether prompts are conversations,
    which a reward model must then accept."""
    conversational = any(e.messages is not None for e in examples)
    if rw.functions:
        weights = rw.weights or (1.0,) * len(rw.functions)
        specs = []
        for f, w in zip(rw.functions, weights):
            if isinstance(f, RewardModelConfig):
                rm = RewardModel(f.model, seqs_per_batch=f.seqs_per_batch, chat_template=f.chat_template,
                                 dtype=f.dtype, device=device)
                if conversational:
                    rm.check_conversational(f"task {task.name!r}")
                specs.append(RewardSpec(f.metric_name, w, fn=rm))
            else:
                specs.append(RewardSpec(f, w, dict(rw.kwargs.get(f, {}))))
    else:
        specs = [{"name": n, "weight": w} for n, w in task.default_rewards]
    if rw.workers > 0:  # a pool with a timeout per call (lmpo.rewards.parallel)
        scorer = ParallelRewardScorer(specs, on_error="skip" if rw.on_error == "auto" else rw.on_error,
                                      workers=rw.workers, pool=rw.pool, timeout_s=rw.timeout_s,
                                      seqs_per_call=rw.seqs_per_call)
    else:
        scorer = RewardScorer(specs, on_error="raise" if rw.on_error == "auto" else rw.on_error)
    accuracy_fn = get_reward_fn(getattr(task, "accuracy_reward", "exact_match"))
    return scorer, accuracy_fn


def build_rollout_engine(cfg: TrainConfig, model, tokenizer, *, record_logprobs: bool = False,
                         device: torch.device | None = None):
    """The ``rollout.engine`` over ``model`` with the ``rollout`` section's sampling settings; it records the
    sampler's log-probs when ``rollout.record_logprobs`` or ``record_logprobs`` (the objective needs them) says
    so, compiles the HF engine's decode step under ``loop.compile``, or else replays it as CUDA graphs under
    ``rollout.cuda_graphs`` when ``device`` (default: the model's) is a GPU."""
    device = device if device is not None else next(model.parameters()).device
    return ENGINES[cfg.rollout.engine](model, tokenizer, **_engine_options(cfg, device, record_logprobs))


def _engine_options(cfg: TrainConfig, device, record_logprobs: bool) -> dict:
    ro = cfg.rollout
    options = {"gpu_memory_utilization": ro.vllm_gpu_memory_utilization, "seed": cfg.loop.seed,
               "lora_sync": ro.vllm_lora_sync} if ro.engine == "vllm" else {}
    if ro.engine == "hf" and cfg.loop.compile:
        options["compile_decode"] = True
    elif ro.engine == "hf" and ro.cuda_graphs and torch.device(device).type == "cuda":
        options["cuda_graphs"] = True
    if ro.engine == "hf":
        options["lean_decode"] = ro.lean_decode
    return dict(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k,
                ignore_eos=ro.ignore_eos, record_logprobs=ro.record_logprobs or record_logprobs, **options)


def policy_factory(mc):
    """A picklable ``() -> (model, tokenizer)`` that builds ``model.name``'s architecture and dtype on the CPU: what
    the rollout worker runs (its initial weights do not matter, the pushed ones replace them)."""
    return functools.partial(load_model_and_tokenizer, mc.name, dtype=mc.dtype, seed=mc.init_seed)


def build_async_rollout(cfg: TrainConfig, model, model_factory, *, device: torch.device,
                        held: list | None = None, log=None, tokenizer=None) -> AsyncRollout:
    """The rollout worker of ``rollout.async_staleness`` = k >= 1, its schedule where a checkpoint left it.

    ``held``: the k weight versions before ``model``'s (oldest first, name → tensor; a checkpoint's), or None for a
    new run, whose first k + 1 steps all sample with the initial weights. Version 0 is ``held[0]``, versions
    1 … k − 1 the rest, version k ``model``'s weights: a step that trains after that sees ``held[0]``.
    The engine records the sampler's log-probs: they are the behaviour log-probs of a stale rollout. Under
    ``env.id`` it plays the episodes too (``multiturn.episode_spec``, with ``tokenizer``'s chat template). With
    k = 0 (not a config's choice: a test's) version 0 is ``model``'s weights.
    """
    ro = cfg.rollout
    k = ro.async_staleness
    if held is None:
        held = [dict(model_tensors(model))] * k
    spec = multiturn.episode_spec(cfg.env, ro, tokenizer) if cfg.env.id is not None else None
    engine = AsyncRollout(model_factory, model, staleness=k, device=device, threads=ro.async_threads,
                          timeout_s=ro.async_timeout_s, start_timeout_s=ro.async_start_timeout_s, log=log,
                          initial_weights=held[0] if k else None, episodes=spec,
                          **_engine_options(cfg, device, record_logprobs=True))
    try:
        for weights in held[1:] + ([model] if k else []):
            engine.push_weights(weights)
    except BaseException:
        engine.close()
        raise
    return engine


def build_reference(cfg: TrainConfig, model, device: torch.device):
    """The frozen reference model: ``model.ref_path`` when given, else a copy of ``model`` (a LoRA policy's
    merged weights); checked against the policy for TR-DPO's reference sync (``objective.ref_sync_steps``)."""
    if cfg.model.ref_path:
        ref, _ = load_model_and_tokenizer(cfg.model.ref_path, dtype=cfg.model.dtype, device=device)
    else:
        ref = copy.deepcopy(model)
        if cfg.model.lora.enabled and hasattr(ref, "merge_and_unload"):
            ref = ref.merge_and_unload()
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    if cfg.objective.ref_sync_steps > 0:
        check_sync_compatible(ref, model)
    return ref


def build_kl_controller(ob):
    """The β controller of the KL in the reward (``objective.kl_ctrl_*``), or None when it is off."""
    if not ob.kl_in_reward:
        return None
    return make_kl_controller(ob.kl_ctrl_type, ob.kl_reward_coef, ob.kl_ctrl_target, ob.kl_ctrl_horizon)


def logprob_settings(cfg: TrainConfig) -> LogprobSettings:
    """How this run takes log-probs: sampling temperature, prompt sharing (whole groups only; RLVCR's rows are
    not), microbatch size and autocast."""
    share = cfg.loop.share_prompt_prefix and not cfg.rlvcr.enabled
    return LogprobSettings(temperature=cfg.rollout.temperature,
                           group_size=cfg.rollout.completions_per_prompt if share else None,
                           seqs_per_microbatch=cfg.loop.seqs_per_microbatch, autocast=cfg.loop.autocast,
                           pack_sequences=cfg.loop.pack_sequences)


def update_settings(cfg: TrainConfig, device: torch.device) -> UpdateSettings:
    """The config values the update stage reads (``lmpo.trainer.step.update``), and the run's ``device``."""
    lp, ob = cfg.loop, cfg.objective
    return UpdateSettings(seed=lp.seed, epochs_per_step=lp.epochs_per_step, minibatches_per_step=lp.minibatches_per_step,
                          seqs_per_microbatch=lp.seqs_per_microbatch, max_grad_norm=cfg.optim.max_grad_norm,
                          off_policy=cfg.off_policy, temperature=cfg.rollout.temperature, autocast=lp.autocast,
                          logprobs=logprob_settings(cfg), device=device, ref_sync_steps=ob.ref_sync_steps,
                          ref_sync_alpha=ob.ref_sync_alpha)


def train_input(cfg: TrainConfig, estimator, objective: Objective, model, tokenizer, device: torch.device
                ) -> Callable[..., stages.TrainInput]:
    """What every RL step of the run trains on, chosen once: RLVCR's expansion of the sampled batch
    (``rlvcr.enabled``), per-turn credit over an environment's episodes (``env.turn_discount``), or the sampled
    batch with its advantages (``lmpo.trainer.step.stages.TrainInput``)."""
    ro = cfg.rollout
    if cfg.rlvcr.enabled:
        return stages.RLVCRInput(model, tokenizer, cfg.rlvcr, objective.advantage_scale, ro.temperature, ro.top_p,
                                 ro.top_k, cfg.loop.seed, device)
    if cfg.env.id is not None and cfg.env.turn_discount is not None:
        return multiturn.TurnCredit(estimator, cfg.env.turn_discount, device)
    return stages.sampled_input


@dataclass
class RunParts:
    """What ``build_run`` builds: the parts of a run that exist before training starts.

    objective, driver, estimator: ``build_objective``'s. task: ``build_task``'s (or the one given).
    model: the policy on its device, with gradient checkpointing and LoRA adapters when the config asks.
    train_examples, eval_examples: prompts rendered as text (chat template applied); an environment's raw.
    scorer, accuracy_fn: ``build_rewards``'. kl_ctrl: ``build_kl_controller``'s. teacher: a distillation
    part's teacher, or None. episode_runner: multi-turn (``env.id``) only. train_input: ``train_input``'s.
    """

    objective: Objective
    driver: ObjectiveDriver
    estimator: object
    task: object
    model: torch.nn.Module
    tokenizer: object
    train_examples: list
    eval_examples: list
    scorer: object
    accuracy_fn: Callable
    kl_ctrl: object | None
    teacher: Teacher | None
    episode_runner: multiturn.EpisodeRunner | None
    logprob_settings: LogprobSettings
    update_settings: UpdateSettings
    train_input: Callable[..., stages.TrainInput]


def build_run(config: TrainConfig, device: torch.device, objective: Objective, *, model=None, tokenizer=None,
              task=None) -> RunParts:
    """Everything ``Trainer(config)`` holds before ``train``, from the config and the objective its check built
    (``validate_config``'s return): ``model``, ``tokenizer`` and ``task``, when given, replace the ones the config
    names. Errors name the config keys to fix (InputError)."""
    objective, driver, estimator = build_objective(config.objective, objective)
    if config.env.id is not None:
        check_estimator(estimator, config.env.id, config.objective.advantage_estimator,
                                 config.env.turn_discount)
    try:  # a generated task checks its options when it first draws examples, so the draws are inside too
        task = task if task is not None else build_task(config.task, config.env)
        train_examples = task.train_examples(seed=config.loop.seed)
        eval_examples = task.eval_examples()[: config.task.eval_examples]
    except InputError:  # already names the key and the fix
        raise
    except TASK_ERRORS as e:
        raise task_error(config.task, e, config.env) from None
    if model is None:
        model, tok = load_policy(config.model, device)
        tokenizer = tokenizer or tok
    elif tokenizer is None:
        raise ValueError("Trainer(model=...) needs tokenizer=... as well")
    model = model.to(device)
    # conversational prompts become text through the policy's chat template (lmpo.tasks.chat)
    tk, names = config.task, {"model_name": f"model {config.model.name!r}", "source": f"task {task.name!r}"}
    if config.env.id is None:
        train_examples = render_prompts(train_examples, tokenizer, tk.prompt_format, tk.chat_template, **names)
        eval_examples = render_prompts(eval_examples, tokenizer, tk.prompt_format, tk.chat_template, **names)
        fix = ("Shorten or drop the long rows of the data, lower the completion budget, or train a model with a "
               "longer context.")
        check_prompt_lengths(train_examples, tokenizer, model, config.rollout.max_new_tokens,
                             budget="rollout.max_new_tokens", what=f"task {task.name!r}", fix=fix)
        eval_budget = ("eval.max_new_tokens", config.eval.max_new_tokens) if config.eval.max_new_tokens else \
            ("rollout.max_new_tokens", config.rollout.max_new_tokens)
        check_prompt_lengths(eval_examples, tokenizer, model, eval_budget[1], budget=eval_budget[0],
                             what=f"task {task.name!r} (held-out)", fix=fix)
    else:  # the episode runner renders each environment's opening itself
        train_examples, eval_examples = list(train_examples), list(eval_examples)
        multiturn.ensure_chat_template(tokenizer, config.env, config.model.name)
    scorer, accuracy_fn = build_rewards(config.rewards, task, train_examples + eval_examples, device)
    if config.loop.gradient_checkpointing:
        # non-reentrant: works with inputs that do not require grad and with LoRA's frozen base weights
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.model.lora.enabled:
        model = wrap_lora(model, config.model.lora)
    kl_ctrl = build_kl_controller(config.objective)
    teacher = None  # on-policy distillation (an objective `distill` part): lmpo.trainer.step.teacher
    if driver.needs.teacher:
        teacher = Teacher.load(config.teacher, model, tokenizer, policy_name=config.model.name, device=device,
                               top_k=driver.needs.teacher_top_k)
    runner = None  # built from the policy as trained: after the LoRA wrap
    if config.env.id is not None:
        ro = config.rollout
        runner = multiturn.make_runner(model, tokenizer, config.env, temperature=ro.temperature, top_p=ro.top_p,
                                      top_k=ro.top_k)
    return RunParts(objective, driver, estimator, task, model, tokenizer, train_examples, eval_examples, scorer,
                    accuracy_fn, kl_ctrl, teacher, runner, logprob_settings(config), update_settings(config, device),
                    train_input(config, estimator, objective, model, tokenizer, device))


def rollout_model_factory(config: TrainConfig, *, model=None, model_factory=None, rollout_engine=None):
    """``Trainer``'s ``model_factory`` argument checked against ``rollout.async_staleness`` = k: with k >= 1 the
    factory the rollout worker builds its model with (``policy_factory`` of ``model.name`` by default), else the
    one given (unused). An engine given with k >= 1, or a model given without a factory, is an InputError."""
    k = config.rollout.async_staleness
    if k and rollout_engine is not None:
        raise InputError(f"`rollout.async_staleness` = {k} builds its own rollout worker, but Trainer(rollout_"
                         "engine=...) was given one. Pass no rollout_engine, or use rollout.async_staleness: 0.")
    if k and model is not None and model_factory is None:
        raise InputError(f"`rollout.async_staleness` = {k} with Trainer(model=...): the rollout worker must "
                         "build its own copy of the model, and a model object cannot be sent to it. Pass "
                         "model_factory= (a picklable callable returning (model, tokenizer) of the same "
                         "architecture and dtype), or use rollout.async_staleness: 0.")
    return model_factory or (policy_factory(config.model) if k else None)


def build_async_pipeline(cfg: TrainConfig, model, model_factory, prompts: PromptOrder, *, start_step: int,
                         held: list | None, device: torch.device, log: Callable[[str], None],
                         tokenizer=None) -> AsyncPipeline:
    """The rollout worker of ``rollout.async_staleness`` (``build_async_rollout``) and its ``AsyncPipeline`` from
    RL step ``start_step``, going on from a checkpoint's weight versions ``held`` when they fit k."""
    if held is not None and len(held) != cfg.rollout.async_staleness:
        log(f"the checkpoint holds {len(held)} earlier weight versions, rollout.async_staleness is "
            f"{cfg.rollout.async_staleness}: the schedule starts again from the checkpoint's weights")
        held = None
    engine = build_async_rollout(cfg, model, model_factory, device=device, held=held, log=log, tokenizer=tokenizer)
    return AsyncPipeline(engine, prompts, start=start_step, last_step=cfg.loop.steps,
                         prompts_per_step=cfg.loop.prompts_per_step,
                         completions_per_prompt=cfg.rollout.completions_per_prompt, seed=cfg.loop.seed)


def build_logs(cfg: TrainConfig, run_dir: Path, *, start_step: int, keep_rows: int | None
               ) -> tuple[MetricsLogger, CompletionLog | None]:
    """The run's metrics logger (``logging.*``) from RL step ``start_step`` (keeping a checkpoint's ``keep_rows``
    rows of metrics.jsonl), and its completion log when ``logging.completions_every_steps`` > 0."""
    lg = cfg.logging
    metrics = MetricsLogger(run_dir, cfg.loop.steps, start_step=start_step, keep_rows=keep_rows,
                            progress_bar=lg.progress_bar, tensorboard=lg.tensorboard, wandb=lg.wandb,
                            wandb_project=lg.wandb_project, config=config_to_dict(cfg),
                            print_every_steps=lg.print_every_steps)
    completions = None
    if lg.completions_every_steps > 0:
        completions = CompletionLog(run_dir, lg.completions_every_steps, lg.completions_per_step,
                                    start_step=start_step, metrics=metrics)
    return metrics, completions
