"""Nothing below the front ends imports a wire library (gRPC, the HTTP frameworks): the wire
ends at the edge. (test_dependency_direction.py checks who imports the front ends.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BELOW_FRONT_ENDS = [
    # The request path and the model lifecycle, whole.
    *sorted((ROOT / "server" / "inference").rglob("*.py")),
    *sorted((ROOT / "server" / "models").rglob("*.py")),
    *(ROOT / "server" / name for name in ("errors.py",)),
    *sorted((ROOT / "server" / "workers").rglob("*.py")),
    *sorted((ROOT / "link").rglob("*.py")),
    *sorted((ROOT / "scheduler").rglob("*.py")),
    *sorted((ROOT / "backends").rglob("*.py")),
]
FORBIDDEN = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "fastapi",
    "starlette",
    "uvicorn",
    "orjson",
)


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    package = "ge_serve." + ".".join(path.relative_to(ROOT).parent.parts)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
                names.update(f"{module}.{alias.name}" for alias in node.names)
                names.add(module)
            elif node.module:
                names.add(node.module)
    return names


@pytest.mark.parametrize("path", BELOW_FRONT_ENDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_wire_library_below_the_front_ends(path: Path) -> None:
    bad = sorted(
        name
        for name in imported_modules(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    )
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_check_sees_relative_imports() -> None:
    names = imported_modules(ROOT / "server" / "grpc" / "servicer.py")
    assert "ge_serve.server.inference.core" in names
    assert "ge_serve.server.grpc.codec" in names
