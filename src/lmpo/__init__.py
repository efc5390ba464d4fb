"""lmpo: language-model policy optimisation.

Layers (each usable on its own):

- ``lmpo.objectives``   pure tensor objectives (GRPO family), advantages, presets
- ``lmpo.trainer``      single-machine GRPO-family trainer for Hugging Face causal LMs
- ``lmpo.integrations`` thin adapters for TRL's ``GRPOTrainer`` and verl
- ``lmpo.textenv``      character-level text POMDP (Gymnasium)
- ``lmpo.sac``          discrete max-entropy SAC with top-p expected backups
"""

__version__ = "0.1.0"
