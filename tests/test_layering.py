"""The layers point one way, and no module imports itself back.

``kernels`` (the Triton kernels, liftable into an engine) and ``reference`` (the independent oracle) import nothing of
each other or of ``harness``; ``harness`` sits on both; ``ssd_pytest`` (the pytest machinery) sits on ``harness``, which
must not import it; ``peers`` (adapters for other engines' kernels) and the rest never import each other. The import
graph is read from the source with ``ast``: every ``import`` statement counts, those inside functions too (a deferred
import still ties the layers together), and relative imports are resolved. An import cycle among the repository's
modules fails as well, with the cycle spelled out.

The checker runs on the repository and, to show that it can fail, on small synthetic trees with one forbidden import
or one cycle each.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from tests.support import needs_cpu_interpreter

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernels", "reference", "harness", "ssd_pytest", "peers")
# (importer's package, imported package) pairs that break the layering, with the reason reported.
FORBIDDEN = {
    ("kernels", "harness"): "kernels must be liftable into an engine without the harness",
    ("kernels", "reference"): "the product must not run the oracle (a shared bug could not be seen)",
    ("reference", "kernels"): "the oracle must be independent of the kernels it judges",
    ("reference", "harness"): "the oracle must not depend on the harness that uses it",
    ("harness", "ssd_pytest"): "the pytest machinery sits on top of the harness, not under it",
    # Adapters for other engines' kernels are providers like any user's: the harness loads them by name.
    **{("peers", p): "a peer adapter is a provider: it stands on its engine alone, as a user's would"
       for p in ("harness", "kernels", "reference", "ssd_pytest")},
    **{(p, "peers"): "nothing depends on a peer adapter; the harness loads it by name (--provider)"
       for p in ("harness", "kernels", "reference", "ssd_pytest")},
}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    file: Path
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` below ``root``: dotted name -> file."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")) if (root / package).is_dir() else ():
            found[module_name(root, path)] = path
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (``from . import x``, ``from ..a import b`` resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in (``harness.cases.model.Case`` -> harness.cases.model)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def import_edges(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Edge]:
    """One edge per imported module of ``packages`` per import statement, anywhere in a module's source."""
    known = modules_under(root, packages)
    edges: dict[tuple[str, str, int], Edge] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, path.name == "__init__.py", node)
                # ``from pkg import sub`` imports the submodule when there is one, else a name of ``pkg``.
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for name in names:
                target = _target(name, known)
                if target is not None and target != module:
                    edges.setdefault((module, target, node.lineno),
                                     Edge(module, target, path.relative_to(root), node.lineno))
    return list(edges.values())


def layer_violations(edges: list[Edge]) -> list[str]:
    found = []
    for e in edges:
        rule = FORBIDDEN.get((e.importer.split(".")[0], e.imported.split(".")[0]))
        if rule is not None:
            found.append(f"{e.where()}: {e.importer} imports {e.imported} ({rule})")
    return found


def import_cycles(edges: list[Edge]) -> list[str]:
    """One cycle per strongly connected component of the module graph, as 'a -> b -> a' with each edge's place."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.importer, {}).setdefault(e.imported, e)
        graph.setdefault(e.imported, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)

    cycles = []
    for component in components:
        members, start = set(component), component[0]
        # Breadth-first from start within the component back to start: the shortest cycle through it.
        previous: dict[str, str] = {}
        frontier, seen = [start], {start}
        while frontier and start not in previous:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in members and w == start and start not in previous:
                        previous[start] = v
                    elif w in members and w not in seen:
                        seen.add(w)
                        previous[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        v = previous[start]
        while v != start:
            path.append(v)
            v = previous[v]
        path.append(start)
        path.reverse()
        hops = [graph[a][b] for a, b in pairwise(path)]
        cycles.append(" -> ".join(path) + "  (" + ", ".join(h.where() for h in hops) + ")")
    return cycles


# ---- the repository --------------------------------------------------------------------------------------------


def test_the_scan_sees_the_packages_and_deferred_imports():
    """Guards the checker itself on the real tree: it finds the packages and an import made inside a function
    (harness.cli imports harness.warmup only after the backend is configured)."""
    edges = import_edges(ROOT)
    assert {"kernels.ssd", "reference.chunked", "harness.cli"} <= set(modules_under(ROOT, PACKAGES))
    assert any(e.importer == "harness.cli" and e.imported == "harness.warmup" for e in edges)


def test_layers_point_one_way():
    violations = layer_violations(import_edges(ROOT))
    assert not violations, "forbidden imports:\n" + "\n".join(violations)


def test_no_import_cycles():
    cycles = import_cycles(import_edges(ROOT))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@needs_cpu_interpreter
def test_the_triton_free_kernel_modules_may_precede_the_backend_choice():
    """The case model reads the interface (``kernels.interface``) and the harness reads the kernels' variable names
    (``kernels.environment``) before ``harness.backend.configure`` chooses the backend: neither imports triton, and
    configure refuses only once ``kernels.backend``, the module that reads TRITON_INTERPRET, was imported with the
    other value. In a fresh interpreter, so that this process's backend stays as it is."""
    code = "\n".join([
        "import os, sys",
        "os.environ['TRITON_INTERPRET'] = '0'",
        "import kernels.environment, kernels.interface, harness.cases.model",
        "from harness import backend",
        "assert 'triton' not in sys.modules, 'triton was imported'",
        "assert backend.configure('cpu') == 'cpu' and os.environ['TRITON_INTERPRET'] == '1'",
        "os.environ['TRITON_INTERPRET'] = '0'",
        "import kernels.backend",
        "try:",
        "    backend.configure('cpu')",
        "except RuntimeError as exc:",
        "    print('refused:', exc)",
    ])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: kernels were imported with TRITON_INTERPRET=0" in done.stdout, done.stdout


# ---- the checker can fail --------------------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "kernels/__init__.py": "",
    "kernels/ops.py": "import torch\nfrom kernels import util\n",
    "kernels/util.py": "",
    "kernels/sub/__init__.py": "from .. import util\n",
    "reference/__init__.py": "from reference.oracle import run\n",
    "reference/oracle.py": "def run():\n    pass\n",
    "harness/__init__.py": "",
    "harness/checks.py": "from kernels.ops import *\nfrom reference import oracle\n",
    "ssd_pytest/__init__.py": "from harness import checks\n",
}


def test_a_clean_synthetic_tree_passes(tmp_path):
    edges = import_edges(_tree(tmp_path, CLEAN))
    assert layer_violations(edges) == [] and import_cycles(edges) == []
    assert {(e.importer, e.imported) for e in edges} == {
        ("kernels.ops", "kernels.util"), ("kernels.sub", "kernels.util"), ("reference", "reference.oracle"),
        ("harness.checks", "kernels.ops"), ("harness.checks", "reference.oracle"), ("ssd_pytest", "harness.checks")}


def test_forbidden_imports_are_reported_even_inside_functions(tmp_path):
    tree = _tree(tmp_path, {
        **CLEAN,
        "kernels/ops.py": "def gather():\n    from reference import oracle\n    return oracle\n",
        "kernels/util.py": "import harness.checks as checks\n",
        "reference/oracle.py": "import kernels.util\n",
        "harness/checks.py": "def plugin():\n    import ssd_pytest\n",
    })
    found = layer_violations(import_edges(tree))
    assert len(found) == 4, found
    for importer, imported in (("kernels.ops", "reference.oracle"), ("kernels.util", "harness.checks"),
                               ("reference.oracle", "kernels.util"), ("harness.checks", "ssd_pytest")):
        assert any(f"{importer} imports {imported} " in line for line in found), (importer, imported, found)
    assert any(line.startswith("kernels/ops.py:2:") for line in found), found


def test_a_cycle_is_reported_with_its_path(tmp_path):
    tree = _tree(tmp_path, {
        **CLEAN,
        "harness/bench.py": "from harness.stage_bench import time_stage\n",
        "harness/stage_bench.py": "def time_stage():\n    from harness import bench\n",
        "harness/a.py": "from harness import b\n",
        "harness/b.py": "from harness import c\n",
        "harness/c.py": "import harness.a\n",
    })
    cycles = import_cycles(import_edges(tree))
    assert len(cycles) == 2, cycles
    assert cycles[0].startswith("harness.a -> harness.b -> harness.c -> harness.a  (harness/a.py:1"), cycles
    assert cycles[1].startswith("harness.bench -> harness.stage_bench -> harness.bench  (harness/bench.py:1, "
                                "harness/stage_bench.py:2)"), cycles
