"""Runs as Hugging Face models: checkpoints and RUN/model/ load with ``from_pretrained``; `lmpo export`, `lmpo eval RUN`."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch
import yaml
from safetensors.torch import load_file

from lmpo.cli import main
from lmpo.errors import InputError
from lmpo.eval.command import evaluate_model
from lmpo.models import MODEL_PRESETS, CharTokenizer, ModelPreset
from lmpo.trainer.run.export import export_run, load_run_policy

RUN_CONFIG = {
    "model": {"name": "hf-test-tiny"},
    "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 1, "num_eval": 8}, "eval_examples": 6},
    "rollout": {"completions_per_prompt": 2, "max_new_tokens": 3},
    # an untrained model is never right; the length term makes rewards differ inside groups (a gradient)
    "rewards": {"functions": ["exact_match", "length_penalty"], "weights": [1.0, 1.0],
                "kwargs": {"length_penalty": {"target_chars": 0, "scale_chars": 3.0}}},
    "optim": {"lr": 1e-2},
    "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 4, "device": "cpu"},
    "checkpoint": {"every_steps": 1, "keep_last": 0},
    "logging": {"progress_bar": False, "tensorboard": False, "plots": False},
}
HF_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A full-model run and a LoRA run of a very small preset, 2 RL steps each, a checkpoint per step."""
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    mp.setitem(MODEL_PRESETS, "hf-test-tiny", ModelPreset(hidden_size=32, num_layers=1, num_heads=2,
                                                          intermediate_size=64, description="export test"))
    root = tmp_path_factory.mktemp("hfexport")
    lora = {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    for name, extra in (("full", {}), ("lora", {"model": {"name": "hf-test-tiny", "lora": lora}})):
        cfg = {**RUN_CONFIG, **extra, "logging": {**RUN_CONFIG["logging"], "run_dir": str(root / name)}}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        code, _, err = _cli(["train", root / f"{name}.yaml"])
        assert code == 0, err
    yield root
    mp.undo()


def _logits(model, ids=((1, 14, 15, 63, 16, 75),)):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def test_checkpoints_and_final_model_are_hf_model_dirs(runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = runs / "full"
    for d in (run / "checkpoints" / "step_00000001", run / "checkpoints" / "step_00000002", run / "model"):
        names = {p.name for p in d.iterdir()}
        assert HF_FILES | {"model.safetensors", "manifest.json"} <= names, names
        manifest = json.loads((d / "manifest.json").read_text())
        assert set(manifest["files"]) == names - {"manifest.json"}  # the manifest covers the new files
        model = AutoModelForCausalLM.from_pretrained(d)
        weights = load_file(str(d / "model.safetensors"))
        for k, v in weights.items():  # exactly the trained weights the checkpoint stores
            assert torch.equal(model.state_dict()[k], v), k
    final = AutoModelForCausalLM.from_pretrained(run / "model")
    last = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00000002")
    first = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00000001")
    assert torch.equal(_logits(final), _logits(last))
    assert not torch.equal(_logits(first), _logits(last))  # the two steps trained something
    assert final.config.tie_word_embeddings and torch.equal(final.lm_head.weight, final.model.embed_tokens.weight)
    # the char tokenizer comes back as a fast tokenizer with the same ids, BOS prepended, nothing from lmpo
    tok, ref = AutoTokenizer.from_pretrained(run / "model"), CharTokenizer()
    for text in ("12+34=", "a\n\nb", "x<eos>é"):
        assert tok(text)["input_ids"] == ref(text)["input_ids"]
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 2, 1)


def test_export_default_step_and_errors(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    run = runs / "full"
    code, out, err = _cli(["export", run, tmp_path / "latest"])
    assert code == 0, err and "step_00000002" in out
    assert HF_FILES | {"model.safetensors"} <= {p.name for p in (tmp_path / "latest").iterdir()}
    latest = AutoModelForCausalLM.from_pretrained(tmp_path / "latest")
    assert torch.equal(_logits(latest), _logits(AutoModelForCausalLM.from_pretrained(run / "model")))
    export_run(run, tmp_path / "one", step=1, log=lambda m: None)
    one = AutoModelForCausalLM.from_pretrained(tmp_path / "one")
    assert torch.equal(_logits(one), _logits(AutoModelForCausalLM.from_pretrained(run / "checkpoints" /
                                                                                  "step_00000001")))
    with pytest.raises(InputError, match=r"no checkpoint of step 7; it holds checkpoint steps 1, 2 and model/"):
        export_run(run, tmp_path / "seven", step=7)
    with pytest.raises(InputError, match=r"run directory .*nope.* does not exist"):
        export_run(tmp_path / "nope", tmp_path / "x")
    with pytest.raises(InputError, match=r"already exists and is not an empty directory"):
        export_run(run, tmp_path / "latest")


def test_lora_run_saves_peft_adapter_and_exports_merged(runs, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lmpo.models import load_model_and_tokenizer

    run = runs / "lora"
    for d in (run / "checkpoints" / "step_00000002", run / "model"):
        names = {p.name for p in d.iterdir()}
        assert ADAPTER_FILES <= names and "config.json" not in names, names
        assert json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"] == "hf-test-tiny"
    peft_model, _, source, _ = load_run_policy(run, merge=False)
    assert source.name == "model"
    # PEFT's own loader reads the adapter onto the run's base model
    base, _ = load_model_and_tokenizer("hf-test-tiny", seed=0)
    reloaded = PeftModel.from_pretrained(base, run / "model")
    assert torch.allclose(_logits(reloaded), _logits(peft_model), atol=1e-6)
    lora_b = [v for k, v in peft_model.state_dict().items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # training moved the adapter off its zero init
    code, _, err = _cli(["export", run, tmp_path / "merged", "--merge"])
    assert code == 0, err
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(_logits(merged), _logits(peft_model), atol=1e-5)
    code, _, err = _cli(["export", run, tmp_path / "adapter"])
    assert code == 0, err
    assert ADAPTER_FILES <= {p.name for p in (tmp_path / "adapter").iterdir()}


def test_eval_run_reproduces_the_runs_own_final_eval(runs, tmp_path):
    for name in ("full", "lora"):
        run = runs / name
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        final = [r for r in rows if r.get("kind") == "eval"][-1]
        result = evaluate_model(str(run), None, device="cpu")
        assert result.n == 6 and result.max_new_tokens == 3
        assert result.accuracy == final["eval/accuracy"]
        assert abs(result.length_mean - final["eval/length_mean"]) < 1e-9
    code, out, err = _cli(["eval", runs / "full", "--n", "4"])
    assert code == 0, err
    assert "4 examples" in out and "95% CI [" in out
    # an exported model scored on the same task by name agrees with the run
    export_run(runs / "full", tmp_path / "m", log=lambda m: None)
    by_name = evaluate_model(str(tmp_path / "m"), "addition", options=RUN_CONFIG["task"]["options"], n=6,
                             max_new_tokens=3, device="cpu")
    assert by_name.correct == evaluate_model(str(runs / "full"), None, device="cpu").correct
    with pytest.raises(InputError, match="--task is missing"):
        evaluate_model(str(tmp_path / "m"), None)


def test_resume_refuses_a_checkpoint_file_that_is_not_its_format(runs, tmp_path):
    import hashlib
    import shutil

    from lmpo.trainer.run.export import resolve_source
    from lmpo.trainer.run.state import CheckpointError, load_checkpoint

    ck = tmp_path / "run" / "checkpoints" / "step_00000002"
    shutil.copytree(runs / "full" / "checkpoints" / "step_00000002", ck)
    (tmp_path / "run" / "config.yaml").write_text("{}")
    bad = b"\x80\x02not json"
    (ck / "tokenizer_config.json").write_bytes(bad)
    manifest = json.loads((ck / "manifest.json").read_text())
    manifest["files"]["tokenizer_config.json"] = {"bytes": len(bad), "sha256": hashlib.sha256(bad).hexdigest()}
    (ck / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="tokenizer_config.json is not valid JSON"):
        load_checkpoint(ck, torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointError, match="tokenizer_config.json is not valid JSON"):
        resolve_source(tmp_path / "run")


def test_eval_run_prefers_a_newer_checkpoint_over_model(runs, tmp_path):
    import shutil

    from lmpo.trainer.run.export import resolve_source

    run = tmp_path / "run"
    shutil.copytree(runs / "full", run)
    assert resolve_source(run, prefer_final=True).name == "model"
    assert resolve_source(run).name == "step_00000002"  # export: the newest checkpoint by default
    # the run was extended by a step and stopped before its end: its newest checkpoint is newer than model/
    newer = run / "checkpoints" / "step_00000003"
    shutil.copytree(run / "checkpoints" / "step_00000002", newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**manifest, "step": 3}))
    assert resolve_source(run, prefer_final=True).name == "step_00000003"
