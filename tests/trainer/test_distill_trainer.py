"""On-policy distillation in the trainer: a teacher section, the distillation forward and the refusals."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import SMALL_MODEL, make_trainer, small_config, small_model

from lmpo.config import ConfigError
from lmpo.errors import InputError
from lmpo.generation.distill import completion_logits, policy_logits_and_logprobs, teacher_inputs
from lmpo.generation.logprobs import policy_logprobs
from lmpo.models import CharTokenizer, build_tiny_model
from lmpo.trainer.step.teacher import Teacher, check_pair

DISTILL = {"overrides": {"distill": "reverse_kl", "distill_policy_coef": 0.0}}


def _ids(batch=3, prompt=4, completion=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 60, (batch, prompt + completion), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :2] = 0  # a left-padded prompt
    return ids, attn, ids[:, -completion:]


def test_distillation_forward_equals_the_plain_log_probs():
    model, _ = small_model(0)
    ids, attn, completion = _ids()
    fwd, logits = policy_logits_and_logprobs(model, ids, attn, completion, temperature=0.7, with_entropy=True)
    ref = policy_logprobs(model, ids, attn, completion, temperature=0.7, with_entropy=True)
    torch.testing.assert_close(fwd.logp, ref.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fwd.entropy, ref.entropy, rtol=1e-5, atol=1e-5)
    assert logits.shape == (3, 5, model.config.vocab_size) and logits.requires_grad
    top = teacher_inputs(model, ids, attn, 5, temperature=0.7, top_k=4)
    full = torch.log_softmax(completion_logits(model, ids, attn, 5, 0.7), -1)
    torch.testing.assert_close(top["teacher_logits"], full.topk(4, -1).values)
    assert model.training  # the teacher forward leaves the mode as it found it


def test_pure_distillation_pulls_the_policy_towards_the_teacher(tmp_path):
    trainer = make_trainer(tmp_path / "run", objective=DISTILL, teacher={"name": "tiny", "init_seed": 1},
                           loop={"steps": 6}, optim={"lr": 2e-2})
    assert isinstance(trainer.teacher, Teacher) and trainer.teacher.vocab == 100
    sharp, _ = small_model(1)
    with torch.no_grad():
        sharp.model.norm.weight.mul_(8.0)  # a peaked teacher: a divergence far from 0 to start with
    trainer.teacher = Teacher(sharp, vocab=100)
    history = trainer.train().history
    divergence = [row["distill/divergence"] for row in history]
    assert all(row["loss/policy"] == 0.0 for row in history)
    assert divergence[-1] < 0.8 * divergence[0], divergence


def test_a_distillation_part_needs_a_teacher_and_a_teacher_a_part(tmp_path):
    with pytest.raises(ConfigError, match="`teacher.name` is empty"):
        make_trainer(tmp_path / "a", objective=DISTILL)
    with pytest.raises(ConfigError, match="no distillation part"):
        make_trainer(tmp_path / "b", teacher={"name": "tiny"})


def test_a_teacher_with_another_tokenizer_is_refused():
    policy, tok = small_model(0)
    other = CharTokenizer(extra_chars="éü")
    teacher = build_tiny_model(other, seed=0, **SMALL_MODEL)
    with pytest.raises(InputError, match=r"`teacher.name` = 'other' has another tokenizer .*102 tokens against 100, and e.g. 'é' is id 100 in "
                                         r"the teacher's and absent in the policy's"):
        check_pair(policy, tok, teacher, other, policy_name="tiny", teacher_name="other")
    same = build_tiny_model(tok, seed=1, **SMALL_MODEL)
    assert check_pair(policy, tok, same, tok, policy_name="tiny", teacher_name="same") == len(tok)


def test_padded_output_layers_compare_on_their_shared_ids():
    policy, tok = small_model(0)
    teacher = build_tiny_model(tok, seed=1, **SMALL_MODEL)
    teacher.resize_token_embeddings(len(tok) + 28)  # an output layer padded beyond the tokenizer
    assert check_pair(policy, tok, teacher, tok, policy_name="p", teacher_name="t") == len(tok)
    config = small_config("unused", objective=DISTILL, teacher={"name": "tiny"})
    assert config.teacher.name == "tiny"
