"""The import graph of a package's modules, read from their sources with ``ast`` (nothing is imported): an edge
``a -> b`` for every ``import`` or ``from ... import`` of ``b`` anywhere in ``a``, at the top or inside a function,
absolute or relative. A function-level import is an edge too: it hides a circle from Python, not from the design.

``from package import name`` is an edge to ``package.name`` when that is a module, else to ``package`` itself.
The implicit import of a module's parent packages is no edge (Python's doing, not the module's)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple


def modules(package_dir: Path) -> Dict[str, Tuple[Path, bool]]:
    """Every module under ``package_dir`` by dotted name: its file and whether it is a package's ``__init__``."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(package_dir: Path) -> Dict[str, Set[str]]:
    """Each module of the package and the modules of the same package it imports."""
    known = modules(package_dir)
    root = package_dir.name
    graph = {}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        targets = set()
        for imported in _imported_names(ast.parse(path.read_text(), filename=str(path)), package):
            if imported == root or imported.startswith(root + "."):
                target = _owning_module(imported, known)
                if target is not None and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _imported_names(tree: ast.AST, package: str) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield from (base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names)


def _owning_module(dotted: str, known) -> Optional[str]:
    """The longest module name that ``dotted`` starts with: ``pkg.mod.func`` is ``pkg.mod``."""
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def mutual_imports(graph: Dict[str, Set[str]]) -> List[Tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One shortest cycle (``[a, b, ..., a]``) through each group of modules that reach one another."""
    found = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            start = min(group)
            found.append([start, *_shortest_path(graph, group, start)])
    return found


def _shortest_path(graph, group: Set[str], start: str) -> List[str]:
    """The shortest path from ``start`` back to itself, inside ``group``."""
    came_from = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                back = [node]  # node, its predecessor, ..., start
                while back[-1] != start:
                    back.append(came_from[back[-1]])
                return [*reversed(back[:-1]), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in a strongly connected group but reaches no cycle")


def _strongly_connected(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """Tarjan's algorithm, iterative (a deep package would exceed Python's recursion limit)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
    return groups
