"""Every bad input a user can give the CLI gets one paragraph naming the input, the value and the fix.

Each row of ``CASES`` is one parametrised test: it sets up the situation in a fresh directory, runs
``lmpo.cli.main`` there and checks the exit status (2 = bad input, 1 = failed run), that stderr holds one
``lmpo …:`` paragraph and no traceback, and that the message is the one docs/errors.md shows for that row.
The table in docs/errors.md is generated from these rows: ``python tests/cli/test_bad_inputs.py`` rewrites it.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

# ids other test modules register at import are not lmpo's (the docs list what lmpo ships)
pytestmark = pytest.mark.usefixtures("lmpo_envs_only")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"
START, END = "<!-- bad-inputs:start -->\n", "<!-- bad-inputs:end -->"

BASE = {
    "model": {"name": "tiny"},
    "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 1, "num_eval": 8}, "eval_examples": 4},
    "rollout": {"completions_per_prompt": 2, "max_new_tokens": 2},
    "loop": {"steps": 1, "prompts_per_step": 2, "seqs_per_microbatch": 4, "device": "cpu"},
    "eval": {"at_start": False},
    "logging": {"run_dir": "run", "progress_bar": False, "tensorboard": False},
}


def _write(path: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        p = d / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return setup


def _mkdir(path: str) -> Callable[[Path], None]:
    return lambda d: (d / path).mkdir(parents=True, exist_ok=True)


def _all(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for s in steps:
            s(d)
    return setup


def _base(d: Path) -> None:
    (d / "base.yaml").write_text(yaml.safe_dump(BASE))


def _file_task_base(d: Path) -> None:
    task = {"name": "file", "path": "data.jsonl", "eval_examples": 4}
    (d / "base.yaml").write_text(yaml.safe_dump({**BASE, "task": task}))


def _env_base(d: Path) -> None:
    """The base config without the addition task's options (a multi-turn run's examples come from its env)."""
    (d / "base.yaml").write_text(yaml.safe_dump({**BASE, "task": {"eval_examples": 4}}))


#: a user's environment file with a fault chosen by its `fault` option (`env.options.fault`), and one without an
#: expert, for the rows of environments that misbehave
FAULTY_ENV = """
import math
import time

from lmpo.envs import GuessNumberEnv, GuessNumberTask, LMEnv, register_env


@register_env("Faulty-v0", task=GuessNumberTask)
class FaultyEnv(GuessNumberEnv):
    def __init__(self, fault="raise"):
        super().__init__()
        self.fault = fault

    def reset(self, example=None, seed=None):
        if self.fault == "reset":
            raise FileNotFoundError("levels/level-3.json")
        return super().reset(example, seed)

    def step(self, action):
        if self.fault == "raise":
            raise ConnectionError("the game server went away")
        if self.fault == "hang":
            time.sleep(3600)
        result = super().step(action)
        if self.fault == "role":
            return result._replace(observation=[{"role": "assistant", "content": "Higher."}])
        return result._replace(reward=math.nan)


@register_env("NoExpert-v0", task=GuessNumberTask)
class NoExpertEnv(GuessNumberEnv):
    expert_action = LMEnv.expert_action
"""


def _faulty_env(d: Path) -> None:
    """The multi-turn base config and the faulty environment file (the untrained tiny model ends most of its turns
    within the default 256-token turn budget, so that the environment gets to answer them)."""
    _env_base(d)
    (d / "faulty_env.py").write_text(FAULTY_ENV)


def _plain_model(d: Path) -> None:
    """A saved tiny model whose character tokenizer has no chat template."""
    from lmpo.models import CharTokenizer, build_tiny_model

    _env_base(d)
    tok = CharTokenizer()
    build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32).save_pretrained(
        d / "plain_model")
    tok.save_pretrained(d / "plain_model")


def _stored_run(d: Path) -> None:
    """A trainer run directory with its config and metrics but no checkpoint yet."""
    from lmpo.trainer.config import config_from_dict, save_config

    _base(d)
    (d / "run").mkdir()
    save_config(config_from_dict(BASE), d / "run" / "config.yaml")
    (d / "run" / "metrics.jsonl").write_text('{"step": 1, "kind": "train"}\n')


def _broken_checkpoint(d: Path) -> None:
    _stored_run(d)
    ck = d / "run" / "checkpoints" / "step_00000001"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{}")
    manifest = {"format": "lmpo-checkpoint", "version": 1, "step": 1,
                "files": {"state.json": {"bytes": 2, "sha256": "0" * 64}}}
    (ck / "manifest.json").write_text(json.dumps(manifest))


def _sac_run_without_checkpoint(d: Path) -> None:
    from lmpo.runs import write_run_config
    from lmpo.textagent.sac.config import TrainConfig

    (d / "sacrun").mkdir()
    write_run_config(d / "sacrun", TrainConfig().to_dict())


def _sac_summary_without_checkpoint(d: Path) -> None:
    """A SAC run whose summary.json survived but whose checkpoints did not."""
    from lmpo.textagent.sac.config import TrainConfig

    _sac_run_without_checkpoint(d)
    (d / "sacrun" / "summary.json").write_text(json.dumps({"config": TrainConfig().to_dict()}))


def _other_tokenizer_teacher(d: Path) -> None:
    """A saved tiny model whose character tokenizer has two more characters than the built-in one."""
    from lmpo.models import CharTokenizer, build_tiny_model

    _base(d)
    tok = CharTokenizer(extra_chars="éü")
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    model.save_pretrained(d / "teacher")
    tok.save_pretrained(d / "teacher")


def failing_reward(completions, **kwargs):
    """A user reward function with a bug (named in a config as ``test_bad_inputs:failing_reward``)."""
    raise ValueError("this reward cannot score a completion")


def exiting_reward(completions, **kwargs):
    """A user reward function that ends the process (``test_bad_inputs:exiting_reward``)."""
    sys.exit(0)


def nan_reward(completions, **kwargs):
    """A user reward function that returns NaN (``test_bad_inputs:nan_reward``)."""
    return [float("nan")] * len(completions)


def _link(path: str, target: str) -> Callable[[Path], None]:
    """``path`` (inside the case's directory) becomes a symbolic link to ``target`` (relative to the link)."""
    def setup(d: Path) -> None:
        p = d / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.unlink(missing_ok=True)
        p.symlink_to(target)
    return setup


def _stored_run_naming_code(d: Path) -> None:
    """A stored run whose config.yaml names a user reward function (planted there, or copied from elsewhere)."""
    _stored_run(d)
    stored = yaml.safe_load((d / "run" / "config.yaml").read_text())
    stored["rewards"]["functions"] = ["exact_match", "test_bad_inputs:failing_reward"]
    (d / "run" / "config.yaml").write_text(yaml.safe_dump(stored))


def _nan_model(d: Path) -> None:
    """A saved tiny model one of whose weights is NaN (a run that diverged)."""
    import torch

    from lmpo.models import CharTokenizer, build_tiny_model

    tok = CharTokenizer()
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    model.save_pretrained(d / "nanmodel")
    tok.save_pretrained(d / "nanmodel")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    situation: str
    exit: int = 2
    setup: Callable[[Path], None] | None = None
    needs_no_cuda: bool = False
    env: tuple[tuple[str, str], ...] = ()  # environment variables set while the case runs


T = ("train", "base.yaml")
S = ("sac", "train", "--run-dir", "sacrun", "--quiet")
CASES: list[Case] = [
    # ---- lmpo train: the config file
    Case("config-missing", ("train", "nope.yaml"), "the config file does not exist"),
    Case("config-dir", ("train", "configs"), "the config file is a directory", setup=_mkdir("configs")),
    Case("config-yaml", ("train", "bad.yaml"), "malformed YAML (an unclosed list)",
         setup=_write("bad.yaml", "loop:\n  steps: [1\n")),
    Case("config-list", ("train", "list.yaml"), "YAML that is a list, not a mapping", setup=_write("list.yaml", "- 1\n")),
    Case("config-python-tag", ("train", "evil.yaml"), "a YAML tag that would build a Python object",
         setup=_write("evil.yaml", "loop: !!python/object/apply:os.system ['echo pwned']\n")),
    Case("config-not-utf8", ("train", "latin1.yaml"), "a config file in Latin-1",
         setup=_write("latin1.yaml", "task:\n  name: caf\xe9\n".encode("latin-1"))),
    # ---- lmpo train: keys, types and ranges
    Case("unknown-section", (*T, "--optimizer.lr", "1e-4"), "a section name with a typo", setup=_base),
    Case("unknown-key", (*T, "--loop.prompt_per_step", "8"), "a key with a typo", setup=_base),
    Case("not-an-int", (*T, "--loop.steps", "many"), "a word where an integer belongs", setup=_base),
    Case("lr-inf", (*T, "--optim.lr", ".inf"), "an infinite learning rate (`optim.lr: .inf`)", setup=_base),
    Case("lr-nan", (*T, "--optim.lr", "nan"), "a NaN learning rate", setup=_base),
    Case("lr-negative", (*T, "--optim.lr", "-1e-4"), "a negative learning rate", setup=_base),
    Case("top-p", (*T, "--rollout.top_p", "1.5"), "nucleus mass above 1", setup=_base),
    Case("temperature", (*T, "--rollout.temperature", "0"), "temperature 0", setup=_base),
    Case("group-of-one", (*T, "--rollout.completions_per_prompt", "1"), "GRPO with one completion per prompt",
         setup=_base),
    Case("minibatch-split", (*T, "--loop.minibatches_per_step", "3"), "minibatches that do not divide the batch",
         setup=_base),
    Case("device-unknown", (*T, "--loop.device", "tpu"), "an unknown device", setup=_base),
    Case("device-cuda", (*T, "--loop.device", "cuda"), "`cuda` on a machine without CUDA", setup=_base,
         needs_no_cuda=True),
    Case("dtype", (*T, "--model.dtype", "fp8"), "an unsupported dtype", setup=_base),
    Case("betas", (*T, "--optim.betas", "[0.9, 1.5]"), "an AdamW beta above 1", setup=_base),
    Case("keep-last", (*T, "--checkpoint.keep_last", "-1"), "a negative checkpoint count", setup=_base),
    Case("sft-accuracy", (*T, "--sft.stop_at_accuracy", "2"), "an accuracy above 1", setup=_base),
    Case("override-no-value", (*T, "--loop.steps"), "an override without a value", setup=_base),
    # ---- lmpo train: model
    Case("model-missing-dir", (*T, "--model.name", "./my_model"), "a model directory that does not exist",
         setup=_base),
    Case("model-empty-dir", (*T, "--model.name", "empty_model"), "an empty model directory",
         setup=_all(_base, _mkdir("empty_model"))),
    Case("model-no-config", (*T, "--model.name", "half_model"), "a model directory without config.json",
         setup=_all(_base, _write("half_model/model.safetensors", "x"))),
    Case("model-file", (*T, "--model.name", "base.yaml"), "a file as the model", setup=_base),
    Case("model-not-a-name", (*T, "--model.name", "gpt"), "a name that is neither a preset nor a path",
         setup=_base),
    Case("model-missing-run-dir", (*T, "--model.name", "runs/does_not_exist"),
         "a model under `runs/` that does not exist (refused at once, never looked up on the Hub)", setup=_base),
    Case("model-missing-warmup", ("train", "warm.yaml"),
         "a model directory that the config's comments say a warm-up command writes, not written yet",
         setup=_write("warm.yaml", "# warm-up first:\n#   python warm_up.py --steps 10 \\\n#       --save runs/warm\n"
                      + yaml.safe_dump({**BASE, "model": {"name": "runs/warm"}}))),
    Case("model-hub-offline", (*T, "--model.name", "no-such-org/no-such-model"),
         "a hub id that is not cached while the Hub is offline (`HF_HUB_OFFLINE=1`)", setup=_base,
         env=(("HF_HUB_OFFLINE", "1"),)),
    Case("model-pickle-weights", (*T, "--model.name", "pickled"),
         "a model directory holding `pytorch_model.bin` (pickle-format weights)",
         setup=_all(_base, _write("pickled/config.json", "{}"), _write("pickled/pytorch_model.bin", b"\x80\x02N."))),
    # ---- lmpo train: task and data
    Case("task-typo", (*T, "--task.name", "additon"), "a task name with a typo", setup=_base),
    Case("task-file-no-path", (*T, "--task.name", "file"), "`task.name: file` without a path", setup=_base),
    Case("task-path-missing", (*T, "--task.name", "file", "--task.path", "data.jsonl"), "a data file that does not exist",
         setup=_base),
    Case("task-path-dir", (*T, "--task.name", "file", "--task.path", "data"), "a directory as `task.path`",
         setup=_all(_base, _mkdir("data"))),
    Case("task-not-utf8", (*T, "--task.path", "gbk.jsonl"), "a data file that is not UTF-8",
         setup=_all(_file_task_base, _write("gbk.jsonl", '{"prompt": "1+1=", "answer": "二"}\n'.encode("gbk")))),
    Case("task-bad-json", (*T, "--task.path", "bad.jsonl"), "a JSONL line that is not JSON",
         setup=_all(_file_task_base, _write("bad.jsonl", '{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n'))),
    Case("task-missing-field", (*T, "--task.path", "rows.jsonl"), "rows without an answer field",
         setup=_all(_file_task_base, _write("rows.jsonl", '{"prompt": "1+1=", "solution": "2"}\n'))),
    Case("task-bad-option", (*T, "--task.options.max_digits", "0"), "a task option out of range", setup=_base),
    Case("task-too-few-prompts", (*T, "--env.id", "ToolArithmetic-v0", "--task.options.left_digits", "1",
                                  "--task.options.right_digits", "1"),
         "task options leaving fewer distinct prompts than the held-out set needs", setup=_env_base),
    Case("rg-dataset-typo", (*T, "--task.name", "reasoning_gym/chain_summ"), "a reasoning-gym dataset with a typo",
         setup=_env_base),
    Case("rg-prompt-template", (*T, "--task.name", "reasoning_gym/chain_sum", "--task.options.prompt_template",
                                '"{metadata[nope]}"'), "a reasoning-gym prompt template naming a missing field",
         setup=_env_base),
    Case("rg-config", (*T, "--task.name", "reasoning_gym/chain_sum", "--task.options.config.max_terms", "0"),
         "a reasoning-gym config its generator rejects", setup=_env_base),
    # ---- lmpo train: multi-turn environments (env section)
    Case("env-typo", (*T, "--env.id", "ToolArithmetc-v0"), "an environment id with a typo", setup=_base),
    Case("env-without-id", (*T, "--env.budget.max_turns", "2"), "an episode budget without an environment",
         setup=_base),
    Case("env-remax", (*T, "--env.id", "GuessNumber-v0", "--objective.advantage_estimator", "remax"),
         "an estimator that needs a greedy single-turn baseline, with an environment", setup=_env_base),
    Case("env-no-chat-template", (*T, "--env.id", "GuessNumber-v0", "--model.name", "plain_model"),
         "an environment with a model whose tokenizer has no chat template", setup=_plain_model),
    Case("env-import-missing", (*T, "--env.import", "my_env.py", "--env.id", "Mine-v0"),
         "`env.import` naming a file that does not exist", setup=_env_base),
    Case("env-import-raises", (*T, "--env.import", "my_env.py", "--env.id", "Mine-v0"),
         "`env.import` naming a file whose import raises",
         setup=_all(_env_base, _write("my_env.py", "raise RuntimeError('set MY_API_KEY first')\n"))),
    Case("env-step-raises", (*T, "--env.import", "faulty_env.py", "--env.id", "Faulty-v0", "--env.options.fault",
                             "raise"), "a user environment whose `step` raises", exit=1, setup=_faulty_env),
    Case("env-step-hangs", (*T, "--env.import", "faulty_env.py", "--env.id", "Faulty-v0", "--env.options.fault",
                            "hang", "--env.step_timeout_s", "0.5"), "a user environment whose `step` hangs", exit=1,
         setup=_faulty_env),
    Case("env-bad-observation", (*T, "--env.import", "faulty_env.py", "--env.id", "Faulty-v0",
                                 "--env.options.fault", "role"),
         "a user environment whose observation has the assistant's role", exit=1, setup=_faulty_env),
    Case("env-nan-reward", (*T, "--env.import", "faulty_env.py", "--env.id", "Faulty-v0", "--env.options.fault",
                            "nan"), "a user environment whose reward is NaN", exit=1, setup=_faulty_env),
    Case("env-reset-raises", (*T, "--env.import", "faulty_env.py", "--env.id", "Faulty-v0", "--env.options.fault",
                              "reset"), "a user environment whose `reset` raises", exit=1, setup=_faulty_env),
    Case("env-warmup-no-expert", (*T, "--env.import", "faulty_env.py", "--env.id", "NoExpert-v0", "--sft.steps", "10"),
         "a warm-up on an environment without an expert", setup=_faulty_env),
    Case("env-warmup-cut", (*T, "--env.id", "ToolArithmetic-v0", "--sft.steps", "10",
                            "--env.budget.max_new_tokens_per_turn", "40"),
         "a warm-up whose turn budget cuts the expert's tool call", setup=_env_base),
    # ---- lmpo train: objective and rewards
    Case("preset-typo", (*T, "--objective.preset", "grpoo"), "an objective preset with a typo", setup=_base),
    Case("objective-override", (*T, "--objective.overrides.eps_hihg", "0.3"), "an objective field with a typo",
         setup=_base),
    Case("estimator", (*T, "--objective.advantage_estimator", "gae"), "an unknown advantage estimator", setup=_base),
    Case("kl-ctrl-without-kl-in-reward", (*T, "--objective.kl_ctrl_type", "adaptive"),
         "the adaptive KL controller without the KL in the reward", setup=_base),
    Case("kl-ctrl-zero-target", (*T, "--objective.kl_in_reward", "true", "--objective.kl_ctrl_type", "adaptive",
                                 "--objective.kl_ctrl_target", "0"), "an adaptive KL controller with target 0",
         setup=_base),
    Case("ref-sync-without-reference", (*T, "--objective.ref_sync_steps", "4"),
         "reference sync in a run without a reference model", setup=_base),
    Case("estimator-option", (*T, "--objective.advantage_estimator", "reinforce_plus_plus",
                              "--objective.advantage_options.whitten", "sequences"),
         "an advantage-estimator option with a typo", setup=_base),
    Case("reward-typo", (*T, "--rewards.functions", "[exact_mach]"), "a reward name with a typo", setup=_base),
    Case("reward-import", (*T, "--rewards.functions", "[no_such_pkg.rewards:score]"),
         "a reward function whose module does not import", setup=_base),
    Case("reward-weights", (*T, "--rewards.functions", "[exact_match]", "--rewards.weights", "[1, 2]"),
         "more weights than reward functions", setup=_base),
    Case("reward-on-error", (*T, "--rewards.on_error", "ignore"), "an unknown `on_error` policy", setup=_base),
    Case("reward-raises", (*T, "--rewards.functions", "[test_bad_inputs:failing_reward]"),
         "a user's reward function that raises",
         exit=1, setup=_base),
    Case("threads", (*T, "--loop.num_threads", "1e9"), "an absurd thread count", setup=_base),
    Case("overlong-buffer", (*T, "--rewards.overlong_buffer_len", "4"),
         "an overlong buffer longer than the completion budget", setup=_base),
    Case("mask-truncated-ignore-eos", (*T, "--objective.mask_truncated_completions", "true", "--rollout.ignore_eos",
                                       "true"), "masking truncated completions when none can end", setup=_base),
    Case("dynamic-sampling-exhausted", (*T, "--rollout.dynamic_sampling", "true",
                                        "--rollout.dynamic_sampling_max_draws", "2", "--rewards.functions",
                                        "[exact_match]", "--rewards.weights", "[0]"),
         "dynamic sampling with a reward that never varies", exit=1, setup=_base),
    Case("distill-without-teacher", (*T, "--objective.overrides.distill", "gkd_jsd"),
         "a distillation objective without a teacher", setup=_base),
    Case("teacher-without-distill", (*T, "--teacher.name", "tiny"), "a teacher that no objective part uses",
         setup=_base),
    Case("teacher-tokenizer", (*T, "--objective.overrides.distill", "reverse_kl", "--teacher.name", "teacher"),
         "a teacher with another tokenizer than the policy", setup=_other_tokenizer_teacher),
    Case("async-dynamic-sampling", (*T, "--rollout.async_staleness", "1", "--rollout.dynamic_sampling", "true"),
         "a stale rollout worker with dynamic sampling", setup=_base),
    Case("async-threads-idle", (*T, "--rollout.async_threads", "2"),
         "worker threads without a rollout worker", setup=_base),
    Case("rlvcr-levels", (*T, "--rlvcr.levels", "1"), "one thinking level", setup=_base),
    Case("rlvcr-budgets", (*T, "--rlvcr.budgets", "[8, 4, 16, 32]"), "thinking budgets not increasing", setup=_base),
    # ---- lmpo train: run directories and --resume
    Case("run-exists", T, "a second run into a directory that holds one", setup=_stored_run),
    Case("resume-and-overwrite", (*T, "--resume", "--overwrite"), "`--resume` and `--overwrite` together",
         setup=_stored_run),
    Case("resume-nothing", (*T, "--resume"), "`--resume` where no run was ever started", setup=_base),
    Case("resume-no-checkpoint", (*T, "--resume"), "`--resume` of a run killed before its first checkpoint",
         setup=_stored_run),
    Case("resume-changed-config", (*T, "--resume", "--optim.lr", "1e-3", "--objective.preset", "dapo"),
         "`--resume` with a changed learning rate and objective", setup=_stored_run),
    Case("resume-broken-checkpoint", (*T, "--resume"), "`--resume` when the only checkpoint is damaged",
         setup=_broken_checkpoint),
    Case("resume-bad-path", (*T, "--resume", "elsewhere"), "`--resume PATH` that is no checkpoint", setup=_base),
    Case("run-dir-not-creatable", (*T, "--logging.run_dir", "base.yaml/run"), "a run directory inside a file",
         setup=_base),
    Case("run-dir-is-file", (*T, "--logging.run_dir", "base.yaml"), "a file as the run directory", setup=_base),
    # ---- lmpo plot
    Case("plot-no-metrics", ("plot", "empty"), "a directory without metrics.jsonl", setup=_mkdir("empty")),
    Case("plot-damaged", ("plot", "run"), "a metrics file with a damaged line",
         setup=_write("run/metrics.jsonl", '{"step": 1}\n\x80\x81 not json\n{"step": 2}\n')),
    # ---- lmpo sac train
    Case("sac-seed", (*S, "--seed", "abc"), "a word as the seed"),
    Case("sac-tau", (*S, "--sac.tau", "-0.5"), "a negative Polyak rate"),
    Case("sac-gamma", (*S, "--sac.gamma", "1"), "discount 1"),
    Case("sac-alpha", (*S, "--sac.alpha_init", "5"), "an initial temperature above its bound"),
    Case("sac-unknown", (*S, "--sac.top_pp", "0.9"), "a SAC key with a typo"),
    Case("sac-choice", (*S, "--sac.policy_set", "all"), "an unknown policy set"),
    Case("sac-batch", (*S, "--replay.transitions_per_batch", "1"), "a batch of one transition"),
    Case("sac-budget", (*S, "--time_budget_s", "-1"), "a negative time budget"),
    Case("sac-env-range", (*S, "--env.window_chars", "0"), "an empty observation window"),
    Case("sac-window-too-long",
         (*S, "--extra_train_corpus", "[]", "--corpus_share", "0", "--env.window_chars", "4000"),
         "a window longer than every chapter"),
    Case("sac-corpus-share", (*S, "--extra_train_corpus", "[]"), "a corpus share with no extra text to weigh it against"),
    Case("sac-bc-rows-empty", (*S, "--sac.bc_rows", "none", "--sac.bc_text_batch", "0"),
         "BC told to read neither replay rows nor text windows"),
    Case("sac-window-range", (*S, "--env.window_chars", "100000"), "a window above the 4,096-character bound"),
    Case("sac-env-unknown", (*S, "--env.windw_chars", "8"), "an environment key with a typo"),
    Case("sac-blacklist-missing", (*S, "--env.blacklist_path", "missing.txt"), "a blacklist file that does not exist"),
    Case("sac-corpus-missing", (*S, "--corpus", "missing.txt"), "a corpus that does not exist"),
    Case("sac-corpus-not-utf8", (*S, "--corpus", "gbk.txt"), "a corpus that is not UTF-8",
         setup=_write("gbk.txt", "子曰学而时习之\n".encode("gbk"))),
    Case("sac-device", (*S, "--device", "cuda"), "`cuda` on a machine without CUDA", needs_no_cuda=True),
    Case("sac-config-missing", (*S, "--config", "nope.yaml"), "a config file that does not exist"),
    Case("sac-resume-no-dir", ("sac", "train", "--resume"), "`--resume` without `--run-dir`"),
    Case("sac-eval-only", (*S, "--eval-only"), "`--eval-only` without `--resume`"),
    Case("sac-resume-nothing", (*S, "--resume"), "`--resume` of a directory that holds no run", setup=_mkdir("sacrun")),
    Case("sac-resume-no-checkpoint", (*S, "--resume"), "`--resume` of a run killed before its first checkpoint",
         setup=_sac_run_without_checkpoint),
    # ---- lmpo train --from-trl: TRL GRPOConfig names
    Case("trl-unknown-key", ("train", "--from-trl", "grpo.yaml"), "a TRL config with a key GRPOConfig does not have",
         setup=_write("grpo.yaml", "num_generation: 4\n")),
    Case("trl-refused-key", ("train", "--from-trl", "grpo.yaml"), "a TRL setting lmpo cannot honour",
         setup=_write("grpo.yaml", "num_generations: 4\nfp16: true\n")),
    Case("trl-alias-conflict", ("train", "alias.yaml"), "a TRL alias contradicting the lmpo key it sets",
         setup=_write("alias.yaml", "num_generations: 4\nrollout: {completions_per_prompt: 8}\n")),
    # ---- lmpo export / lmpo eval RUN
    Case("export-missing-run", ("export", "nope", "out"), "a run directory that does not exist"),
    Case("export-not-a-run", ("export", "empty", "out"), "a directory that is not a run", setup=_mkdir("empty")),
    Case("export-no-checkpoint", ("export", "run", "out"), "a run stopped before its first checkpoint",
         setup=_stored_run),
    Case("export-broken", ("export", "run", "out"), "a run whose only checkpoint is damaged",
         setup=_broken_checkpoint),
    Case("export-step", ("export", "run", "out", "--step", "5"), "a step the run has no checkpoint of",
         setup=_broken_checkpoint),
    Case("export-out-exists", ("export", "run", "out"), "an output directory that holds files",
         setup=_all(_broken_checkpoint, _write("out/x.txt", "x"))),
    Case("eval-no-task", ("eval", "tiny"), "a model without `--task` (only a run brings its own)"),
    Case("eval-samples", ("eval", "tiny", "--task", "addition", "--samples", "-4"), "a negative number of samples"),
    # ---- lmpo show
    Case("show-no-log", ("show", "run"), "a run that logged no completions", setup=_stored_run),
    Case("show-step", ("show", "run", "--step", "3"), "a step whose completions were not logged",
         setup=_write("run/completions.jsonl", '{"step": 5, "prompt": "1+1=", "completion": "2"}\n')),
    Case("sac-run-exists", S, "a second run into a directory that holds one", setup=_sac_run_without_checkpoint),
    # ---- lmpo sac sample / gate
    Case("sample-missing", ("sac", "sample", "nope", "--prompt", "子曰"), "a run directory that does not exist"),
    Case("sample-not-a-run", ("sac", "sample", "empty", "--prompt", "子曰"), "a directory that is not a run",
         setup=_mkdir("empty")),
    Case("sample-no-checkpoint", ("sac", "sample", "sacrun", "--prompt", "子曰"), "a run without a checkpoint",
         setup=_sac_run_without_checkpoint),
    Case("sample-seed", ("sac", "sample", "sacrun", "--prompt", "子曰", "--seed", "abc"), "a word as the seed"),
    Case("gate-nothing", ("sac", "gate"), "no runs to judge"),
    Case("gate-unfinished", ("sac", "gate", "sacrun"), "a run without summary.json",
         setup=_sac_run_without_checkpoint),
    Case("gate-damaged", ("sac", "gate", "sacrun"), "a summary.json that is not JSON",
         setup=_write("sacrun/summary.json", "\x80 not json")),
    Case("gate-overrides", ("sac", "gate", "sacrun", "--sac.tau", "0.1"), "config overrides without `--train`"),
    Case("gate-train-no-out", ("sac", "gate", "--train"), "`--train` without `--out`"),
    Case("gate-reference-missing", ("sac", "gate", "--train", "--out", "g", "--reference", "noref"),
         "`--reference` that holds no reference run"),
    Case("gate-train-reference-alone", ("sac", "gate", "sacrun", "--train-reference"),
         "`--train-reference` without `--train`"),
    Case("sac-init-policy-missing", ("sac", "train", "--init_policy", "noref"),
         "`init_policy` naming a directory without reference weights"),
    Case("reference-steps", ("sac", "reference", "--run-dir", "r", "--steps", "0"), "`--steps 0` for the reference"),
    Case("gate-heldout-missing", ("sac", "gate", "sacrun", "--heldout", "nope.json"),
         "a `--heldout` file that does not exist", setup=_sac_summary_without_checkpoint),
    Case("gate-heldout-bad", ("sac", "gate", "sacrun", "--heldout", "held.json"),
         "a `--heldout` JSON file that is not a list of chapters",
         setup=_all(_sac_summary_without_checkpoint, _write("held.json", "[1, 2]"))),
    Case("gate-heldout-no-checkpoint", ("sac", "gate", "sacrun", "--heldout", "held.txt"),
         "`--heldout` with a run that has no checkpoint",
         setup=_all(_sac_summary_without_checkpoint, _write("held.txt", "子曰學而時習之不亦說乎。\n"))),
    # ---- run directories, data rows and rewards that must not act, freeze or pass silently
    Case("run-dir-link", (*T, "--resume"), "a run directory whose metrics.jsonl is a link out of it",
         setup=_all(_stored_run, _write("victim.txt", "not lmpo's"), _link("run/metrics.jsonl", "../victim.txt"))),
    Case("sac-run-dir-link", (*S, "--resume"), "a SAC run directory whose tensorboard/ is a link out of it",
         setup=_all(_sac_run_without_checkpoint, _mkdir("elsewhere"), _link("sacrun/tensorboard", "../elsewhere"))),
    Case("plot-link", ("plot", "run"), "a run whose plots/reward.png is a link out of it",
         setup=_all(_write("run/metrics.jsonl", '{"step": 1, "kind": "train", "reward/mean": 0.5}\n'),
                    _write("victim.png", "not lmpo's"), _link("run/plots/reward.png", "../../victim.png"))),
    Case("plot-python-tag", ("plot", "run"), "a run whose stored config holds a YAML tag that would run code",
         setup=_all(_write("run/metrics.jsonl", '{"step": 1, "kind": "train", "reward/mean": 0.5}\n'),
                    _write("run/config.yaml", "loop: !!python/object/apply:os.system ['echo pwned']\n"))),
    Case("resume-stored-import", ("train", "--resume", "run"), "`--resume RUN` whose stored config names a "
         "`module:function` reward", setup=_stored_run_naming_code),
    Case("reward-exit", (*T, "--rewards.functions", "[test_bad_inputs:exiting_reward]"),
         "a user's reward function that calls `sys.exit(0)`", exit=1, setup=_base),
    Case("reward-nan", (*T, "--rewards.functions", "[test_bad_inputs:nan_reward]"),
         "a user's reward function that returns NaN", exit=1, setup=_base),
    Case("task-null-answer", (*T, "--task.path", "rows.jsonl"), "a data row whose answer is null",
         setup=_all(_file_task_base, _write("rows.jsonl", '{"prompt": "1+1=", "answer": "2"}\n'
                                                         '{"prompt": "2+2=", "answer": null}\n'))),
    Case("task-object-answer", (*T, "--task.path", "rows.jsonl"), "a data row whose answer is a JSON object",
         setup=_all(_file_task_base, _write("rows.jsonl", '{"prompt": "1+1=", "answer": {"value": 2}}\n'))),
    Case("task-prompt-too-long", (*T, "--task.path", "rows.jsonl"),
         "a data row whose prompt is longer than the model's context",
         setup=_all(_file_task_base, _write("rows.jsonl", "".join(
             json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in ["1+1=", "1+" * 5000 + "1="] * 4)))),
    Case("eval-nan-weights", ("eval", "nanmodel", "--task", "addition", "--n", "2"),
         "a model whose weights hold NaN", setup=_nan_model),
]


def run_case(case: Case, d: Path) -> tuple[int, str, str]:
    """Run one case in directory ``d``; returns (exit status, stderr, the normalised one-paragraph message)."""
    from lmpo.cli import main

    if case.setup is not None:
        case.setup(d)
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    saved_env = {name: os.environ.get(name) for name, _ in case.env}
    os.environ.update(dict(case.env))
    os.chdir(d)
    registered = _user_env_state()
    try:
        with redirect_stderr(err), redirect_stdout(out):
            try:
                code = main(list(case.argv))
            except SystemExit as e:  # argparse's own usage errors
                code = int(e.code or 0)
    finally:
        os.chdir(cwd)
        _forget_user_envs(*registered)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    text = err.getvalue()
    lines = [ln for ln in text.splitlines() if ln.startswith("lmpo")]
    message = lines[-1] if lines else ""
    for real in {str(d), str(d.resolve())}:
        message = message.replace(real, "<dir>")
    message = re.sub(r"torch \d+\.\d+\.\d+[^\s;,]*", "torch <version>", message)
    return code, text, message


def _user_env_state() -> tuple:
    from lmpo.envs import ENVS, plugins

    return dict(ENVS), dict(plugins._imported)


def _forget_user_envs(envs: dict, imported: dict) -> None:
    """What a case's `env.import` registered and imported is forgotten, as when its command's process ends."""
    from lmpo.envs import ENVS, plugins

    for name in set(plugins._imported.values()) - set(imported.values()):
        sys.modules.pop(name, None)
    ENVS.clear()
    ENVS.update(envs)
    plugins._imported.clear()
    plugins._imported.update(imported)


def _row(case: Case, code: int, message: str) -> str:
    cells = ["`lmpo " + " ".join(case.argv) + "`", case.situation, str(code), message.replace("|", "\\|")]
    return "| " + " | ".join(cells) + " |"


def documented_rows() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index(START) + len(START): text.index(END)]
    rows = {}
    for line in block.splitlines():
        m = re.match(r"^\| <a id=\"([a-z0-9-]+)\"></a>(.*)$", line)
        if m:
            rows[m.group(1)] = "|" + m.group(2)
    return rows


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread, monkeypatch, tmp_path):
    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    yield


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_one_paragraph(case: Case, tmp_path):
    if case.needs_no_cuda:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    code, stderr, message = run_case(case, tmp_path)
    assert "Traceback" not in stderr, stderr
    assert code == case.exit, stderr
    assert message, f"no `lmpo …:` message on stderr: {stderr!r}"
    assert len([ln for ln in stderr.splitlines() if ln.startswith("lmpo")]) == 1, stderr
    documented = documented_rows().get(case.id)
    assert documented == _row(case, code, message), (
        "docs/errors.md is stale for this row; run `make docs` (it runs `python tests/cli/test_bad_inputs.py`)")


def test_doc_table_has_exactly_the_cases():
    assert list(documented_rows()) == [c.id for c in CASES]


def render_table() -> str:
    import tempfile

    lines = ["| command | situation | exit | message |", "|---|---|---|---|"]
    for case in CASES:
        with tempfile.TemporaryDirectory() as d:
            code, _, message = run_case(case, Path(d))
        lines.append(f"| <a id=\"{case.id}\"></a>" + _row(case, code, message)[1:])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python tests/cli/test_bad_inputs.py  → rewrites the table in docs/errors.md
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("LMPO_CACHE_DIR", str(Path(__import__("tempfile").mkdtemp()) / "cache"))
    sys.path.insert(0, str(ROOT / "src"))
    text = DOC.read_text(encoding="utf-8")
    new = text[: text.index(START) + len(START)] + render_table() + text[text.index(END):]
    DOC.write_text(new, encoding="utf-8")
    print(f"{DOC}: {'updated' if new != text else 'up to date'}")
