"""The package's import graph has no cycle, its layers import only downwards, and no module imports another
package's private names.

The graph is read from the source (every ``import``/``from … import`` of an ``lmpo`` module, at module level or
inside a function: a lazy import is still a dependency), not from what happens to be imported at run time.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

FORBIDDEN = {
    # layer: packages it must never import (DESIGN: objectives → nothing above; generation, rlvcr and the
    # adapters never import the trainer)
    "lmpo.objectives": ("lmpo.trainer", "lmpo.generation", "lmpo.rlvcr", "lmpo.integrations", "lmpo.lab",
                        "lmpo.sac", "lmpo.textenv", "lmpo.tasks", "lmpo.rewards", "lmpo.models"),
    "lmpo.generation": ("lmpo.trainer", "lmpo.rlvcr", "lmpo.integrations", "lmpo.lab"),
    "lmpo.rlvcr": ("lmpo.trainer", "lmpo.integrations", "lmpo.lab"),
    "lmpo.integrations": ("lmpo.trainer", "lmpo.lab"),
    "lmpo.textenv": ("lmpo.sac", "lmpo.trainer", "lmpo.lab"),
    # LM environments sit below the episode driver (lmpo.generation.episodes) and never see a trainer
    "lmpo.envs": ("lmpo.trainer", "lmpo.generation", "lmpo.rlvcr", "lmpo.integrations", "lmpo.lab", "lmpo.sac"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The lmpo modules ``path`` imports. ``from pkg import sub`` depends on ``pkg.sub`` when that is a module
    (running ``pkg/__init__.py`` on the way is Python's business, not a dependency), else on ``pkg``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & modules
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(target)
    return {m for m in found if m == "lmpo" or m.startswith("lmpo.")}


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in _imports(path, name, set(modules)):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module graph collapsed to packages (``lmpo.objectives.parts.levels`` → ``lmpo.objectives``)."""
    def pkg(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(pkg(m), set()).update(pkg(d) for d in deps if pkg(d) != pkg(m))
    return out


def test_no_import_cycle_between_modules():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles (break them by moving the shared piece down a layer): " + "; ".join(
        " ↔ ".join(c) for c in cycles)


def test_layers_import_only_downwards():
    graph = import_graph()
    bad = [f"{m} imports {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
           for layer, forbidden in FORBIDDEN.items()
           if (m == layer or m.startswith(layer + ".")) and any(d == f or d.startswith(f + ".") for f in forbidden)]
    assert not bad, "upward imports: " + "; ".join(bad)


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "lmpo.objectives.objective" in graph["lmpo.objectives.presets"]
    assert graph["lmpo.cli"] == set() or all(d.startswith("lmpo") for d in graph["lmpo.cli"])


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _owner(full: str, modules: set[str], packages: set[str]) -> str:
    """The package a private name belongs to: the package whose module (or which itself) defines the first
    private component of ``full`` (``lmpo.trainer.commands._x`` → ``lmpo.trainer``; ``lmpo._hints.f`` → ``lmpo``)."""
    parts = full.split(".")
    i = next(i for i, p in enumerate(parts) if _is_private(p))
    prefix = ".".join(parts[:i])
    return prefix if prefix in packages or prefix not in modules else prefix.rsplit(".", 1)[0]


def private_imports() -> list[str]:
    """Every ``from lmpo… import _name`` (or import of a ``_module``) by a module outside the name's package."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    packages = {_module_name(p) for p in SRC.rglob("__init__.py")}
    found = []
    for module, path in sorted(paths.items()):
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for full in names:
                if not full.startswith("lmpo.") or not any(_is_private(p) for p in full.split(".")[1:]):
                    continue
                owner = _owner(full, set(paths), packages)
                if not (package == owner or package.startswith(owner + ".")):
                    found.append(f"{module} imports {full} (private to {owner})")
    return found


def test_no_module_imports_another_packages_private_names():
    bad = private_imports()
    assert not bad, "make the name public (no leading underscore) or move the code into its package: " + "; ".join(bad)


def test_private_import_check_sees_a_violation(tmp_path, monkeypatch):
    """The check itself: a planted module that takes a private name of another package is reported."""
    import shutil

    root = tmp_path / "src"
    shutil.copytree(SRC / "lmpo", root / "lmpo", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "lmpo" / "lab" / "planted.py").write_text("from lmpo.trainer.config import _hidden\n"
                                                      "from lmpo.trainer import _private_module\n"
                                                      "from lmpo._hints import type_hints\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", root)
    bad = private_imports()
    assert bad == ["lmpo.lab.planted imports lmpo.trainer.config._hidden (private to lmpo.trainer)",
                   "lmpo.lab.planted imports lmpo.trainer._private_module (private to lmpo.trainer)"]


def test_lab_and_benchmarks_call_no_private_trainer_method():
    """The lab and the benchmarks reach the trainer through lmpo.trainer.build / stages and public methods."""
    root = SRC.parent
    files = sorted((SRC / "lmpo" / "lab").rglob("*.py")) + sorted((root / "benchmarks").glob("*.py"))
    bad = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in files
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if re.search(r"\btrainer\._[a-z]", line)]
    assert not bad, "private Trainer names used outside the trainer: " + "; ".join(bad)
