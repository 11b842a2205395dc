"""The metric names the documents' tables list, so that tests can hold every family a live
server exports to them (the README sends users to deploy/README.md for every name)."""

from __future__ import annotations

import re
from pathlib import Path

from promtext import Exposition

# `a_{b,c}_d`: a choice of name parts; `name{device="npu0"}` or `name{reason}`: labels.
_BRACES = re.compile(r"\{([^}]*)\}")
_PARTS = re.compile(r"[a-z0-9_]+(,[a-z0-9_]+)+")


def documented(*documents: Path) -> set[str]:
    """The names in the code spans of the first cell of every table row in `documents`."""
    names: set[str] = set()
    for document in documents:
        for line in document.read_text(encoding="utf-8").splitlines():
            if line.startswith("| `"):
                for span in re.findall(r"`([^`]+)`", line.split(" | ", 1)[0]):
                    names |= expand(span)
    return names


def expand(span: str) -> set[str]:
    """a_{b,c}_d -> {a_b_d, a_c_d}; a label selector is dropped: name{device="x"} -> name."""
    match = _BRACES.search(span)
    if match is None:
        return {span}
    if not _PARTS.fullmatch(match.group(1)):
        return {span[: match.start()]}
    head, tail = span[: match.start()], span[match.end() :]
    return {name for part in match.group(1).split(",") for name in expand(head + part + tail)}


def undocumented(exposition: Exposition, names: set[str]) -> list[str]:
    """The exported families that `names` does not list."""
    return sorted(family for family in exposition.types if family not in names)
