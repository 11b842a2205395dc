"""The dependency direction, checked on the source with ast: front ends -> core -> scheduler
-> backends. Nothing below the front ends knows them, only the composition root
(server/app.py) wires them in, and no two modules import each other, however indirectly.
No module is so long that it holds more than one concern.

Every import counts: module level, inside functions and under `if TYPE_CHECKING:`, since
each one is a dependency a reader has to follow (and a circle hidden in a function is still
a circle)."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"server": "ge_serve.server", "scheduler": "ge_serve.scheduler",
            "backends": "ge_serve.backends", "link": "ge_serve.link",
            "protos": "ge_serve.protos"}  # fmt: skip
FRONT_ENDS = ("ge_serve.server.http", "ge_serve.server.grpc")
COMPOSITION_ROOT = "ge_serve.server.app"
# Derives each front end's settings for the composition root.
ROOT_HELPERS = ("ge_serve.server.startup.part_settings",)
# What scheduler/ must never import: the front ends, the CLI and its settings, and the
# core that drives it (lifecycle, control, the composition root).
ABOVE_SCHEDULER = tuple(
    f"ge_serve.server.{name}"
    for name in (
        "inference.core",
        "http",
        "grpc",
        "models.lifecycle",
        "control.model_control",
        "app",
        "cli",
        "startup.settings",
    )
)


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    top, *rest = relative.parts
    parts = [PACKAGES[top], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> list[Path]:
    files = [p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in files if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


def imports_in(source: str, module: str, is_package: bool) -> set[str]:
    """Every module `source` (the text of `module`) imports, wherever the import statement
    stands, relative imports resolved; `from a import b` counts as both `a` and `a.b`, since
    b may be a module."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def imported_modules(path: Path) -> set[str]:
    source = path.read_text(encoding="utf-8")
    return imports_in(source, module_name(path), path.name == "__init__.py")


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def import_graph(files: list[Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (third-party and generated ones left out)."""
    graph = {module_name(p): imported_modules(p) for p in files}
    return {
        module: {m for m in found if m in graph and m != module} for module, found in graph.items()
    }


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """One import circle per strongly connected group of modules, as a path that starts and
    ends at the same module; empty when the graph has no circle (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle_through(graph, group) for group in groups]


def _circle_through(graph: Mapping[str, Set[str]], group: set[str]) -> list[str]:
    """A shortest circle from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == start:
                    return [*paths[node], start]
                if target in group and target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(group)}")  # pragma: no cover


FILES = source_files()


def test_the_scan_sees_the_code() -> None:
    names = {module_name(p) for p in FILES}
    for expected in ("ge_serve.server.inference.core", "ge_serve.server.http.app",
                     COMPOSITION_ROOT, "ge_serve.scheduler.direct", "ge_serve.backends.onnxruntime",
                     "ge_serve.backends.ge.backend"):  # fmt: skip
        assert expected in names
    # Every Python file of the three packages is scanned, however deep it sits.
    for top in ("server", "scheduler", "backends", "link"):
        on_disk = {module_name(p) for p in (ROOT / top).rglob("*.py")}
        assert on_disk <= names
    # The resolver sees relative imports, or the checks below would pass vacuously.
    assert "ge_serve.server.http.app" in imported_modules(ROOT / "server" / "app.py")
    assert "ge_serve.server.errors" in imported_modules(ROOT / "server" / "http" / "codec.py")


def test_the_scan_sees_imports_wherever_they_stand() -> None:
    source = "\n".join(
        [
            "from typing import TYPE_CHECKING",
            "import ge_serve.scheduler.base",
            "from .. import errors",
            "from ..core import InferenceServer",
            "from . import codec",
            "if TYPE_CHECKING:",
            "    from .app import HttpFrontEnd",
            "def late() -> None:",
            "    from ge_serve.server.metrics import MetricsConfig",
            "class Late:",
            "    def method(self) -> None:",
            "        import ge_serve.backends.base",
        ]
    )
    found = imports_in(source, "ge_serve.server.http.routes", is_package=False)
    for expected in (
        "ge_serve.scheduler.base",
        "ge_serve.server.errors",
        "ge_serve.server.core",
        "ge_serve.server.http.codec",
        "ge_serve.server.http.app",
        "ge_serve.server.metrics",
        "ge_serve.backends.base",
    ):
        assert expected in found
    # In a package's __init__, `.` is the package itself.
    assert "ge_serve.server.http.app" in imports_in(
        "from .app import x", "ge_serve.server.http", True
    )


def test_a_circle_is_found_and_shown() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a"}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_among_the_package_modules() -> None:
    found = cycles(import_graph(FILES))
    assert not found, "import circle(s):\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.relative_to(ROOT).parts[0] in ("scheduler", "backends", "protos")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_scheduler_backends_and_protos_import_no_front_end_core_or_cli(path: Path) -> None:
    bad = sorted(m for m in imported_modules(path) if within(m, ABOVE_SCHEDULER))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.relative_to(ROOT).parts[0] in ("backends", "protos")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_backends_import_neither_the_scheduler_nor_the_server(path: Path) -> None:
    above = ("ge_serve.scheduler", "ge_serve.server")
    bad = sorted(m for m in imported_modules(path) if within(m, above))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.relative_to(ROOT).parts[0] == "link"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_process_link_imports_nothing_of_the_server_scheduler_or_backends(
    path: Path,
) -> None:
    # Both the server's front-end workers and the Python backend's workers build on it.
    above = ("ge_serve.server", "ge_serve.scheduler", "ge_serve.backends")
    bad = sorted(m for m in imported_modules(path) if within(m, above))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_composition_root_imports_a_front_end(path: Path) -> None:
    module = module_name(path)
    if module == COMPOSITION_ROOT or module in ROOT_HELPERS:
        return
    # A front end may import its own modules, never the other front end.
    own = tuple(f for f in FRONT_ENDS if within(module, (f,)))
    others = tuple(f for f in FRONT_ENDS if f not in own)
    bad = sorted(m for m in imported_modules(path) if within(m, others))
    assert not bad, f"{path.relative_to(ROOT)} imports front end module(s) {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_but_the_cli_imports_the_cli(path: Path) -> None:
    module = module_name(path)
    bad = sorted(m for m in imported_modules(path) if within(m, ("ge_serve.server.cli",)))
    assert module == "ge_serve.server.cli" or not bad, f"{path.relative_to(ROOT)} imports {bad}"


# Past this, a module holds more than one concern: split it (docs/architecture.md lists
# what each module holds).
MAX_LINES = 500


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_a_god_file(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"
