"""A user's own environment, as docs/multiturn.md tells a new user to write it: the page's unit-conversion file
(task, tool, environment) checked, trained through `lmpo train` with `env.import` (warm-up on its expert, then RL),
shown with `lmpo show` and evaluated with `lmpo eval RUN`; an installed package's `lmpo.envs` entry point; and
what `env.import` says when it cannot import."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from lmpo.envs import ENVS
from lmpo.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "multiturn.md"


def doc_block(heading: str, lang: str, index: int = 0) -> str:
    """The ``index``-th ```lang block of the docs/multiturn.md section under ``heading``."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(f"\n{heading}\n"):]
    section = section[: section.index("\n### ", 1)] if "\n### " in section[1:] else section
    fence = f"```{lang}\n"
    start = -1
    for _ in range(index + 1):
        start = section.index(fence, start + 1)
    body = section[start + len(fence):]
    return body[: body.index("```")]


@pytest.fixture
def registry(tmp_path):
    """Environments a test registers and the modules it imports from ``tmp_path`` are forgotten afterwards (the
    registry and ``sys.modules`` are the process's)."""
    from lmpo.envs import plugins

    envs, imported = dict(ENVS), dict(plugins._imported)
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    ENVS.clear()
    ENVS.update(envs)
    plugins._imported.clear()
    plugins._imported.update(imported)


def lmpo(*argv: str, cwd: Path) -> tuple[int, str, str]:
    from lmpo.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def write_unit_convert(d: Path) -> Path:
    """docs/multiturn.md's two blocks ("Writing a task", then "Your own environment, end to end") as one file."""
    path = d / "unit_convert.py"
    path.write_text(doc_block("### Writing a task", "python") +
                    doc_block("### Your own environment, end to end", "python"), encoding="utf-8")
    return path


@pytest.mark.slow
def test_the_docs_own_environment_checks_trains_shows_and_evaluates(tmp_path, monkeypatch, registry):
    write_unit_convert(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # the page's check: the expert under the budget and template it trains with
    exec(compile(doc_block("### Your own environment, end to end", "python", 1), str(DOC), "exec"), {})  # noqa: S102
    config = yaml.safe_load(doc_block("### Your own environment, end to end", "yaml"))
    assert config["env"]["import"] == ["unit_convert.py"] and config["model"]["name"] == "tiny"
    (tmp_path / "unit_convert.yaml").write_text(yaml.safe_dump(config))
    small = ["--sft.steps", "3", "--sft.seqs_per_step", "4", "--loop.steps", "2", "--loop.prompts_per_step", "2",
             "--rollout.completions_per_prompt", "2", "--task.eval_examples", "2", "--eval.every_steps", "0",
             "--logging.completions_every_steps", "1", "--logging.completions_per_step", "2",
             "--logging.tensorboard", "false", "--logging.progress_bar", "false", "--logging.plots", "false",
             "--loop.device", "cpu"]
    code, out, err = lmpo("train", "unit_convert.yaml", *small, cwd=tmp_path)
    assert code == 0, err
    # the start line counts episode tokens (env.budget), not the unused rollout.max_new_tokens
    assert "max_episode_tokens_per_step=1024" in out and "max_completion_tokens_per_step" not in out
    assert "sft step 3/3" in out and "demonstrations played" in out and "0 ended without success" in out
    run = tmp_path / "runs" / "unit_convert"
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["env"]["imports"] == ["unit_convert.py"] and stored["sft"]["steps"] == 3
    records = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == {1, 2} and all(r["messages"][0]["role"] == "user" for r in records)

    code, out, err = lmpo("show", "runs/unit_convert", cwd=tmp_path)
    assert code == 0, err
    shown = records[-1]
    assert out.startswith("step 2: 2 episodes")
    assert f"  user: {shown['messages'][0]['content']}" in out and "  assistant, turn 0" in out
    for m in shown["messages"][1:]:  # whole turns, every character
        assert m["content"].split("\n")[0] in out

    code, out, err = lmpo("eval", "runs/unit_convert", "--samples", "2", "--device", "cpu", "--json", "eval.json",
                          cwd=tmp_path)
    assert code == 0, err
    assert "UnitConvert-v0 (the run's held-out examples), 2 episodes" in out and "success " in out
    assert "pass@2 " in out
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["n"] == 2 and set(result["pass_at_k"]) >= {"pass@1", "pass@2", "avg@2"}
    assert result["samples"][0]["messages"][0]["content"].startswith("How many")


def test_the_task_of_the_docs_draws_held_out_examples_apart(tmp_path, monkeypatch, registry):
    write_unit_convert(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import unit_convert

    task = unit_convert.UnitTask(num_train=200, num_eval=20)
    held_out = {e.prompt for e in task.eval_examples()}
    train = task.train_examples(seed=0)
    assert len(held_out) == 20 and len(train) == 200 and not held_out & {e.prompt for e in train}
    assert all(int(e.answer) == int(e.prompt.split()[4]) * unit_convert.FACTORS[e.meta["units"]] for e in train)


def test_env_import_imports_a_file_once_and_a_module_by_name(tmp_path, monkeypatch, registry):
    from lmpo.envs.plugins import import_env_modules

    write_unit_convert(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert import_env_modules(["unit_convert.py"]) == ["unit_convert"]
    assert "UnitConvert-v0" in ENVS
    assert import_env_modules(["./unit_convert.py", "unit_convert"]) == ["unit_convert", "unit_convert"]  # once
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "unit_convert.py").write_text("")
    with pytest.raises(InputError, match=r"a module called 'unit_convert' is already imported from .*rename"):
        import_env_modules(["sub/unit_convert.py"])
    with pytest.raises(InputError, match="`env.import` names the module 'no_such_envs', which is not found"):
        import_env_modules(["no_such_envs"])
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match="whose import raised ModuleNotFoundError: No module named "
                                         "'no_such_dependency'"):
        import_env_modules(["needs_dep"])


def test_the_config_imports_before_it_resolves_the_id(tmp_path, monkeypatch, registry):
    from lmpo.trainer.config import config_from_dict, validate_config

    write_unit_convert(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = config_from_dict({"env": {"import": ["unit_convert.py"], "id": "UnitConvert-v0"}, "task": {}})
    assert cfg.env.imports == ("unit_convert.py",)
    validate_config(cfg)
    assert "UnitConvert-v0" in ENVS


PLUGIN = '''
from lmpo.envs import GuessNumberEnv, GuessNumberTask, register_env


@register_env("PlugGuess-v0", task=GuessNumberTask)
class PlugGuessEnv(GuessNumberEnv):
    pass
'''

def test_an_installed_package_brings_its_environments_through_the_entry_point_group(tmp_path, registry, monkeypatch):
    from lmpo.envs import make_env, plugins
    from lmpo.trainer.config import config_from_dict, validate_config

    site = tmp_path / "site"
    (site / "plug_envs").mkdir(parents=True)
    (site / "plug_envs" / "__init__.py").write_text(PLUGIN)
    info = site / "plug_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plug-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lmpo.envs]\nplug = plug_envs\nbroken = plug_envs_missing\n")
    monkeypatch.syspath_prepend(str(site))  # the package installed (importlib.metadata reads sys.path)
    monkeypatch.setattr(plugins, "_plugins", {})  # the group not loaded yet in this process
    assert "PlugGuess-v0" not in ENVS
    # found with no env.import: make_env and the config's check load the group
    assert make_env("PlugGuess-v0").env_id == "PlugGuess-v0"
    validate_config(config_from_dict({"env": {"id": "PlugGuess-v0"}, "task": {}}))
    with pytest.raises(InputError) as raised:
        make_env("Nowhere-v0")
    message = str(raised.value)
    assert "unknown environment 'Nowhere-v0'" in message and "PlugGuess-v0" in message
    assert "'lmpo.envs' entry-point group" in message
    assert "failed to load: broken = plug_envs_missing (ModuleNotFoundError" in message


def test_show_prints_a_whole_episode_by_role():
    from lmpo.trainer.run.completions import format_completions

    long = "x" * 200
    record = {"step": 3, "group": 0, "reward": 1.0, "advantage": 0.5, "correct": True, "length": 90,
              "answer": "57", "end_reason": "terminated", "turn_rewards": [0.0, 1.0],
              "messages": [{"role": "user", "content": "How many ft are 19 yd?"},
                           {"role": "assistant", "content": f"<tool_call>\n{long}\n</tool_call>"},
                           {"role": "tool", "name": "lookup", "content": "3"},
                           {"role": "assistant", "content": "57"}]}
    text = format_completions(3, [record], width=20)
    assert text.splitlines()[0] == "step 3: 1 episodes"
    assert "ended: terminated, answer 57" in text
    assert "  user: How many ft are 19 yd?" in text
    assert "  assistant, turn 0, reward +0: <tool_call>" in text and long in text  # not cut at --width
    assert "  tool (lookup): 3" in text and "  assistant, turn 1, reward +1: 57" in text
