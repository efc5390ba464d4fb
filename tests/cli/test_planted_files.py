"""A run directory is data, never code: a malicious object planted in any of its files is refused, not run.

For every file a finished trainer run and a finished SAC run hold, the file is replaced by a pickle whose
loading would create a marker file (``builtins.open(marker, "w")``; ``torch.load(weights_only=False)`` and
``pickle.load`` run it), and YAML files also by a ``!!python/object/apply`` tag. When the file belongs to a
checkpoint, its manifest entry is updated to the planted bytes, so the loaders themselves must refuse it
rather than the integrity check. Then every command that reads a run directory — ``lmpo train --resume``,
``lmpo plot``, ``lmpo eval RUN``, ``lmpo sac train --resume``, ``lmpo sac sample``, ``lmpo sac gate`` — runs on the copy: the
marker must never appear, stderr must hold no traceback, and a command that reads the planted file must fail
with exit status 2 and one message.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import pickle
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from lmpo.cli import main
from sac_helpers import SMALL_CORPUS_ARGS

TRAIN_BASE = {
    "model": {"name": "tiny"},
    "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 1, "num_eval": 8}, "eval_examples": 4},
    "rollout": {"completions_per_prompt": 2, "max_new_tokens": 2},
    "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 4, "device": "cpu"},
    "objective": {"preset": "grpo", "overrides": {"kl_coef": 0.01}},  # a reference model: ref.safetensors too
    "eval": {"at_start": True},
    "checkpoint": {"every_steps": 1, "keep_last": 1},
    "logging": {"progress_bar": False, "tensorboard": False},
}

SAC_ARGS = ["--quiet", "--eval_max_positions", "20", "--eval_generations", "1", "--eval_generation_chars", "4",
            "--eval_rollout_episodes", "1", "--heldout_fraction", "0.25", "--num_envs", "2", "--total_env_steps", "48",
            "--learning_starts", "16", "--log_every_updates", "8", "--checkpoint_every_updates", "8",
            "--checkpoint_keep_last", "1",
            "--threads", "1", "--net.embed_dim", "8", "--net.gru_hidden", "8", "--net.policy_hidden", "8",
            "--net.q_hidden", "8", "--net.action_embed_dim", "8", "--replay.transitions_per_batch", "8",
            "--env.window_chars", "4", "--env.max_steps", "8", "--env.nce_pretrain_steps", "2",
            "--env.use_jieba_lexicon", "false", *SMALL_CORPUS_ARGS]


class _Opens:
    """Unpickling this object calls ``open(marker, "w")``: the file appears only if a loader ran pickle."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def _payloads(name: str, marker: Path) -> dict[str, bytes]:
    out = {"pickle": pickle.dumps({"state": _Opens(marker)}, protocol=2)}
    if name.endswith(".yaml"):
        out["yaml-tag"] = f"x: !!python/object/apply:builtins.open ['{marker}', 'w']\n".encode()
    return out


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
    return code, err.getvalue()


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    import torch
    import yaml

    from lmpo.textagent.env import sample_text_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("planted")
    mp = pytest.MonkeyPatch()
    mp.setenv("LMPO_CACHE_DIR", str(root / "cache"))
    (root / "train.yaml").write_text(yaml.safe_dump({**TRAIN_BASE, "logging": {**TRAIN_BASE["logging"],
                                                                                "run_dir": str(root / "trun")}}))
    code, err = _run(["train", str(root / "train.yaml")])
    assert code == 0, err
    code, err = _run(["sac", "train", "--run-dir", str(root / "srun"), "--corpus", str(sample_text_path()), *SAC_ARGS])
    assert code == 0, err
    yield root
    mp.undo()
    torch.set_num_threads(threads)


def _files(run: Path) -> list[str]:
    return sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())


def _plant(run: Path, rel: str, data: bytes) -> None:
    target = run / rel
    target.write_bytes(data)
    manifest = target.parent / "manifest.json"
    if manifest.is_file() and target.name != "manifest.json":
        m = json.loads(manifest.read_text())
        m["files"][target.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest.write_text(json.dumps(m))


#: the commands that read each kind of run directory, and which of its files each one reads
TRAIN_COMMANDS = {
    "train --resume": (lambda run: ["train", "--resume", str(run), "--logging.run_dir", str(run)],
                       lambda f: f in ("config.yaml", "metrics.jsonl") or f.startswith("checkpoints/")),
    "plot": (lambda run: ["plot", str(run), "--out", str(run.parent / "plots")],
             lambda f: f in ("metrics.jsonl", "config.yaml")),
    "eval RUN": (lambda run: ["eval", str(run), "--n", "2", "--device", "cpu"],
                 lambda f: f == "config.yaml" or f.startswith("model/")),
}
SAC_COMMANDS = {
    "sac train --resume": (lambda run: ["sac", "train", "--run-dir", str(run), "--resume", "--quiet", "--no-eval"],
                           lambda f: f in ("config.yaml", "metrics.jsonl") or f.startswith("checkpoints/")),
    "sac sample": (lambda run: ["sac", "sample", str(run), "--prompt", "子曰", "--max-new-chars", "2"],
                   lambda f: f == "config.yaml" or (f.startswith("checkpoints/")
                                                     and f.rsplit("/", 1)[1].split(".")[0] in ("agent", "manifest"))),
    "sac gate": (lambda run: ["sac", "gate", str(run), "--out", str(run.parent / "gate")],
                 lambda f: f == "summary.json"),
}


def _fresh_copy(source: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for d in (run, tmp_path / "plots", tmp_path / "gate"):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(source, run)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["trainer", "sac"])
def test_planted_objects_are_refused_never_run(finished_runs, kind, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("LMPO_CACHE_DIR", str(finished_runs / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    source = finished_runs / ("trun" if kind == "trainer" else "srun")
    commands = TRAIN_COMMANDS if kind == "trainer" else SAC_COMMANDS
    files = _files(source)
    # the runs hold what the layout promises: a manifest per checkpoint, no pickle files anywhere
    assert any(f.endswith("/manifest.json") for f in files) and not any(f.endswith((".pt", ".pkl")) for f in files)
    for cmd_name, (argv, _) in commands.items():  # untouched, every command works on the run
        code, err = _run(argv(_fresh_copy(source, tmp_path)))
        assert code == (1 if cmd_name == "sac gate" else 0), f"{cmd_name}: {err}"  # one run cannot pass the gate
    refused, unread = 0, []
    for rel in files:
        readers = [c for c, (_, reads) in commands.items() if reads(rel)]
        if not readers:
            unread.append(rel)  # never opened by lmpo (TensorBoard events, eval.json, …)
        for payload_name, data in _payloads(rel, tmp_path / "marker").items():
            for cmd_name in readers:
                run = _fresh_copy(source, tmp_path)
                _plant(run, rel, data)
                code, err = _run(commands[cmd_name][0](run))
                what = f"{cmd_name} with a {payload_name} payload in {rel}"
                assert not (tmp_path / "marker").exists(), f"{what}: the planted object RAN"
                assert "Traceback" not in err, f"{what}: {err}"
                assert code == 2, f"{what}: exit {code}: {err}"
                assert len([ln for ln in err.splitlines() if ln.startswith("lmpo")]) == 1, f"{what}: {err}"
                refused += 1
    torch.set_num_threads(threads)
    assert all(f.startswith(("tensorboard/", "eval.json", "plots/")) for f in unread), unread  # PNGs are never read
    assert refused >= (9 if kind == "trainer" else 12), refused


#: what the links point at: one JSON record, so that a reader taking it for the run's own file goes on to write
VICTIM = b'{"step": 1, "note": "not written by lmpo"}\n'

#: (command, the names of a run directory it writes) for the symbolic-link test: every one is planted as a link
#: (not the trainer's config.yaml: `train --resume RUN` first reads it as the run's config)
LINK_WRITERS = {
    "trainer": {
        "train --resume": (TRAIN_COMMANDS["train --resume"][0], (
            "metrics.jsonl", "completions.jsonl", "tensorboard", "plots/reward.png", "plots", ".lmpo-lock",
            "checkpoints", "model")),
        "plot": (TRAIN_COMMANDS["plot"][0], ()),  # --out elsewhere: writes nothing into the run
        "plot (default --out)": (lambda run: ["plot", str(run)], ("plots/reward.png", "plots")),
    },
    "sac": {
        "sac train --resume": (SAC_COMMANDS["sac train --resume"][0], (
            "metrics.jsonl", "tensorboard", "summary.json", "trace.log", "plots/alpha.png", ".lmpo-lock",
            "checkpoints")),
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["trainer", "sac"])
def test_planted_links_are_refused_never_written_through(finished_runs, kind, tmp_path, monkeypatch):
    """A symbolic link planted where a command writes (a file, a folder, the lock file) is refused with exit 2 and one
    message naming it; the file it points at, outside the run directory, is left as it was."""
    import torch

    monkeypatch.setenv("LMPO_CACHE_DIR", str(finished_runs / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    source = finished_runs / ("trun" if kind == "trainer" else "srun")
    outside = tmp_path / "outside"
    checked = 0
    for cmd_name, (argv, names) in LINK_WRITERS[kind].items():
        for name in names:
            shutil.rmtree(outside, ignore_errors=True)
            outside.mkdir()
            (outside / "victim").write_bytes(VICTIM)
            run = _fresh_copy(source, tmp_path)
            link = run / name
            if link.is_dir():
                shutil.rmtree(link)
            else:
                link.unlink(missing_ok=True)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(outside if name in ("tensorboard", "plots", "checkpoints", "model") else outside / "victim")
            code, err = _run(argv(run))
            what = f"{cmd_name} with {name} a link out of the run directory"
            assert code == 2, f"{what}: exit {code}: {err}"
            assert "Traceback" not in err, f"{what}: {err}"
            lines = [ln for ln in err.splitlines() if ln.startswith("lmpo")]
            assert len(lines) == 1 and "is a symbolic link" in lines[0] and name.split("/")[-1] in lines[0], err
            assert sorted(p.name for p in outside.iterdir()) == ["victim"], f"{what}: wrote into the link's folder"
            assert (outside / "victim").read_bytes() == VICTIM, f"{what}: wrote through the link"
            checked += 1
    torch.set_num_threads(threads)
    assert checked == sum(len(names) for _, names in LINK_WRITERS[kind].values())
