"""``--section.key value`` command-line overrides, shared by ``lmpo train`` and ``lmpo sac train``.

Each command applies the nested dict to its own frozen config (and validates it there); this module only
turns the tokens into that dict, so both commands accept the same spellings.
"""

from __future__ import annotations

from typing import Any

import yaml


def parse_overrides(argv: list[str], error: type[Exception] = ValueError) -> dict[str, Any]:
    """``["--objective.preset", "dapo", "--optim.lr=1e-4"]`` → ``{"objective": {"preset": "dapo"}, …}``.

    Values are parsed as YAML scalars (``16`` → int, ``false`` → bool, ``0.99`` → float; ``1e-4`` stays a
    string in YAML 1.1 and is typed by the config's field); dashes in keys become underscores
    (``--eval-every-updates`` = ``--eval_every_updates``).  ``error`` is the exception raised for a malformed
    token, so each command reports it with its own error type.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            raise error(f"override `{tok}` must look like `--section.key value` (e.g. `--optim.lr 1e-4`).")
        key = tok[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(argv):
                raise error(f"override `{tok}` has no value; write `{tok} VALUE`.")
            raw = argv[i + 1]
            i += 2
        key = key.replace("-", "_")
        value = yaml.safe_load(raw) if raw != "" else ""
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise error(f"override `--{key}` conflicts with an earlier override of `{p}`.")
        node[parts[-1]] = value
    return out
