"""The text agent (docs/textagent.md): a character-level text POMDP and a discrete SAC agent, apart from GRPO.

- ``lmpo.textagent.env``: the Gymnasium environment ``lmpo/CharText-v0`` — corpus, alphabet, compliance mask,
  rewards, lexicon, and the bundled texts (``env/data/``);
- ``lmpo.textagent.sac``: discrete maximum-entropy SAC with top-p expected backups, its supervised reference,
  quality gate and the ``lmpo sac …`` commands.

Neither imports the GRPO side (``lmpo.trainer``, ``lmpo.objectives``, ``lmpo.generation``, …) nor is imported
by it; both build only on the shared utilities (``lmpo.config``, ``lmpo.errors``, ``lmpo.checkpoints``,
``lmpo.runs``, ``lmpo.plots``). Importing this package imports neither subpackage.
"""
