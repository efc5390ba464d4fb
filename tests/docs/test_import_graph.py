"""The package's import graph has no cycle, its layers import only downwards, and no module imports another
package's private names.

The graph is read from the source (every ``import``/``from … import`` of an ``lmpo`` module, at module level or
inside a function: a lazy import is still a dependency), not from what happens to be imported at run time.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

FORBIDDEN = {
    # layer: packages it must never import (DESIGN: objectives → nothing above; generation, rlvcr and the
    # adapters never import the trainer)
    "lmpo.objectives": ("lmpo.trainer", "lmpo.generation", "lmpo.rlvcr", "lmpo.integrations", "lmpo.lab",
                        "lmpo.textagent", "lmpo.tasks", "lmpo.rewards", "lmpo.models"),
    "lmpo.generation": ("lmpo.trainer", "lmpo.rlvcr", "lmpo.integrations", "lmpo.lab"),
    "lmpo.rlvcr": ("lmpo.trainer", "lmpo.integrations", "lmpo.lab"),
    "lmpo.integrations": ("lmpo.trainer", "lmpo.lab"),
    "lmpo.textagent.env": ("lmpo.textagent.sac",),
    # LM environments sit below the episode driver (lmpo.generation.episodes) and never see a trainer
    "lmpo.envs": ("lmpo.trainer", "lmpo.generation", "lmpo.rlvcr", "lmpo.integrations", "lmpo.lab", "lmpo.textagent"),
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
    """module → the lmpo modules it imports; a fresh copy of the graph read once per source tree."""
    return {m: set(deps) for m, deps in _graph_of(SRC).items()}


@cache
def _graph_of(src: Path) -> dict[str, frozenset[str]]:
    modules = {_module_name(p): p for p in src.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in _imports(path, name, set(modules)):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                deps.add(target)
        graph[name] = frozenset(deps)
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


#: the only modules outside lmpo.textagent that the text agent may reach, directly or through each other: the
#: shared utilities. A new one joins here when the agent needs it and its own imports stay inside this set.
TEXTAGENT_SHARED = ("lmpo", "lmpo._hints", "lmpo.checkpoints", "lmpo.config", "lmpo.errors", "lmpo.overrides",
                    "lmpo.plots", "lmpo.runs")
#: the only modules outside lmpo.textagent that may import it: the docs generator (the SAC config reference)
#: and the deprecated alias packages. The command router (lmpo.cli) reaches it by name, through importlib.
TEXTAGENT_IMPORTERS = ("lmpo.generated_docs", "lmpo.sac", "lmpo.textenv")


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def textagent_boundary(graph: dict[str, set[str]]) -> list[str]:
    """Every import across the wall between the text agent (lmpo.textagent) and the GRPO packages: a module
    the agent reaches (transitively) outside itself and TEXTAGENT_SHARED, and a module outside it and
    TEXTAGENT_IMPORTERS that imports it or one of the deprecated aliases lmpo.sac / lmpo.textenv."""
    agent = {m for m in graph if _inside(m, ("lmpo.textagent",))}
    reached, todo = set(agent), list(agent)
    while todo:
        todo += [d for d in graph[todo.pop()] if d in TEXTAGENT_SHARED and d not in reached]
        reached.update(todo)
    bad = [f"{m} imports {d}" for m in reached for d in graph[m] if not (d in agent or d in TEXTAGENT_SHARED)]
    for m, deps in sorted(graph.items()):
        if _inside(m, ("lmpo.textagent",) + TEXTAGENT_IMPORTERS):
            continue
        bad += [f"{m} imports {d}" for d in deps if _inside(d, ("lmpo.textagent", "lmpo.sac", "lmpo.textenv"))]
    return sorted(bad)


def test_textagent_and_the_grpo_packages_import_nothing_of_each_other():
    bad = textagent_boundary(import_graph())
    assert not bad, ("the text agent builds only on the shared utilities and nothing outside it imports it "
                     "(move the shared piece into one of TEXTAGENT_SHARED, or add it there if it is one): "
                     + "; ".join(bad))


def test_textagent_boundary_sees_a_crossing():
    """The check itself: planted imports each way, direct and through a shared utility, are all reported."""
    graph = import_graph()
    graph["lmpo.textagent.sac.agent"].add("lmpo.objectives")
    graph["lmpo.textagent.env.env"].add("lmpo.objectives")
    graph["lmpo.errors"].add("lmpo.generation")
    graph["lmpo.lab"].add("lmpo.textagent.env")
    graph["lmpo.objectives"].add("lmpo.sac")
    assert textagent_boundary(graph) == ["lmpo.errors imports lmpo.generation",
                                         "lmpo.lab imports lmpo.textagent.env",
                                         "lmpo.objectives imports lmpo.sac",
                                         "lmpo.textagent.env.env imports lmpo.objectives",
                                         "lmpo.textagent.sac.agent imports lmpo.objectives"]


def loaded_by_importing(graph: dict[str, set[str]], module: str) -> set[str]:
    """The lmpo modules that ``import module`` runs: what it imports, transitively, and the ``__init__`` of every
    package on the way (Python runs ``a/__init__.py`` and ``a/b/__init__.py`` before ``a.b.c``)."""
    loaded, todo = set(), [module]
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for name in [".".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            if name in graph and name not in loaded:
                loaded.add(name)
                todo += graph[name]
    return loaded


def test_config_sections_import_only_the_base():
    """rlvcr/config.py and the SAC config build on lmpo.config, never on the trainer (no import cycle): importing
    them loads no module of lmpo.trainer, package initialisers included."""
    graph = import_graph()
    for module in ("lmpo.rlvcr.config", "lmpo.textagent.sac.config"):
        trainer = sorted(m for m in loaded_by_importing(graph, module) if _inside(m, ("lmpo.trainer",)))
        assert trainer == [], f"importing {module} loads {trainer}"
    graph["lmpo.generation.hf"].add("lmpo.trainer.config")  # the check sees a path through a package's __init__
    assert "lmpo.trainer.config" in loaded_by_importing(graph, "lmpo.rlvcr.config")
