"""The teacher of on-policy distillation: the checks of a (policy, teacher) pair, its forward (its config section,
``TeacherConfig``, is in ``lmpo.trainer.config``).

A run distils when its objective selects a ``distill`` part (``objective.overrides: {distill: gkd_jsd}``): the policy
samples the completions, the teacher scores every completion position, and the part adds the divergence between
the two next-token distributions to the loss (``lmpo.objectives.parts.distill``). The teacher is any causal LM that
shares the policy's tokenizer; it is frozen, loaded once and never checkpointed (a resumed run loads it again).
"""

from __future__ import annotations

from lmpo.errors import InputError
from lmpo.trainer.config import TeacherConfig


def check_pair(policy, policy_tokenizer, teacher, teacher_tokenizer, *, policy_name: str, teacher_name: str) -> int:
    """The number of vocabulary ids both output layers score, after checking that the pair can be compared.

    Refused with an :class:`~lmpo.errors.InputError`: tokenizers mapping tokens to different ids, or an output
    layer smaller than the shared tokenizer. Output layers padded beyond the tokenizer (Qwen2.5 7B's 152064 beside
    0.5B's 151936) are compared on their shared first ids.
    """
    fix = ("Distillation compares next-token distributions id by id, so the teacher must use the policy's tokenizer: "
           "pick a teacher of the same model family, or train the policy from a model with the teacher's tokenizer.")
    v_policy = policy.get_output_embeddings().weight.shape[0]
    v_teacher = teacher.get_output_embeddings().weight.shape[0]
    a, b = policy_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if a != b:
        differ = sorted((set(a.items()) ^ set(b.items())), key=lambda kv: kv[1])
        token = differ[0][0]

        def where(vocab: dict) -> str:
            return f"id {vocab[token]}" if token in vocab else "absent"

        raise InputError(f"`teacher.name` = {teacher_name!r} has another tokenizer than `model.name` = "
                         f"{policy_name!r}: {len(b)} tokens against {len(a)}, and e.g. {token!r} is {where(b)} in "
                         f"the teacher's and {where(a)} in the policy's. {fix}")
    shared = min(v_policy, v_teacher)
    if shared < len(policy_tokenizer):
        raise InputError(f"`teacher.name` = {teacher_name!r} scores {v_teacher} token ids and `model.name` = "
                         f"{policy_name!r} {v_policy}, fewer than the {len(policy_tokenizer)} of their tokenizer. "
                         f"{fix}")
    for key in ("eos_token_id", "pad_token_id"):
        if getattr(policy_tokenizer, key) != getattr(teacher_tokenizer, key):
            raise InputError(f"`teacher.name` = {teacher_name!r}: its tokenizer's {key} is "
                             f"{getattr(teacher_tokenizer, key)} and the policy's {getattr(policy_tokenizer, key)}. "
                             f"{fix}")
    return shared


class Teacher:
    """A frozen teacher and the distillation forward of a training micro-batch.

    >>> teacher = Teacher.load(cfg.teacher, policy, tokenizer, policy_name="tiny", device="cpu", top_k=0)
    >>> fwd, inputs = teacher.forward(policy, input_ids, attention_mask, completion_ids, temperature=1.0)
    >>> objective(fwd.logp, old, adv, mask, **inputs)      # inputs: logits, teacher_logits (+ teacher_ids)
    """

    def __init__(self, model, vocab: int, top_k: int = 0) -> None:
        self.model = model
        self.vocab = vocab
        self.top_k = top_k
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)

    @classmethod
    def load(cls, config: TeacherConfig, policy, tokenizer, *, policy_name: str, device, top_k: int = 0) -> Teacher:
        from lmpo.models import load_model_and_tokenizer

        try:
            model, teacher_tokenizer = load_model_and_tokenizer(config.name, dtype=config.dtype, device=device,
                                                                seed=config.init_seed)
        except (OSError, ValueError) as e:
            first = " ".join(str(e).split())[:300]
            raise InputError(f"`teacher.name` = {config.name!r} could not be loaded ({type(e).__name__}: {first}). "
                             "Give a built-in preset, a local directory holding a saved Hugging Face model, or a hub "
                             "id this machine can download.") from None
        vocab = check_pair(policy, tokenizer, model, teacher_tokenizer, policy_name=policy_name,
                           teacher_name=config.name)
        return cls(model, vocab, top_k)

    def forward(self, policy, input_ids, attention_mask, completion_ids, *, temperature: float = 1.0,
                with_entropy: bool = False):
        """``(PolicyLogprobs, inputs)``: the policy's log-probs (with gradient) and the objective's distillation
        inputs ``logits`` (the policy's, cut to the shared ids) and ``teacher_logits`` (+ ``teacher_ids``)."""
        from lmpo.generation.distill import policy_logits_and_logprobs, teacher_inputs

        fwd, logits = policy_logits_and_logprobs(policy, input_ids, attention_mask, completion_ids,
                                                 temperature=temperature, with_entropy=with_entropy)
        inputs = teacher_inputs(self.model, input_ids, attention_mask, completion_ids.shape[1],
                                temperature=temperature, top_k=self.top_k, vocab=self.vocab)
        inputs["logits"] = logits[..., :self.vocab]
        return fwd, inputs


__all__ = ["Teacher", "check_pair"]
