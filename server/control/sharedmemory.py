"""Triton's system shared-memory extension: regions of POSIX shared-memory objects that a
client registers, so tensors move through memory instead of the socket.

Protocol-neutral: the front ends parse the wire (`parse_ref` lifts the per-tensor
parameters), the core resolves inputs to views and writes outputs, and both front ends
answer the register / status / unregister calls from one `SharedMemoryManager`, owned by
the server instance.

Lifetime. A region is mapped once, at registration (open + fstat + mmap, off the event
loop; the descriptor is closed at once, Python's mmap keeps its own duplicate). Requests
get zero-copy memoryviews of the mapping. Each mapping holds one descriptor (Python 3.11's
mmap cannot give it up), so the number of regions is capped at half the process's
open-file limit: past it a client's registrations would starve the server of descriptors
for connections. Triton's regions hold none, so Triton has no such cap.

Unregistering a region that requests are using (`users`, counted from `window(ref,
held)` to `release(held)`) only marks it, as Triton's UnregisterHelper does: it stays in
the table, in the status and usable by later requests, and goes when the last request
using it ends. Otherwise it goes at once; its mapping closes when no view of it is left
(`mmap.close()` would raise BufferError while one is; CPython frees it by reference count).

Off (`--allow-client-shm=false`, the default, as Triton's): register and unregister are
refused with Triton's words, status answers (empty).

Triton's facts (docs/protocol/extension_shared_memory.md, src/shared_memory_manager.cc,
src/http_server.cc, src/grpc/grpc_utils.h and infer_handler.cc):
- keys are shm_open names ("/name"), i.e. files under /dev/shm;
- `offset + byte_size` of a registration must fit the object ("failed to register shared
  memory region '<name>': invalid args"); a name is registered once ("shared memory region
  '<name>' already in manager", ALREADY_EXISTS);
- an unknown region in a request is NOT_FOUND "Unable to find shared memory region:
  '<name>'"; in a status call "Unable to find system shared memory region: '<name>'";
- unregistering an unknown name succeeds (nothing to do);
- an output region smaller than the output: "shared memory size specified with the
  request for output '<o>' (<n> bytes) should be at least <m> bytes to hold the results".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import resource
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import ErrorCode, ServerError, invalid_arg
from ..inference import error_texts
from ..inference.error_texts import InputRef
from ..inference.types import DataType, Parameters, RequestedOutput, SharedMemoryRef
from ..inference.wire import raw_to_array

log = logging.getLogger(__name__)

SHM_ROOT: Final = Path("/dev/shm")

SHARED_MEMORY_REGION: Final = "shared_memory_region"
SHARED_MEMORY_OFFSET: Final = "shared_memory_offset"
SHARED_MEMORY_BYTE_SIZE: Final = "shared_memory_byte_size"

# The data of a decoded input whose bytes are still in shared memory, until the core maps it.
IN_SHARED_MEMORY: Final[npt.NDArray[Any]] = np.empty(0, dtype=np.uint8)
IN_SHARED_MEMORY.flags.writeable = False

# Triton's kClientShmDisabledErrorStr (src/common.h).
DISABLED: Final = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
# size_t's largest value, which Triton's offset + byte_size must not pass.
SIZE_MAX: Final = (1 << 64) - 1


unknown_region = error_texts.shm_not_found


# --- per-tensor parameters ------------------------------------------------------------------


def parse_ref(params: Parameters, tensor: str) -> SharedMemoryRef | None:
    """Lift `shared_memory_region` / `_offset` / `_byte_size` out of a tensor's parameters.

    None when the tensor does not use shared memory. The region and its byte size go
    together; the offset is optional (0). Errors are INVALID_ARG, worded as Triton's.
    """
    region = params.pop(SHARED_MEMORY_REGION, None)
    offset = params.pop(SHARED_MEMORY_OFFSET, None)
    byte_size = params.pop(SHARED_MEMORY_BYTE_SIZE, None)
    if region is None:
        for key, value in ((SHARED_MEMORY_OFFSET, offset), (SHARED_MEMORY_BYTE_SIZE, byte_size)):
            if value is not None:
                raise invalid_arg(
                    f"'{key}' can not be specified without '{SHARED_MEMORY_REGION}' parameter "
                    f"for tensor '{tensor}'"
                )
        return None
    if not isinstance(region, str):
        raise invalid_arg(
            f"invalid value type for '{SHARED_MEMORY_REGION}' parameter for tensor '{tensor}', "
            "expected a string"
        )
    if byte_size is None:
        raise invalid_arg(
            f"'{SHARED_MEMORY_BYTE_SIZE}' must be specified along with "
            f"'{SHARED_MEMORY_REGION}' parameter for tensor '{tensor}'"
        )
    return SharedMemoryRef(
        region,
        _count(byte_size, SHARED_MEMORY_BYTE_SIZE, tensor),
        0 if offset is None else _count(offset, SHARED_MEMORY_OFFSET, tensor),
    )


def lift_output_ref(output: RequestedOutput) -> None:
    """Move an output's shared-memory parameters into `output.shm`. Classification results
    are computed from the output, so the two do not go together (Triton's rule)."""
    ref = parse_ref(output.parameters, output.name)
    if ref is None:
        return
    if output.classification:
        raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
    output.shm = ref


def _count(value: Any, key: str, tensor: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_arg(
            f"invalid value for '{key}' parameter for tensor '{tensor}': expected a "
            f"non-negative integer, got {value!r}"
        )
    return value


# --- regions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One registered region, as the status calls report it."""

    name: str
    key: str
    offset: int
    byte_size: int


class _Region:
    """One mapping. `start` is where the registered bytes begin inside it (the mapping
    starts at the page boundary at or below the registered offset)."""

    __slots__ = ("_mapping", "_start", "awaiting_unregister", "status", "users")

    def __init__(self, status: RegionStatus, mapping: mmap.mmap, start: int) -> None:
        self.status = status
        self._mapping: mmap.mmap | None = mapping
        self._start = start
        self.users = 0  # requests that use it now
        self.awaiting_unregister = False  # unregistered while in use: goes with the last

    def window(self, offset: int, byte_size: int) -> memoryview:
        """A writable view of `byte_size` bytes at `offset` into the region (checked)."""
        mapping = self._mapping
        if mapping is None:  # pragma: no cover - released regions are out of the table
            raise unknown_region(self.status.name)
        # The client owns the object and may shrink it; touching mapped pages past its end
        # raises SIGBUS, which would kill the server. The size is checked on every use (one
        # fstat); a shrink racing with a running request is not caught (nor by Triton).
        needed = self.status.offset + offset + byte_size
        size = mapping.size()
        if size < needed:
            raise invalid_arg(
                f"shared memory region '{self.status.name}' is no longer valid: its object "
                f"'{self.status.key}' shrank to {size} bytes (the region needs {needed})"
            )
        start = self._start + offset
        return memoryview(mapping)[start : start + byte_size]

    def release(self) -> None:
        """Unmap now if no view is left; otherwise the last view's release unmaps it."""
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            with contextlib.suppress(BufferError):
                mapping.close()


# The regions one request uses, one entry per use (see SharedMemoryManager.release).
Held = list[_Region]


def region_cap() -> int:
    """Half the soft open-file limit: each region holds a descriptor."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (1 << 20) if soft == resource.RLIM_INFINITY else max(soft // 2, 1)


def object_path(root: Path, key: str, region: str = "") -> Path:
    """The file of a POSIX shared-memory key: one name directly under `root`."""
    if key.lstrip("/").startswith(error_texts.RESERVED_SHM_PREFIX):
        raise error_texts.shm_reserved_key(region, key)
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        # A POSIX shared memory name is one path component under /dev/shm.
        raise error_texts.shm_invalid_key(region, key)
    return root / name


def _map(root: Path, name: str, key: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    """Open, check and map a region; blocking, so it runs on a worker thread."""
    path = object_path(root, key, name)
    failed = f"failed to register shared memory region '{name}'"
    try:
        # O_NOFOLLOW: a link in /dev/shm must not lead the server elsewhere; O_NONBLOCK: a
        # FIFO planted there must not hang the open.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        log.info("cannot open shared memory object '%s': %s", key, exc.strerror or exc)
        raise error_texts.shm_cannot_open(key) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise invalid_arg(f"{failed}: '{key}' is not a shared memory object")
        if offset + byte_size > info.st_size:
            raise error_texts.shm_invalid_args(name)
        if byte_size == 0:
            # Python maps the whole object for length 0; Triton's mmap(2) fails, EINVAL.
            raise invalid_arg(f"{failed}: unable to process address space{os.strerror(22)}")
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(
                fd,
                offset + byte_size - base,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=base,
            )
        except OSError as exc:  # Triton's words, run together as it runs them
            raise invalid_arg(f"{failed}: unable to process address space{exc.strerror}") from None
    finally:
        os.close(fd)
    return mapping, offset - base


class SharedMemoryManager:
    """The registered system shared-memory regions of one server.

    Every method runs on the event loop (the table needs no lock); only the blocking part
    of `register` goes to a worker thread.
    """

    def __init__(
        self, enabled: bool = True, root: Path = SHM_ROOT, max_regions: int | None = None
    ) -> None:
        self.enabled = enabled
        self.root = root
        self._regions: dict[str, _Region] = {}
        self.max_regions = region_cap() if max_regions is None else max_regions

    def check_enabled(self) -> None:
        """Register and unregister are refused when off; status answers (Triton's rule)."""
        if not self.enabled:
            raise ServerError(ErrorCode.UNSUPPORTED, DISABLED)

    # --- the extension's calls -------------------------------------------------------------

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_enabled()
        if not name:
            raise invalid_arg("'region name' is necessary to register system shared memory region")
        if offset < 0 or byte_size < 0:
            raise invalid_arg(
                f"failed to register shared memory region '{name}': offset and byte_size "
                "must be non-negative"
            )
        self._check_new(name)
        object_path(self.root, key, name)  # a bad key fails before the thread hop
        mapping, start = await asyncio.to_thread(_map, self.root, name, key, offset, byte_size)
        try:
            # Another register of the same name may have finished while we mapped.
            self._check_new(name)
        except ServerError:
            mapping.close()
            raise
        self._regions[name] = _Region(RegionStatus(name, key, offset, byte_size), mapping, start)
        log.debug(
            "registered system shared memory region '%s': key '%s', offset %d, %d bytes",
            name,
            key,
            offset,
            byte_size,
        )

    def _check_new(self, name: str) -> None:
        if name in self._regions:
            raise error_texts.shm_already_registered(name)
        if len(self._regions) >= self.max_regions:
            raise invalid_arg(
                f"failed to register shared memory region '{name}': {len(self._regions)} "
                "regions are registered, the most this server's open-file limit allows; "
                "unregister regions no longer in use, or raise the limit (ulimit -n)"
            )

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region, or the named one (NOT_FOUND when it is not registered)."""
        if not name:
            return [region.status for region in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise ServerError(
                ErrorCode.NOT_FOUND, f"Unable to find system shared memory region: '{name}'"
            )
        return [region.status]

    def unregister(self, name: str = "") -> None:
        """Unregister one region, or every region when `name` is empty. Unknown names are
        not an error (Triton's behaviour: the end state is what was asked for). A region
        that requests are using is only marked; the last of them to end removes it."""
        self.check_enabled()
        if name:
            region = self._regions.get(name)
            regions = [] if region is None else [region]
        else:
            regions = list(self._regions.values())
        for region in regions:
            if region.users:
                region.awaiting_unregister = True
                log.debug(
                    "Shared memory region '%s' will be unregistered after in-flight requests "
                    "complete.",
                    region.status.name,
                )
            else:
                self._remove(region)

    def _remove(self, region: _Region) -> None:
        if self._regions.get(region.status.name) is region:
            del self._regions[region.status.name]
        region.release()
        log.debug("unregistered system shared memory region '%s'", region.status.name)

    def release(self, held: Held) -> None:
        """A request that used the regions `window` put in `held` has ended."""
        for region in held:
            region.users -= 1
            if region.awaiting_unregister and not region.users:
                self._remove(region)
        held.clear()

    def close(self) -> None:
        """Server shutdown: release every region, used or not."""
        regions, self._regions = self._regions, {}
        for region in regions.values():
            region.release()

    # --- CUDA shared memory (this server has no CUDA devices) ------------------------------

    def cuda_status(self, name: str = "") -> list[RegionStatus]:
        """No CUDA region can exist: all of them is an empty list, a name is NOT_FOUND."""
        if not name:
            return []
        if name in self._regions:
            message = (
                f"The region named '{name}' is registered as system shared memory, not CUDA "
                "shared memory"
            )
        else:
            message = f"Unable to find cuda shared memory region: '{name}'"
        raise ServerError(ErrorCode.NOT_FOUND, message)

    def cuda_register(self, name: str) -> None:
        """Refuse, as Triton refuses a CUDA handle it cannot open (no CUDA device here)."""
        self.check_enabled()
        raise error_texts.cuda_register_refused()

    def cuda_unregister(self, name: str = "") -> None:
        """Nothing to do: no CUDA region is ever registered (clients such as perf_analyzer
        unregister all of them at start-up). Refused when off, as Triton refuses it."""
        self.check_enabled()

    # --- tensors -------------------------------------------------------------------------

    def window(self, ref: SharedMemoryRef, held: Held | None = None) -> memoryview:
        """The writable bytes `ref` names, checked against its region in Triton's order.
        With `held`, the region counts the caller as a user until `release(held)`."""
        region = self._regions.get(ref.region)
        if region is None:
            raise unknown_region(ref.region)
        size = region.status.byte_size
        if ref.offset >= size:
            raise error_texts.shm_invalid_offset(ref.region)
        if ref.byte_size > SIZE_MAX - ref.offset:
            raise error_texts.shm_integer_overflow(ref.region, ref.byte_size, ref.offset, SIZE_MAX)
        if ref.offset + ref.byte_size > size:
            raise error_texts.shm_invalid_range(ref.region)
        view = region.window(ref.offset, ref.byte_size)
        if held is not None:
            region.users += 1
            held.append(region)
        return view

    def input_array(
        self,
        ref: SharedMemoryRef,
        datatype: DataType,
        shape: tuple[int, ...],
        tensor: str,
        model: str,
        request_id: str = "",
        held: Held | None = None,
    ) -> npt.NDArray[Any]:
        """A read-only, zero-copy view of an input tensor (BYTES are parsed into objects).

        The region is checked first, then the size against the shape, in Triton's order.
        """
        view = self.window(ref, held).toreadonly()
        return raw_to_array(datatype, shape, view, InputRef(tensor, model, request_id))

    @staticmethod
    def write_output(target: memoryview, raw: bytes | memoryview, tensor: str) -> None:
        """Copy an output's wire bytes into its region; a region too small is INVALID_ARG."""
        size = memoryview(raw).nbytes
        if size > target.nbytes:
            raise invalid_arg(
                f"shared memory size specified with the request for output '{tensor}' "
                f"({target.nbytes} bytes) should be at least {size} bytes to hold the results"
            )
        target[:size] = raw
