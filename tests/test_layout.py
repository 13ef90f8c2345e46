"""The layout's rules, read from the imports (every `import`, at module
level or inside a function): the core knows no game, the recipe imports no
game's options, judging knows no loop, and no module imports itself back
through others. README "How the code is laid out" states the same rules."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lora_triplay"
CORE = ("lora_triplay.core", "lora_triplay.training", "lora_triplay.engine", "lora_triplay.judging")
GAMES = ("lora_triplay.triplay",)  # and every lora_triplay.games.<name> but the registry and base
REGISTRY = ("lora_triplay.games", "lora_triplay.games.base")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> the lora_triplay modules it imports (a package import counts as its __init__)."""
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1]) if node.level else ""
                target = ".".join(x for x in (base, node.module) if x)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[name] = {m for m in found if m in modules and m != name}
    return out


def _is_game(module: str) -> bool:
    if module.startswith(GAMES):
        return True
    return module.startswith("lora_triplay.games.") and module not in REGISTRY


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if mod.startswith(CORE) and _is_game(dep):
                bad.append(f"{mod} imports the game module {dep}")
            if mod == "lora_triplay.recipe" and (_is_game(dep) or dep.startswith("lora_triplay.games.")):
                bad.append(f"lora_triplay.recipe imports game options from {dep}")
            if mod.startswith("lora_triplay.judging") and dep.startswith("lora_triplay.triplay"):
                bad.append(f"{mod} imports {dep}: judging knows no loop")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_imports_are_its_init(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exporting its own submodules is no cycle
    (`rewards/__init__` imports `rewards.blue`, which never imports the package)."""
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def test_the_core_knows_no_game_and_there_are_no_cycles():
    graph = _package_imports_are_its_init(imports())
    assert violations(graph) == []
    assert cycles(graph) == []


def test_the_rules_catch_a_game_import_in_the_core_and_a_cycle():
    """The checks themselves: an engine importing TriPlay, and two modules
    importing each other, must be reported."""
    graph = _package_imports_are_its_init(imports())
    graph["lora_triplay.engine.hf"] = graph["lora_triplay.engine.hf"] | {"lora_triplay.triplay.roles"}
    graph["lora_triplay.model"] = graph["lora_triplay.model"] | {"lora_triplay.plan"}
    graph["lora_triplay.plan"] = graph["lora_triplay.plan"] | {"lora_triplay.model"}
    assert "lora_triplay.engine.hf imports the game module lora_triplay.triplay.roles" in violations(graph)
    assert any({"lora_triplay.model", "lora_triplay.plan"} <= set(c) for c in cycles(graph))


@pytest.mark.parametrize("limit", [500])
def test_no_module_is_over_the_size_we_keep(limit):
    """design.md: no file over about 500 lines."""
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit}
    assert long == {}
