"""Adapters that run lmpo objectives inside other training engines (docs/scaling.md), one module per framework.

- ``lmpo.integrations.trl``: ``LmpoGRPOTrainer``, TRL's ``GRPOTrainer`` with an lmpo objective as its loss
  (keeps TRL's vLLM rollout, accelerate / DeepSpeed / FSDP and PEFT). Tested with TRL 1.16.
- ``lmpo.integrations.verl``: registers every preset as verl policy loss ``lmpo_<name>``; load it in the
  Ray workers with ``actor_rollout_ref.model.external_lib=lmpo.integrations.verl``. Tested with verl 0.9.1.

The modules are not imported here, so ``import lmpo`` never needs TRL or verl. See docs/scaling.md.
"""

ADAPTERS = {"trl": "lmpo.integrations.trl", "verl": "lmpo.integrations.verl"}
"""Framework name → adapter module."""

TESTED_VERSIONS = {"trl": "1.16", "verl": "0.9.1"}
"""Framework versions the adapters' contract tests run against."""

__all__ = ["ADAPTERS", "TESTED_VERSIONS"]
