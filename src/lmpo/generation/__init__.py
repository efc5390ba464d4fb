"""Generation and log-probabilities, shared by the trainer and RLVCR.

- ``RolloutBatch``: the typed record of the sequences one RL step trains on (every trainer stage reads it).
- ``Rollout`` / ``RolloutEngine``: what an engine returns and the protocol the trainer drives it through;
  ``ENGINES`` maps ``rollout.engine`` names to engine classes (``hf``: ``HFRollout``, the default, any
  Hugging Face causal LM; ``vllm``: ``VLLMRollout``, needs the ``lmpo[vllm]`` extra and a GPU).
- ``lean``: the CPU decode step ``HFRollout`` runs for Llama-family models (fused projections, preallocated
  buffers, logits bit for bit those of the model's forward); other models decode through their forward.
- ``AsyncRollout``: ``HFRollout`` in a worker process, fed weights through shared memory, step t generated with
  the weights of step t − k (docs/async.md).
- ``policy_logprobs``: the training forward (log-probs, entropies, token-gradient norms on request);
  ``sequence_logprobs``, ``selective_log_softmax`` and friends: its chunked building blocks.
"""

from lmpo.generation.hf import HFRollout
from lmpo.generation.logprobs import (
    GRAD_NORM_MODES,
    PolicyLogprobs,
    SequenceLogprobs,
    avoid_cudnn_attention,
    chunked_entropy,
    policy_logprobs,
    position_ids_from_mask,
    selective_log_softmax,
    selective_log_softmax_with_entropy,
    sequence_logprobs,
)
from lmpo.generation.rollout import (
    Rollout,
    RolloutBatch,
    RolloutEngine,
    concat_rollouts,
    eos_token_ids,
    select_rows,
)
from lmpo.generation.vllm import VLLMRollout
from lmpo.generation.worker import AsyncRollout

#: ``rollout.engine`` name -> engine class; each takes ``(model, tokenizer, max_new_tokens=, temperature=,
#: top_p=, top_k=, ignore_eos=, record_logprobs=)``.
ENGINES = {"hf": HFRollout, "vllm": VLLMRollout}

__all__ = [
    "AsyncRollout",
    "ENGINES",
    "GRAD_NORM_MODES",
    "HFRollout",
    "PolicyLogprobs",
    "Rollout",
    "RolloutBatch",
    "RolloutEngine",
    "SequenceLogprobs",
    "VLLMRollout",
    "avoid_cudnn_attention",
    "chunked_entropy",
    "concat_rollouts",
    "eos_token_ids",
    "policy_logprobs",
    "position_ids_from_mask",
    "select_rows",
    "selective_log_softmax",
    "selective_log_softmax_with_entropy",
    "sequence_logprobs",
]
