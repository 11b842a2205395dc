"""`tritonserver` flags that have nothing to act on here, accepted so a Triton launch line
starts ge-serve unchanged.

Each is named in one warning at startup, with the reason it does nothing. A flag whose
value is `inert` (Triton's own default, where giving it changes nothing) is accepted
silently. A flag with a `check` is refused for the values Triton refuses, with Triton's
words, so that a launch line that fails on Triton fails here too (its qa expects it);
the others take any value. The flags that do apply are settings
(server/startup/settings.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from . import flags

_CUDA = "there is no CUDA device: NPUs and the host manage their own memory"
_LOOP = "HTTP requests are served on the asyncio event loop, not by a thread pool"


@dataclass(frozen=True, slots=True)
class Inapplicable:
    flag: str
    why: str
    # A value that changes nothing (compared without case), so it draws no warning.
    inert: str | None = None
    repeat: bool = False
    # Raises ValueError, with Triton's words, for a value Triton refuses at startup.
    check: Callable[[str], None] | None = None


# What C's std::stoi reads (Triton's ParseOption<int>): leading white space, a sign and
# decimal digits; anything after them is ignored, so "4x" and "2.5" read as 4 and 2.
_STOI: Final = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def stoi(text: str) -> int:
    """Triton's ParseOption<int>, with its words for a value it cannot read."""
    match = _STOI.match(text)
    if match is None:
        raise ValueError(f"Invalid option value. Got {text}")
    value = int(match.group(1))
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"Provided option value is out of bound. Got {text}")
    return value


def _integer(text: str) -> None:
    stoi(text)


def _infer_thread_count(text: str) -> None:
    # Triton's text names the flag with underscores.
    if not 2 <= stoi(text) <= 128:
        raise ValueError(
            "invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128."
        )


def _response_pool_size(text: str) -> None:
    if stoi(text) <= 0:
        raise ValueError("Error: --grpc-max-response-pool-size must be greater than 0.")


INAPPLICABLE: tuple[Inapplicable, ...] = (
    Inapplicable("--pinned-memory-pool-byte-size", _CUDA),
    Inapplicable("--cuda-memory-pool-byte-size", _CUDA, repeat=True),
    Inapplicable("--cuda-virtual-address-size", _CUDA, repeat=True),
    Inapplicable("--min-supported-compute-capability", _CUDA),
    Inapplicable("--model-load-gpu-limit", _CUDA, repeat=True),
    Inapplicable(
        "--buffer-manager-thread-count",
        "tensors are numpy views copied by the executor's own thread",
        inert="0",
    ),
    Inapplicable(
        "--host-policy", "executors run on their slot threads; no NUMA policy", repeat=True
    ),
    Inapplicable(
        "--repoagent-directory",
        "repository agents are built in (checksum); agent libraries are not loaded",
    ),
    Inapplicable("--cache-directory", "the response cache is built in ('local' only)"),
    Inapplicable("--http-thread-count", _LOOP),
    Inapplicable(
        "--grpc-infer-allocation-pool-size",
        "grpc.aio allocates its messages per call; there is no pool to size",
        check=_integer,
    ),
    # The endpoints themselves are served (cloudflags.py); their requests too are served on
    # the event loop.
    *(
        Inapplicable(f"--{endpoint}-thread-count", _LOOP, check=_integer)
        for endpoint in ("sagemaker", "vertex-ai")
    ),
    # Later releases' flags (r24.10, r25.x).
    Inapplicable("--enable-peer-access", _CUDA, inert="true"),
    Inapplicable(
        "--grpc-infer-thread-count",
        "grpc.aio serves every call on the event loop's thread",
        check=_infer_thread_count,
    ),
    Inapplicable(
        "--grpc-max-response-pool-size",
        "grpc.aio allocates its messages per call; there is no pool to size",
        check=_response_pool_size,
    ),
)

_BY_FLAG = {entry.flag: entry for entry in INAPPLICABLE}


def inapplicable_flag() -> Mapping[str, flags.Flag]:
    """The flags of `Settings.inapplicable`, each recorded as (flag, value)."""
    return flags.flag(
        *_BY_FLAG,
        repeat=True,
        record_flag=True,
        metavar="VALUE",
        help="tritonserver flags accepted with a warning; they do nothing here",
        group="accepted for Triton compatibility, with no effect",
    )


def check_values(given: Iterable[tuple[str, str]]) -> None:
    """Check each (flag, value) given as Triton does: ValueError, with Triton's words, for
    the first value it refuses."""
    for flag, value in given:
        check = _BY_FLAG[flag].check
        if check is not None:
            check(value)


def warning(given: Iterable[tuple[str, str]]) -> str | None:
    """The one warning for the inapplicable flags given as (flag, value), None if none
    needs one. Each flag is named once, with why it does nothing."""
    named: dict[str, str] = {}
    for flag, value in given:
        entry = _BY_FLAG[flag]
        if entry.inert is not None and value.strip().lower() == entry.inert:
            continue
        named.setdefault(flag, entry.why)
    if not named:
        return None
    parts = [f"{flag} ({why})" for flag, why in named.items()]
    return "accepted for Triton compatibility, but they have no effect here: " + "; ".join(parts)
