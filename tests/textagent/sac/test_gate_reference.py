"""The gate's per-metric baselines, supervised-twin rows and ceilings, no-repeat decoding and ``--heldout FILE``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_cli_textenv import main
from test_replay_config_gate import _reference, _summary

from lmpo.errors import InputError
from lmpo.textagent.env import Alphabet, Compliance, sample_text_path
from lmpo.textagent.sac.evaluate import agent_generate, best_orders, left_padded_window, repeat_share
from lmpo.textagent.sac.gate import _kind, judge, leaked_paragraphs
from sac_helpers import SMALL_CORPUS_ARGS


# ---------------------------------------------------------------------------------------------- decoding
def _tiny_agent(alphabet):
    from lmpo.textagent.sac.agent import SACAgent
    from lmpo.textagent.sac.config import TrainConfig, apply_overrides

    cfg = apply_overrides(TrainConfig(), {"net": {"embed_dim": 8, "gru_hidden": 16, "policy_hidden": 16,
                                                  "q_hidden": 16, "action_embed_dim": 8}})
    torch.manual_seed(0)
    return SACAgent(len(alphabet), alphabet.pad_id, cfg.net, cfg.sac, seed=0, device="cpu")


def _old_greedy(agent, alphabet, compliance, prompt, m, length):
    """agent_generate as it was before no-repeat decoding existed (the bit-identity reference)."""
    ids = alphabet.encode(prompt)
    out: list[int] = []
    for _ in range(length):
        hist = ids + out
        win = left_padded_window(hist, len(hist), m, alphabet.pad_id)[None]
        mask = compliance.mask(hist)[0].astype(bool)[None]
        a, _ = agent.act(win, mask, greedy=True)
        if int(a[0]) == alphabet.eos_id:
            break
        out.append(int(a[0]))
    return alphabet.decode(out)


def _ngrams(text: str, n: int) -> list[str]:
    return [text[i:i + n] for i in range(len(text) - n + 1)]


def test_no_repeat_decoding_never_repeats_and_zero_is_plain_greedy():
    alphabet = Alphabet.from_texts(["甲乙丙丁戊己庚辛壬癸。"])
    compliance = Compliance(alphabet, max_run_chars=3)
    agent = _tiny_agent(alphabet)
    for prompt in ("甲乙", "丙", "癸癸"):
        plain = agent_generate(agent, alphabet, compliance, prompt, 4, 40)
        assert plain == _old_greedy(agent, alphabet, compliance, prompt, 4, 40)
        assert agent_generate(agent, alphabet, compliance, prompt, 4, 40, no_repeat_ngram=0) == plain
        for n in (2, 3, 4):
            text = agent_generate(agent, alphabet, compliance, prompt, 4, 40, no_repeat_ngram=n)
            grams = _ngrams(text, n)
            assert len(grams) == len(set(grams)), (n, text)
            # the prompt does not count: only the output's own n-grams are blocked
            assert len(text) > 0


class _ScriptedPolicy:
    """A fixed π: 甲 0.6, 乙 0.3, <eos> 0.1 whatever the window (plain greedy writes 甲 until the run rule stops it)."""

    def __init__(self, alphabet):
        self.p = torch.zeros(len(alphabet))
        self.p[alphabet.char_to_id["甲"]], self.p[alphabet.char_to_id["乙"]], self.p[alphabet.eos_id] = 0.6, 0.3, 0.1

    def eval(self):
        pass

    def train(self):
        pass

    def __call__(self, win, mask):
        p = self.p.repeat(len(win), 1) * mask
        p = p / p.sum(-1, keepdim=True)
        return p, p.clamp_min(1e-12).log()


class _ScriptedAgent:
    device = "cpu"

    def __init__(self, alphabet):
        self.policy = _ScriptedPolicy(alphabet)

    def act(self, window, legal, greedy=False):
        probs, _ = self.policy(torch.as_tensor(window), torch.as_tensor(legal))
        return probs.argmax(-1).numpy(), probs.max(-1).values.numpy()


def test_no_repeat_takes_the_most_probable_legal_character_that_does_not_repeat():
    alphabet = Alphabet.from_texts(["甲乙丙丁"])  # ≥ 3 legal characters: no whitelist fallback
    compliance = Compliance(alphabet, max_run_chars=3)
    agent = _ScriptedAgent(alphabet)
    # plain greedy: 甲甲甲, then the run rule blocks 甲 and 乙 is next, then 甲 again
    assert agent_generate(agent, alphabet, compliance, "乙", 4, 6) == "甲甲甲乙甲甲"
    # no repeated bigram: 甲甲, then 甲 would repeat 甲甲 → 乙; 乙甲 is new; after 甲 both 甲甲 and 甲乙 are
    # used → <eos>, the most probable character left
    assert agent_generate(agent, alphabet, compliance, "乙", 4, 6, no_repeat_ngram=2) == "甲甲乙甲"
    # n = 1: no character twice; the prompt's 甲 does not count
    assert agent_generate(agent, alphabet, compliance, "甲", 4, 6, no_repeat_ngram=1) == "甲乙"


def test_repeat_share():
    assert repeat_share("abcdabcd") == pytest.approx(1 / 5)  # 4-grams abcd bcda cdab dabc abcd: one repeat
    assert repeat_share("aaaaaa") == pytest.approx(2 / 3)
    assert repeat_share("abc") == 0.0


# ------------------------------------------------------------------------------------- per-metric order
def test_best_order_per_metric():
    tf = {"2": {"top1": 0.20, "top3": 0.40}, "3": {"top1": 0.25, "top3": 0.38}, "4": {"top1": 0.25, "top3": 0.30},
          "5": {"top1": 0.22, "top3": 0.29}}
    gen = {"2": {"coverage4": 0.10, "chrf": 9.0, "bleu": 3.0}, "3": {"coverage4": 0.30, "chrf": 8.0, "bleu": 3.0},
           "4": {"coverage4": 0.20, "chrf": 7.0, "bleu": 4.5}, "5": {"coverage4": 0.30, "chrf": 6.0, "bleu": 1.0}}
    best = best_orders(tf, gen)
    assert best == {"top1": {"order": 3, "value": 0.25},  # tie 3 / 4: the lower order
                    "top3": {"order": 2, "value": 0.40}, "coverage4": {"order": 3, "value": 0.30},
                    "chrf": {"order": 2, "value": 9.0}, "bleu": {"order": 4, "value": 4.5}}
    assert set(best_orders(tf)) == {"top1", "top3"}


# ---------------------------------------------------------------------------------------------- judge
def _runs(top1: float = 0.35, with_reference: bool = True, **ref):
    runs = [_summary(s, top1) for s in range(3)]
    runs += [_summary(0, 0.2, bc=0.0), _summary(0, 0.25, top_p=False), _summary(0, 0.29, auto=False)]
    for r in runs:
        r["kind"] = _kind(r["config"])
    if with_reference:
        runs.append(_reference(**ref))
    return runs


def _rows(res):
    return {r["check"]: r for r in res["rows"]}


NEW_ROWS = ["held-out top-1 ≥ supervised twin", "held-out top-3 ≥ supervised twin", "held-out top-1 ≥ n-gram + 3 pp",
            "held-out top-3 ≥ n-gram + 3 pp", "free-running repeated 4-grams"]


def test_row_list_and_reference_rows():
    res = judge(_runs())
    names = [r["check"] for r in res["rows"]]
    assert names == ["stability: 3 seeds without divergence", "critic Huber loss trend", "α inside [1e-4, 2]",
                     "held-out top-1 character hit", "held-out top-3 character hit", "free-running 4-gram coverage",
                     "chrf (sacrebleu, char level)", "bleu (sacrebleu, char level)", "illegal-action rate",
                     "early-termination rate", *NEW_ROWS, "ablation no_bc", "ablation no_top_p",
                     "ablation fixed_alpha"]
    rows = _rows(res)
    assert res["overall"] == "PASS", res["rows"]
    assert rows["held-out top-1 character hit"]["criterion"] == "agent ≥ 4-gram baseline + 10 pp"
    assert rows["held-out top-1 character hit"]["measured"].endswith(
        "; ceiling: supervised twin 30.00%, twin+n-gram interpolation 32.00% (λ picked on held-out: upper bound)")
    assert rows["held-out top-3 character hit"]["measured"].endswith(
        "ceiling: supervised twin 40.00%, twin+n-gram interpolation 42.00% (λ picked on held-out: upper bound)")
    assert rows["free-running 4-gram coverage"]["measured"].endswith("ceiling: supervised twin 45.00% (free-running)")
    assert rows["held-out top-1 ≥ supervised twin"]["measured"] == (
        "agent 35.00% (seeds 35.00%, 35.00%, 35.00%) vs twin 30.00%; Δ +5.00 pp")
    assert rows["held-out top-1 ≥ n-gram + 3 pp"]["measured"] == (
        "agent 35.00% vs 4-gram 20.00%; Δ +15.00 pp (seeds +15.00, +15.00, +15.00 pp)")
    assert rows["free-running repeated 4-grams"]["measured"] == (
        "agent 5.00% (seeds 5.00%, 5.00%, 5.00%) vs true continuations 2.00%; Δ +3.00 pp; baseline 30.00%")
    ref = [r for r in res["runs"] if r["kind"] == "reference"]
    assert len(ref) == 1 and ref[0]["top1"] == pytest.approx(0.3) and ref[0]["top3"] == pytest.approx(0.4)
    assert {k: ref[0][k] for k in ("run_dir", "seed", "updates", "env_steps", "train_seconds")} == {
        "run_dir": "ref", "seed": 0, "updates": 600, "env_steps": None, "train_seconds": 7.0}
    # the reference run is neither a main seed nor an ablation
    assert "seeds [0, 1, 2]" in rows["stability: 3 seeds without divergence"]["measured"]
    from lmpo.textagent.sac.gate import to_markdown

    assert "| ref | reference | 0 | 600 | — | 7.0 |" in to_markdown(res)


def test_twin_rows_fail_without_reference_or_when_the_twin_is_better():
    rows = _rows(judge(_runs(with_reference=False)))
    for name in ("held-out top-1 ≥ supervised twin", "held-out top-3 ≥ supervised twin"):
        assert rows[name]["status"] == "FAIL" and "no reference run given" in rows[name]["measured"]
    assert rows["held-out top-1 character hit"]["measured"].endswith("; ceiling: no reference run given")
    assert rows["free-running 4-gram coverage"]["measured"].endswith("; ceiling: no reference run given")
    assert rows["held-out top-1 ≥ n-gram + 3 pp"]["status"] == "PASS"  # independent of the reference
    # a twin above the seeds: FAIL, with the numbers
    runs = _runs()
    runs[-1]["eval"]["agent"]["top1"] = 0.40
    r = _rows(judge(runs))["held-out top-1 ≥ supervised twin"]
    assert r["status"] == "FAIL" and r["measured"].endswith("vs twin 40.00%; Δ -5.00 pp")


def test_per_metric_best_order_is_the_bar():
    runs = _runs(top1=0.32)
    # old summaries: top-1 / top-3 vs the best-by-top-1 order (20% / 30%) → 32% passes the 10 pp margin
    assert _rows(judge(runs))["held-out top-1 character hit"]["status"] == "PASS"
    bb = {"top1": {"order": 4, "value": 0.2}, "top3": {"order": 2, "value": 0.36},
          "coverage4": {"order": 3, "value": 0.45}, "chrf": {"order": 5, "value": 9.0},
          "bleu": {"order": 2, "value": 6.0}}
    for r in runs:
        r["eval"]["baseline_best"] = copy.deepcopy(bb)
    res = judge(runs)
    rows = _rows(res)
    # top-3: 42% vs the 2-gram's 36% (not the 4-gram's 30%): +6 pp < 10 pp
    assert rows["held-out top-3 character hit"]["criterion"] == "agent ≥ 2-gram baseline + 10 pp"
    assert rows["held-out top-3 character hit"]["status"] == "FAIL"
    assert "vs baseline 36.00%; Δ +6.00 pp" in rows["held-out top-3 character hit"]["measured"]
    assert rows["held-out top-3 ≥ n-gram + 3 pp"]["status"] == "PASS"
    assert "(2-gram, fitted on the base corpus's train chapters)" in rows["held-out top-3 ≥ n-gram + 3 pp"]["criterion"]
    cov = rows["free-running 4-gram coverage"]
    assert cov["status"] == "FAIL" and "vs baseline 45.00% (3-gram); Δ +5.00 pp" in cov["measured"]
    assert rows["chrf (sacrebleu, char level)"]["status"] == "PASS"  # 10 vs 9 (5-gram)
    assert rows["bleu (sacrebleu, char level)"]["status"] == "FAIL"  # 5 vs 6 (2-gram)
    assert rows["bleu (sacrebleu, char level)"]["measured"] == "agent 5.00 vs baseline 6.00 (2-gram)"
    assert res["baseline_best"]["top3"] == {"order": 2, "value": 0.36}
    # a top-1 only 2 pp above its best order fails the 3 pp row
    for r in runs:
        r["eval"]["baseline_best"]["top1"] = {"order": 3, "value": 0.30}
    rows = _rows(judge(runs))
    assert rows["held-out top-1 ≥ n-gram + 3 pp"]["status"] == "FAIL"
    assert rows["held-out top-1 ≥ n-gram + 3 pp"]["measured"].startswith("agent 32.00% vs 3-gram 30.00%; Δ +2.00 pp")


def test_repetition_row():
    runs = _runs()
    for r in runs[:3]:
        r["eval"]["generation"]["agent"]["repeat4"] = 0.08  # 6 pp above the true continuations' 2%
    row = _rows(judge(runs))["free-running repeated 4-grams"]
    assert row["status"] == "FAIL" and "Δ +6.00 pp" in row["measured"]
    for r in runs[:3]:
        del r["eval"]["generation"]["agent"]["repeat4"]  # a summary written before repeat4 existed
    row = _rows(judge(runs))["free-running repeated 4-grams"]
    assert row["status"] == "FAIL" and row["measured"].startswith("not measured")


def test_leaked_paragraphs_counts_shared_han_runs():
    training = ["子曰學而時習之不亦說乎有朋自遠方來不亦樂乎"]
    paras = ["學而時習之，不亦說乎？有朋", "全然不同的一段文字共十個漢字以上", "子曰學而"]
    assert leaked_paragraphs(paras, training, 10) == 1  # punctuation does not hide the quotation
    assert leaked_paragraphs(paras, training, 4) == 2


# ----------------------------------------------------------------------------------------- --heldout FILE
TRAIN = [
    "--corpus", str(sample_text_path()), "--heldout_fraction", "0.25", "--num_envs", "2",
    "--total_env_steps", "120", "--learning_starts", "32", "--log_every_updates", "10",
    "--threads", "1", "--eval_max_positions", "200", "--eval_generations", "3", "--eval_generation_chars", "8",
    "--eval_rollout_episodes", "4", "--eval_no_repeat_ngram", "2",
    "--net.embed_dim", "16", "--net.gru_hidden", "32", "--net.policy_hidden", "32", "--net.q_hidden", "32",
    "--net.action_embed_dim", "16", "--replay.transitions_per_batch", "32",
    "--env.window_chars", "8", "--env.max_steps", "16", "--env.nce_pretrain_steps", "5",
    "--env.use_jieba_lexicon", "false", *SMALL_CORPUS_ARGS,
]


def _main(argv):
    """`lmpo sac …` with reference registered too (test_cli_textenv's router knows train / sample / gate)."""
    import argparse

    from lmpo.textagent.sac import cli as sac_cli

    parser = argparse.ArgumentParser(prog="lmpo")
    sub = parser.add_subparsers(dest="command").add_parser("sac").add_subparsers(dest="sac_command")
    for name, func in (("train", "register_train"), ("reference", "register_reference"), ("gate", "register_gate")):
        getattr(sac_cli, func)(sub, name)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("heldout")
    mp = pytest.MonkeyPatch()
    mp.setenv("LMPO_CACHE_DIR", str(d / "cache"))
    run, ref = d / "run", d / "ref"
    assert main(["sac", "train", "--run-dir", str(run), "--quiet", *TRAIN]) == 0
    assert _main(["sac", "reference", "--run-dir", str(ref), "--quiet", "--steps", "20", "--batch", "32",
                  "--eval-every", "10", *TRAIN]) == 0
    yield d, run, ref
    mp.undo()


def _heldout_file(d, run):
    from lmpo.textagent.sac.config import config_from_dict, run_config_dict
    from lmpo.textagent.sac.train import text_split

    split = text_split(config_from_dict(run_config_dict(run)))
    path = d / "own_heldout.json"
    path.write_text(json.dumps([{"chapter": f"c{i}", "paragraphs": [c]} for i, c in enumerate(split.heldout)],
                               ensure_ascii=False), encoding="utf-8")
    return path, split


def _same(a, b, where: str) -> None:
    """Nested dicts / lists equal, floats to 1e-9."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in b:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.mark.slow  # the module fixture `trained` (a SAC run, ~10 s)
def test_heldout_file_gives_the_training_time_numbers(trained, capsys):
    from lmpo.textagent.sac.gate import load_runs, rescore_on_file

    d, run, ref = trained
    path, split = _heldout_file(d, run)
    saved = {str(r): json.loads((r / "summary.json").read_text())["eval"] for r in (run, ref)}
    for ev in saved.values():
        assert "baseline_best" in ev and "repeat4" in ev["generation"]["agent"]
        assert ev["baseline_best"]["top1"] == {"order": ev["baseline_order"], "value": ev["baseline"]["top1"]}
        assert set(ev["generation"]["baseline_by_order"]) == {"2", "3", "4", "5"}
    runs, report = rescore_on_file(load_runs([run, ref]), path)
    for r in runs:
        old, new = saved[r["run_dir"]], r["eval"]
        _same(new, old, r["run_dir"])  # every number: agent, baselines, generations, compliance, interpolation
    assert report["chapters"] == len(split.heldout) and report["runs"][str(run)]["chars_outside_alphabet"] >= 0
    capsys.readouterr()
    out = d / "gate_own"
    assert _main(["sac", "gate", "--heldout", str(path), str(run), str(ref), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "Held-out text" in printed and "paragraphs share a 10-Han-character run" in printed
    gate = json.loads((out / "gate.json").read_text())
    assert gate["heldout"]["file"] == str(path) and str(ref) in gate["heldout"]["runs"]
    assert [r["kind"] for r in gate["runs"]] == ["main", "reference"]
    md = (out / "gate.md").read_text()
    assert md.startswith("**Gate: FAIL**") and "Held-out text" in md
    # a text file whose chapters are training text: leakage reported, characters outside Σ counted as misses
    leak = d / "leak.txt"
    leak.write_text("\n\n".join(split.train[:2]) + "\n\n𪚥𪚥𪚥𪚥𪚥。\n", encoding="utf-8")
    assert _main(["sac", "gate", "--heldout", str(leak), str(run)]) == 1
    gate = json.loads((d / "gate_leak" / "gate.json").read_text())  # default --out: RUN_DIR/../gate_<stem>
    info = gate["heldout"]["runs"][str(run)]
    assert info["leaked_paragraphs"] >= 1 and info["chars_outside_alphabet"] >= 5


@pytest.mark.slow  # the module fixture `trained` (a SAC run, ~10 s)
def test_heldout_bad_inputs(trained, tmp_path):
    d, run, _ = trained
    with pytest.raises(InputError, match=r"--heldout .*missing.json'?: no such file or directory; give a held-out"):
        _main(["sac", "gate", "--heldout", str(tmp_path / "missing.json"), str(run), "--out", str(tmp_path / "g")])
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(InputError, match=r"--heldout .*bad.json'?: .*item 0 must be an object"):
        _main(["sac", "gate", "--heldout", str(bad), str(run), "--out", str(tmp_path / "g")])
    # a run without a checkpoint (its summary kept, the checkpoints gone)
    import shutil

    copy_dir = tmp_path / "nockpt"
    shutil.copytree(run, copy_dir)
    shutil.rmtree(copy_dir / "checkpoints")
    good = tmp_path / "h.txt"
    good.write_text("子曰學而時習之不亦說乎。\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"nockpt'? has no checkpoint to score; continue it with"):
        _main(["sac", "gate", "--heldout", str(good), str(copy_dir), "--out", str(tmp_path / "g")])
    assert not (tmp_path / "g").exists()
