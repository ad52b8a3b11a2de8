"""No import cycles: every module imports alone, and module-level imports form no cycle."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ddlkit"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _top_level_imports(path: Path, name: str, everywhere: bool = False) -> set[str]:
    """Modules ``name`` imports when it is imported (not inside functions, not for typing);
    ``everywhere``: every import in the file, inside functions and for typing too."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for item in getattr(node, block, []) or []:
                        visit(item.body if isinstance(item, ast.ExceptHandler) else [item])
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)

    visit(list(ast.walk(tree)) if everywhere else tree.body)
    edges = set()
    for target in found:
        # importing a.b.c runs a, a.b and a.b.c
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in MODULES and prefix != name:
                edges.add(prefix)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_module_level_imports_form_no_cycle():
    graph = {name: _top_level_imports(path, name) for name, path in MODULES.items()}
    # a package's parent package is imported first, which is not a cycle
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert _cycles(graph) == []


# Dependencies that go one way even counting imports inside functions and for typing: the
# strategies read a run's config through a protocol (strategies.base.RunConfig), not
# launch.plan; Spark's start and launch.run share launch.handle and launch.collect.
ONE_WAY = (
    ("ddlkit.launch.plan", "ddlkit.strategies"),
    ("ddlkit.launch.run", "ddlkit.spark.submit"),
    ("ddlkit.launch.run", "ddlkit.where"),
    ("ddlkit.interactive.session", "ddlkit.launch.run"),
    ("ddlkit.interactive.start", "ddlkit.launch.run"),
)


def test_launch_strategies_spark_and_where_form_no_cycle_even_through_functions():
    graph = {
        name: _top_level_imports(path, name, everywhere=True) for name, path in MODULES.items()
    }
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cyclic = {m for component in _cycles(graph) for m in component}
    for user, used in ONE_WAY:
        inside = {m for m in cyclic if m == used or m.startswith(used + ".")}
        assert user not in cyclic and not inside, (
            f"{user} and {used} import each other (counting imports in functions): {sorted(cyclic)}"
        )


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _import_alone(name: str) -> tuple[str, int, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    return name, out.returncode, out.stderr[-2000:]


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """A cycle that works only by import order (a imports b imports a, and a is imported
    first everywhere) fails here for the module that is imported first on its own.

    One interpreter per module, as many at once as there are cores (measured: 62 s for
    95 modules at load 12 on 2 cores, 18 s of CPU). ``__main__`` modules are entry points
    that run when imported (``python -m ddlkit.bench`` runs a benchmark): left out.
    """
    names = [n for n in MODULES if not n.endswith("__main__")]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_import_alone, names))
    failed = {name: err for name, code, err in results if code != 0}
    assert not failed, "\n\n".join(f"import {n} alone fails:\n{e}" for n, e in failed.items())
