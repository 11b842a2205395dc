"""`tritonserver` flags that have nothing to act on here, accepted so a Triton launch line
starts ge-serve unchanged.

Each is accepted with any value and named in one warning at startup, with the reason it
does nothing. A flag whose value is `inert` (Triton's own default, where giving it changes
nothing) is accepted silently. The flags that do apply are settings (server/startup/settings.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_CUDA = "there is no CUDA device: NPUs and the host manage their own memory"
_ENDPOINT = "ge-serve serves KServe v2 over HTTP and gRPC only"


@dataclass(frozen=True, slots=True)
class Inapplicable:
    flag: str
    why: str
    # A value that changes nothing (compared without case), so it draws no warning.
    inert: str | None = None
    repeat: bool = False


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
    Inapplicable("--repoagent-directory", "repository agents are not supported"),
    Inapplicable("--cache-directory", "the response cache is built in ('local' only)"),
    Inapplicable(
        "--http-thread-count",
        "HTTP requests are served on the asyncio event loop, not by a thread pool",
    ),
    Inapplicable(
        "--grpc-infer-allocation-pool-size",
        "grpc.aio allocates its messages per call; there is no pool to size",
    ),
    Inapplicable("--allow-sagemaker", _ENDPOINT, inert="false"),
    Inapplicable("--sagemaker-port", _ENDPOINT),
    Inapplicable("--sagemaker-safe-port-range", _ENDPOINT),
    Inapplicable("--sagemaker-thread-count", _ENDPOINT),
    Inapplicable("--allow-vertex-ai", _ENDPOINT, inert="false"),
    Inapplicable("--vertex-ai-port", _ENDPOINT),
    Inapplicable("--vertex-ai-thread-count", _ENDPOINT),
    Inapplicable("--vertex-ai-default-model", _ENDPOINT),
    # Later releases' flags (r24.10, r25.x).
    Inapplicable("--enable-peer-access", _CUDA, inert="true"),
    Inapplicable(
        "--grpc-infer-thread-count", "grpc.aio serves every call on the event loop's thread"
    ),
    Inapplicable(
        "--grpc-max-response-pool-size",
        "grpc.aio allocates its messages per call; there is no pool to size",
    ),
)

_BY_FLAG = {entry.flag: entry for entry in INAPPLICABLE}


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
