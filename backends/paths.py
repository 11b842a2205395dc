"""Paths a model config names, resolved so that they can never leave the model's folder.

A config names files in many places: `default_model_filename`, `label_filename`,
`cc_model_filenames`, warmup `input_data_file`s, backend parameters such as GE's
`ge.fusionSwitchFile` or `EXECUTION_ENV_PATH`, and, for a Python backend, `model.py` in the
version folder (the backend's default model file name). The config may come from a
client (the load API), so each of these is resolved with `resolve_inside` and the reader
opens the path it returns, never the text it was given.

`resolve_inside` decides without touching anything outside the folder: absolute paths,
NUL bytes and `..` that climbs out are refused before any filesystem call; then the path
is walked one component at a time with `lstat` inside the folder, and each symbolic link
is followed by reading it (`readlink`), refusing as soon as its target leaves the folder.
So a file outside is never opened, read or stat'ed, and an error never depends on whether
one exists. The folder itself may be a symbolic link: where it points is the operator's
choice, so it is resolved first.

Resolution happens at load time; whoever can change the model folder between that check
and the read could swap a component for a link. Only the operator (repository folders)
or ge-serve itself (private `file:` override folders) writes those folders.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path

# Symbolic links followed while resolving one path, as Linux's own limit for a lookup.
MAX_LINKS = 40
# Triton's placeholder for the model folder in a Python model's EXECUTION_ENV_PATH.
MODEL_DIRECTORY_VAR = "$$TRITON_MODEL_DIRECTORY"


class OutsideFolder(ValueError):
    """A path named by a model config does not stay inside the model folder."""


class _Refused(Exception):
    """Why a path was refused; `resolve_inside` adds which field it was."""


def resolve_inside(
    root: Path, relative: str, what: str, under: str = "", kind: str = "file"
) -> Path:
    """The real path of `relative` (taken from the folder `under`, itself inside `root`),
    with every symbolic link followed, or OutsideFolder when it does not stay inside root.

    `what` names the field for the message, e.g. "label_filename 'x' of output 'y'". A
    path that stays inside but does not exist resolves too: the reader says it is missing.
    """
    try:
        return _resolve(root, relative, under)
    except _Refused as exc:
        raise OutsideFolder(f"{what} must name a {kind} inside the model folder ({exc})") from None


def execution_env_path(root: Path, value: str) -> Path:
    """A Python model's EXECUTION_ENV_PATH: `$$TRITON_MODEL_DIRECTORY/...` or a path
    relative to the model folder, which it must not leave."""
    what = f"parameter EXECUTION_ENV_PATH {value!r}"
    relative = value
    if value.startswith(MODEL_DIRECTORY_VAR):
        rest = value[len(MODEL_DIRECTORY_VAR) :]
        if rest and not rest.startswith("/"):
            # Triton substitutes text: "$$TRITON_MODEL_DIRECTORY_x" is a sibling folder.
            raise OutsideFolder(
                f"{what} must name a file inside the model folder ('/' must follow "
                f"{MODEL_DIRECTORY_VAR})"
            )
        relative = rest.lstrip("/") or "."
    return resolve_inside(root, relative, what)


def _parts(text: str) -> list[str]:
    return [part for part in text.split("/") if part not in ("", ".")]


def _climbs_out(parts: list[str]) -> bool:
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def _resolve(root: Path, relative: str, under: str) -> Path:
    if not relative:
        raise _Refused("it is empty")
    if "\x00" in relative:
        raise _Refused("it contains a NUL byte")
    if relative.startswith("/"):
        raise _Refused("absolute paths are not allowed")
    pending = deque(_parts(under) + _parts(relative))
    if _climbs_out(list(pending)):
        raise _Refused("'..' leads out of the folder")
    real_root = os.path.realpath(root)
    # A link may name the folder by its real path or by the path the repository gives.
    anchors = [_parts(real_root), _parts(os.path.abspath(root))]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.popleft()
        if part == "..":
            if not done:
                raise _Refused("a symbolic link in it leads out of the folder")
            done.pop()
            continue
        here = os.path.join(real_root, *done, part)
        try:
            info = os.lstat(here)
        except OSError:
            # Missing (or unreadable) inside the folder: the reader reports it.
            done.append(part)
            continue
        if not stat.S_ISLNK(info.st_mode):
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            raise _Refused("too many symbolic links")
        target = os.readlink(here)
        if target.startswith("/"):
            rest = _below(target, anchors)
            if rest is None:
                raise _Refused("a symbolic link in it leads out of the folder")
            done = []
            pending.extendleft(reversed(rest))
        else:
            pending.extendleft(reversed(_parts(target)))
    return Path(real_root, *done)


def _below(target: str, anchors: list[list[str]]) -> list[str] | None:
    """What follows the folder in an absolute link target, or None if it is elsewhere."""
    parts = _parts(target)
    for anchor in anchors:
        if parts[: len(anchor)] == anchor:
            return parts[len(anchor) :]
    return None
