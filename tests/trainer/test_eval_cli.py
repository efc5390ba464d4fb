"""`lmpo eval MODEL --task …`: greedy accuracy with a Wilson 95% interval, on saved Hugging Face models."""

from __future__ import annotations

import json
import math

import pytest
import torch
from trainer_helpers import SMALL_MODEL

from chat_helpers import CHATML, fast_tokenizer
from lmpo.cli import main
from lmpo.errors import InputError
from lmpo.eval.command import evaluate_model
from lmpo.eval.greedy import wilson_interval
from lmpo.models import CharTokenizer, build_tiny_model


def test_wilson_interval_hand_computed():
    # 0/10: centre = half = (1.96²/20)/(1 + 1.96²/10) = 0.19207/1.38415 = 0.13877  ->  [0, 0.2775]
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and math.isclose(hi, 0.27753, abs_tol=1e-5)
    # 5/10: centre 0.5, half = 1.96·sqrt(0.025 + 0.0096)/1.38415 = 0.26341  ->  [0.2366, 0.7634]
    lo, hi = wilson_interval(5, 10)
    assert math.isclose(lo, 0.23659, abs_tol=1e-5) and math.isclose(hi, 0.76341, abs_tol=1e-5)
    # mirror symmetry k <-> n-k, and it shrinks like 1/sqrt(n) around p̂ = 0.3
    for k in range(0, 21):
        a, b = wilson_interval(k, 20)
        c, d = wilson_interval(20 - k, 20)
        assert math.isclose(a, 1 - d, abs_tol=1e-12) and math.isclose(b, 1 - c, abs_tol=1e-12)
    w100, w10000 = (lambda t: t[1] - t[0])(wilson_interval(30, 100)), (lambda t: t[1] - t[0])(
        wilson_interval(3000, 10000))
    assert math.isclose(w100 / w10000, 10.0, rel_tol=0.02)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def _greedy_one(model, tok, prompt: str, max_new_tokens: int) -> str:
    """The reference: HF `generate` on one prompt at a time (no padding), decoded up to EOS."""
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    if tok.eos_token_id in new:
        new = new[:new.index(tok.eos_token_id)]
    return tok.decode(new, skip_special_tokens=True)


@pytest.fixture
def saved_model(tmp_path):
    tok = CharTokenizer()
    model = build_tiny_model(tok, seed=4, **SMALL_MODEL).eval()
    path = tmp_path / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), model, tok


def test_accuracy_counts_exactly_the_greedy_completions_that_match(tmp_path, saved_model):
    path, model, tok = saved_model
    prompts = [f"{a}+{b}=" for a in range(3) for b in range(4)]  # 12 prompts of two lengths
    greedy = [_greedy_one(model, tok, p, 5) for p in prompts]
    # every other row's reference is what the model writes: accuracy must be exactly 6/12
    rows = [{"prompt": p, "answer": g if i % 2 == 0 else g + "#"} for i, (p, g) in enumerate(zip(prompts, greedy))]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = evaluate_model(path, str(data), max_new_tokens=5, seqs_per_batch=5, device="cpu", samples=12)
    assert (res.n, res.correct) == (12, 6) and res.ci95 == wilson_interval(6, 12)
    assert [s["completion"] for s in res.samples] == greedy
    assert [s["correct"] for s in res.samples] == [i % 2 == 0 for i in range(12)]
    assert evaluate_model(path, str(data), n=4, max_new_tokens=5, device="cpu").n == 4


def test_cli_on_a_builtin_task_and_a_conversational_file(tmp_path, saved_model, capsys):
    path, _, _ = saved_model
    assert main(["eval", path, "--task", "addition", "--task-options", "{max_digits: 1, num_eval: 20}",
                 "--max-new-tokens", "3", "--device", "cpu", "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "addition (held-out split), 20 examples" in out and "95% CI [" in out
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["n"] == 20 and len(record["samples"]) == 20 and record["ci95"][0] <= record["accuracy"]

    # a chat model on TRL's conversational format: the prompts go through its template
    tok = fast_tokenizer(CHATML)
    chat_dir = tmp_path / "chat_model"
    build_tiny_model(tok, seed=0, **SMALL_MODEL).save_pretrained(chat_dir)
    tok.save_pretrained(chat_dir)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)})
                            + "\n" for i in range(6)))
    assert main(["eval", str(chat_dir), "--task", str(data), "--max-new-tokens", "3", "--device", "cpu",
                 "--json", str(tmp_path / "chat.json")]) == 0
    samples = json.loads((tmp_path / "chat.json").read_text())["samples"]
    assert samples[0]["prompt"] == [{"role": "user", "content": "0+1="}] and len(samples) == 6

    # the same data on a tokenizer without a template: exit 2, the message names the fix
    plain = tmp_path / "plain_model"
    notpl = fast_tokenizer(chat_template=None)
    build_tiny_model(notpl, seed=0, **SMALL_MODEL).save_pretrained(plain)
    notpl.save_pretrained(plain)
    assert main(["eval", str(plain), "--task", str(data), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no chat template" in err and "--chat-template" in err
    assert main(["eval", str(plain), "--task", str(data), "--device", "cpu", "--chat-template", CHATML]) == 0


def test_bad_inputs_are_input_errors(tmp_path, saved_model, capsys):
    path, _, _ = saved_model
    for missing in ("no-such-model", str(tmp_path / "runs" / "model"), "./model"):
        with pytest.raises(InputError, match="neither a built-in preset"):
            evaluate_model(missing, "addition")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="without config.json"):
        evaluate_model(str(tmp_path / "empty"), "addition")
    with pytest.raises(InputError, match="not a built-in task"):
        evaluate_model(path, "no-such-task")
    with pytest.raises(InputError, match="does not exist"):
        evaluate_model(path, str(tmp_path / "missing.jsonl"))
    assert main(["eval", path, "--task", "addition", "--task-options", "[1, 2]"]) == 2
    assert "YAML mapping" in capsys.readouterr().err


def test_nan_weights_and_prompts_past_the_context_are_refused(tmp_path, saved_model):
    """Before: NaN weights gave accuracy 0.000 (exit 0); a 1 MB prompt asked torch for 10^12 bytes (exit 1)."""
    path, model, tok = saved_model
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "nan_model")
    tok.save_pretrained(tmp_path / "nan_model")
    with pytest.raises(InputError, match=r"1 parameter tensors hold NaN or infinite values \(the first: "
                                         r"model.layers.0.mlp.up_proj.weight\)"):
        evaluate_model(str(tmp_path / "nan_model"), "addition", n=2)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "1+" * 500_000 + "1=", "answer": "500001"}) + "\n")
    context = model.config.max_position_embeddings
    with pytest.raises(InputError, match=rf"a prompt of at least [\d,]+ tokens \(1,000,002 characters.*plus "
                                         rf"--max-new-tokens = 4 new tokens does not fit the model's context of "
                                         rf"{context} tokens"):
        evaluate_model(path, str(rows), max_new_tokens=4)
    # the longest prompt that fits: context − budget tokens (a token per character, plus the tokenizer's specials)
    room = context - 4 - (len(tok("1")["input_ids"]) - 1)
    fits = tmp_path / "fits.jsonl"
    fits.write_text(json.dumps({"prompt": "1" * room, "answer": "1"}) + "\n")
    assert evaluate_model(path, str(fits), max_new_tokens=4).n == 1
    fits.write_text(json.dumps({"prompt": "1" * (room + 1), "answer": "1"}) + "\n")
    with pytest.raises(InputError, match=rf"a prompt of {context - 3} tokens"):
        evaluate_model(path, str(fits), max_new_tokens=4)
