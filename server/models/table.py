"""The table of models a server logs once it has loaded its startup models, as Triton
prints it: each model, its version and its state (with the reason it is not ready)."""

from __future__ import annotations

from collections.abc import Sequence

from ..inference.reports import ModelState, RepositoryEntry


def model_table(rows: Sequence[RepositoryEntry]) -> str:
    width = max([len(r.name) for r in rows] + [5])
    lines = [f"{'Model':<{width}} | Version | Status"]
    lines.append("-" * (width + 1) + "+---------+" + "-" * 30)
    for row in rows:
        status = row.state.value if row.state is not None else "UNAVAILABLE"
        if row.reason and row.state is not ModelState.READY:
            status += f": {row.reason}"
        version = "" if row.version is None else str(row.version)
        lines.append(f"{row.name:<{width}} | {version:<7} | {status}")
    return "\n".join(lines)
