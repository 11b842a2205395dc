"""The dependency direction, checked on the source with ast: front ends -> core -> scheduler
-> backends. Nothing below the front ends knows them, and only the composition root
(server/app.py) wires them in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"server": "ge_serve.server", "scheduler": "ge_serve.scheduler",
            "backends": "ge_serve.backends", "protos": "ge_serve.protos"}  # fmt: skip
FRONT_ENDS = ("ge_serve.server.http", "ge_serve.server.grpc")
# What scheduler/ and backends/ must never import: the core and everything above it.
ABOVE_SCHEDULER = tuple(
    f"ge_serve.server.{name}" for name in ("core", "http", "grpc", "lifecycle", "app", "cli")
)
COMPOSITION_ROOT = "ge_serve.server.app"


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


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved; `from a import b` counts as
    both `a` and `a.b`, since b may be a module."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
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


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


FILES = source_files()


def test_the_scan_sees_the_code() -> None:
    names = {module_name(p) for p in FILES}
    for expected in ("ge_serve.server.core", "ge_serve.server.http.app", COMPOSITION_ROOT,
                     "ge_serve.scheduler.direct", "ge_serve.backends.onnxruntime"):  # fmt: skip
        assert expected in names
    # The resolver sees relative imports, or the checks below would pass vacuously.
    assert "ge_serve.server.http.app" in imported_modules(ROOT / "server" / "app.py")
    assert "ge_serve.server.errors" in imported_modules(ROOT / "server" / "http" / "codec.py")


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.relative_to(ROOT).parts[0] in ("scheduler", "backends", "protos")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_scheduler_backends_and_protos_do_not_import_the_core_or_above(path: Path) -> None:
    bad = sorted(m for m in imported_modules(path) if within(m, ABOVE_SCHEDULER))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.relative_to(ROOT).parts[0] in ("backends", "protos")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_backends_do_not_import_the_scheduler(path: Path) -> None:
    bad = sorted(m for m in imported_modules(path) if within(m, ("ge_serve.scheduler",)))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_composition_root_imports_a_front_end(path: Path) -> None:
    module = module_name(path)
    if module == COMPOSITION_ROOT:
        return
    # A front end may import its own modules, never the other front end.
    own = tuple(f for f in FRONT_ENDS if within(module, (f,)))
    others = tuple(f for f in FRONT_ENDS if f not in own)
    bad = sorted(m for m in imported_modules(path) if within(m, others))
    assert not bad, f"{path.relative_to(ROOT)} imports front end module(s) {bad}"
