"""Sequence-classification reward models: batched scores equal one-at-a-time scores, conversations go through
the reward model's own template, and they mix with function rewards by weight."""

from __future__ import annotations

import pytest
import torch

from chat_helpers import CHATML, fast_tokenizer, save_classifier
from lmpo.errors import InputError
from lmpo.rewards import RewardModel, RewardScorer, RewardSpec

PROMPTS = ["1+1=", "12+30=", "7+8=", "100+1=", "5+5="]
COMPLETIONS = ["2", "42", "13", "101", "ten"]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    save_classifier(path, fast_tokenizer(CHATML), seed=3)
    return str(path)


def _one_at_a_time(path, texts):
    """The reference: each text alone (no padding), first logit of the saved classifier."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return [float(model(**tok(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0]) for t in texts]


def test_batched_scores_equal_unpadded_scores(rm_dir):
    rm = RewardModel(rm_dir, seqs_per_batch=2)  # batches of unequal lengths, padded on the right
    scores = rm(prompts=PROMPTS, completions=COMPLETIONS, answer=["2", "42", "15", "101", "10"])
    reference = _one_at_a_time(rm_dir, [p + c for p, c in zip(PROMPTS, COMPLETIONS)])
    torch.testing.assert_close(torch.tensor(scores), torch.tensor(reference), rtol=1e-5, atol=1e-5)
    assert len(set(scores)) == len(scores)  # a random classifier still tells the texts apart


def test_conversations_use_the_reward_models_template(rm_dir):
    rm = RewardModel(rm_dir, seqs_per_batch=4)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    texts = rm.texts(prompts, completions)
    assert texts[1] == "<|im_start|>user\n12+30=<|im_end|>\n<|im_start|>assistant\n42<|im_end|>\n"
    torch.testing.assert_close(torch.tensor(rm(prompts, completions)),
                               torch.tensor(_one_at_a_time(rm_dir, texts)), rtol=1e-5, atol=1e-5)


def test_conversations_without_a_template_are_an_input_error(tmp_path):
    save_classifier(tmp_path, fast_tokenizer(chat_template=None))
    rm = RewardModel(str(tmp_path))
    with pytest.raises(InputError, match="no chat template") as err:
        rm.check_conversational("task 'chat.jsonl'")
    assert "'chat.jsonl'" in str(err.value) and "chat_template" in str(err.value)
    # the fix: a template in the reward model's entry
    fixed = RewardModel(str(tmp_path), chat_template=CHATML)
    fixed.check_conversational()
    assert fixed.texts([[{"role": "user", "content": "a"}]], ["b"]) == [
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"]


def test_mixed_with_function_rewards_by_weight(rm_dir):
    rm = RewardModel(rm_dir)
    scorer = RewardScorer([("exact_match", 2.0), RewardSpec("rm", 0.5, fn=rm)])
    answers = ["2", "41", "15", "101", "10"]
    total, per_fn = scorer.score(PROMPTS, COMPLETIONS, answers)
    em = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    torch.testing.assert_close(per_fn["exact_match"], em)
    torch.testing.assert_close(per_fn["rm"], torch.tensor(rm(PROMPTS, COMPLETIONS)))
    torch.testing.assert_close(total, 2.0 * em + 0.5 * per_fn["rm"])


def test_not_a_model_path_is_an_input_error():
    for path in ("no-such-dir", "./models/rm", "runs/x/rm"):
        with pytest.raises(InputError, match="neither a local directory"):
            RewardModel(path)
