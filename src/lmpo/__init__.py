"""lmpo: language-model policy optimisation.

Layers (each usable on its own):

- ``lmpo.objectives``   pure tensor objectives (GRPO family), advantages, presets
- ``lmpo.trainer``      single-machine GRPO-family trainer for Hugging Face causal LMs
- ``lmpo.integrations`` thin adapters for TRL's ``GRPOTrainer`` and verl
- ``lmpo.textagent``    apart from the GRPO packages: a character-level text POMDP (``textagent.env``,
  Gymnasium) and the discrete max-entropy SAC agent that learns in it (``textagent.sac``)
"""

__version__ = "0.1.0"
