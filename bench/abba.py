"""Compare server configurations side by side, in rotating order, from one run.

Every configuration gets its own ge-serve process, all started together, and a `measure`
callback is called on each in turn for `rounds` rounds; the order rotates every round and
reverses every other cycle (ABBA for two), so slow drift on a shared machine falls on all
of them alike. The rounds are split over `sessions` sets of fresh servers started in
rotating order: on this 2-core machine the server started first measured ~2 % faster than
an identical twin, an artefact a single session would book against one configuration.

    results = compare({"on": ServerSpec(repo), "off": ServerSpec(repo, ["--allow-metrics=false"])},
                      sessions=2, rounds=6, measure=lambda name, srv: {"throughput": ...})
    median(results, "on", "throughput")
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server import ServerProcess, serve

Row = dict[str, Any]


@dataclass
class ServerSpec:
    """How to start one configuration's server."""

    repos: Path | Sequence[Path]
    flags: Sequence[str] = field(default_factory=tuple)


def rotation(names: Sequence[str], index: int) -> list[str]:
    """`names` rotated by `index`, reversed on every other full cycle."""
    count = len(names)
    if not count:
        return []
    shift = index % count
    order = [*names[shift:], *names[:shift]]
    return order[::-1] if (index // count) % 2 else order


def compare(
    configs: Mapping[str, ServerSpec],
    sessions: int,
    rounds: int,
    measure: Callable[[str, ServerProcess], Row],
    after_session: Callable[[Mapping[str, ServerProcess]], None] | None = None,
    log: Callable[[str], None] = print,
    alone: bool = False,
) -> dict[str, list[Row]]:
    """Rows measured per configuration, `sessions` x `rounds` of them. `after_session` sees
    the running servers before each session's servers stop. `alone`: each measurement
    gets a fresh server and no other is up (for figures against raw onnxruntime, which
    runs alone too); the order still rotates, and `after_session` sees each server alone."""
    results: dict[str, list[Row]] = {name: [] for name in configs}
    names = list(configs)
    if alone:
        for index in range(sessions * rounds):
            for name in rotation(names, index):
                with serve(configs[name].repos, list(configs[name].flags)) as server:
                    row = measure(name, server)
                    if after_session is not None:
                        after_session({name: server})
                results[name].append(row)
                log(f"round {index + 1}/{sessions * rounds} {name} (alone): {_brief(row)}")
        return results
    for session in range(sessions):
        start_order = rotation(names, session)
        with contextlib.ExitStack() as stack:
            servers = {
                name: stack.enter_context(serve(configs[name].repos, list(configs[name].flags)))
                for name in start_order
            }
            for index in range(rounds):
                for name in rotation(names, session + index):
                    row = measure(name, servers[name])
                    results[name].append(row)
                    where = f"session {session + 1}/{sessions} round {index + 1}/{rounds}"
                    log(f"{where} {name}: {_brief(row)}")
            if after_session is not None:
                after_session(servers)
    return results


def median(results: Mapping[str, Sequence[Row]], name: str, key: str) -> float:
    return statistics.median(float(row[key]) for row in results[name] if key in row)


def _brief(row: Row) -> str:
    return ", ".join(f"{k} {_short(v)}" for k, v in row.items())


def _short(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)
