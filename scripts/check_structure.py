#!/usr/bin/env python3
"""The structure check of akadze: fails when ``src/akadze`` breaks a rule of its shape.

Usage: ``python scripts/check_structure.py [SOURCE_ROOT]`` (default: ``src`` next to
this script's folder). Prints each offence on one line and exits 1 if there is any,
0 otherwise. Standard library only; the modules are parsed, never imported.

The rules (CONTRIBUTING.md, docs/explanation/architecture.md):

- No import cycles. Every import counts, wherever it is written: at the top, late
  inside a function, or under ``if TYPE_CHECKING:``. A cycle is reported once per
  group of modules that reach each other, as one shortest cycle through the group,
  located at the import that starts it.
- No runtime module over 600 lines (every ``.py`` file of the package; SQL files
  and tests are not modules of the package).
- A private module (``_name.py`` inside a package) is imported only from inside its
  package: the package's ``__init__.py`` is its one door.
- The harness (``akadze.bench``: benchmarks, fault scenarios, the demo) is imported
  only by itself and by the CLI: the library never depends on it.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINES = 600
PACKAGE = "akadze"
HARNESS = "akadze.bench"
HARNESS_USERS = ("akadze.bench", "akadze.cli")


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. akadze.claim._windows
    path: Path
    is_package: bool  # an __init__.py


@dataclass(frozen=True)
class Edge:
    target: str
    line: int


def find_modules(root: Path) -> dict[str, Module]:
    """Every module of the package under ``root`` (the folder that holds ``akadze/``)."""
    modules: dict[str, Module] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = Module(".".join(parts), path, is_package)
    return modules


def _base(module: Module, level: int) -> str:
    """The package a relative import of ``level`` dots in ``module`` starts from."""
    parts = module.name.split(".")
    if not module.is_package:
        parts.pop()
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts)


def _owner(name: str, modules: dict[str, Module]) -> str | None:
    """The module that ``name`` is, or that defines it (its longest known prefix)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports(module: Module, modules: dict[str, Module]) -> Iterator[Edge]:
    """The package's modules that ``module`` imports, anywhere in its text."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _base(module, node.level)
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            # ``from x import y``: y is a submodule of x, or a name x defines.
            targets = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            owner = _owner(target, modules)
            if owner is not None and owner != module.name:
                yield Edge(owner, node.lineno)


def graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of its first import}."""
    edges: dict[str, dict[str, int]] = {}
    for name, module in modules.items():
        out: dict[str, int] = {}
        for edge in imports(module, modules):
            out[edge.target] = min(out.get(edge.target, edge.line), edge.line)
        edges[name] = out
    return edges


def strongly_connected(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The groups of modules that import each other (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def shortest_cycle(start: str, group: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest cycle from ``start`` back to it, within ``group`` (breadth first)."""
    members = set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a cycle group but on no cycle")


def offences(root: Path) -> list[str]:
    modules = find_modules(root)
    edges = graph(modules)
    found: list[str] = []

    def where(name: str) -> str:
        path = modules[name].path.resolve()
        try:
            return path.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return str(path)

    for group in strongly_connected(edges):
        cycle = shortest_cycle(group[0], group, edges)
        line = edges[cycle[0]][cycle[1]]
        others = sorted(set(group) - set(cycle))
        also = f" (its group also holds {', '.join(others)})" if others else ""
        found.append(f"{where(cycle[0])}:{line}: import cycle {' -> '.join(cycle)}{also}")

    for name, module in sorted(modules.items()):
        with module.path.open(encoding="utf-8") as text:
            lines = sum(1 for _ in text)
        if lines > MAX_LINES:
            found.append(f"{where(name)}: {lines} lines, over the {MAX_LINES} of a module")

    for name in sorted(modules):
        for target, line in sorted(edges[name].items()):
            private = target.rsplit(".", 1)
            if len(private) == 2 and private[1].startswith("_") and not private[1].startswith("__"):
                package = private[0]
                if name != package and not name.startswith(package + "."):
                    found.append(f"{where(name)}:{line}: imports {target}, a private module "
                                 f"of {package} (import {package} instead)")

    def within(name: str, packages: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in packages)

    for name in sorted(modules):
        if within(name, HARNESS_USERS):
            continue
        for target, line in sorted(edges[name].items()):
            if within(target, (HARNESS,)):
                found.append(f"{where(name)}:{line}: imports {target}: only the CLI and the "
                             f"harness itself import {HARNESS}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) > 2:
        print("usage: check_structure.py [SOURCE_ROOT]", file=sys.stderr)
        return 2
    root = Path(argv[1]) if len(argv) == 2 else Path(__file__).resolve().parent.parent / "src"
    if not (root / PACKAGE).is_dir():
        print(f"check_structure: no {PACKAGE}/ package under {root}", file=sys.stderr)
        return 2
    found = offences(root)
    for offence in found:
        print(offence)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
