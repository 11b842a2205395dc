"""SharedMemoryManager on its own: registration checks, views, and the lifetime rules
(unregister while a view is held, no descriptor left behind). Regions are plain files in a
temporary folder standing in for /dev/shm, which is what /dev/shm is (tmpfs)."""

from __future__ import annotations

import asyncio
import gc
import mmap
import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ge_serve.server.control.sharedmemory import RegionStatus, SharedMemoryManager, object_path
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.types import DataType, SharedMemoryRef

PAGE = mmap.ALLOCATIONGRANULARITY


def open_fds(root: Path) -> int:
    """Descriptors of this process open on files under `root` (other tests' descriptors,
    which a garbage collection may close at any time, do not count)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, already closed
            continue
        if target.startswith(f"{root}/"):
            count += 1
    return count


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def make_object(root: Path, name: str, data: bytes) -> str:
    (root / name).write_bytes(data)
    return "/" + name


def register(manager: SharedMemoryManager, name: str, key: str, offset: int, size: int) -> None:
    asyncio.run(manager.register(name, key, offset, size))


def error(call: object) -> ServerError:
    assert callable(call)
    with pytest.raises(ServerError) as info:
        call()
    return info.value


def test_register_status_unregister(root: Path) -> None:
    manager = SharedMemoryManager(root=root)
    key = make_object(root, "obj", bytes(256))
    register(manager, "a", key, 0, 128)
    register(manager, "b", key, 128, 128)
    assert manager.status() == [RegionStatus("a", key, 0, 128), RegionStatus("b", key, 128, 128)]
    assert manager.status("b") == [RegionStatus("b", key, 128, 128)]
    manager.unregister("a")
    assert [r.name for r in manager.status()] == ["b"]
    manager.unregister("never-registered")  # not an error, as in Triton
    manager.unregister()
    assert manager.status() == []
    missing = error(lambda: manager.status("a"))
    assert missing.code is ErrorCode.NOT_FOUND
    assert missing.message == "Unable to find system shared memory region: 'a'"


def test_views_read_inputs_and_write_outputs_at_unaligned_offsets(root: Path) -> None:
    values = np.arange(16, dtype=np.float32)
    offset = PAGE + 12  # not page-aligned: the mapping starts at the page below
    blob = bytearray(PAGE * 3)
    blob[offset + 8 : offset + 8 + 64] = values.tobytes()
    key = make_object(root, "obj", bytes(blob))
    manager = SharedMemoryManager(root=root)
    register(manager, "r", key, offset, 128)

    array = manager.input_array(SharedMemoryRef("r", 64, 8), DataType.FP32, (4, 4), "x", "m")
    np.testing.assert_array_equal(array, values.reshape(4, 4))
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1

    window = manager.window(SharedMemoryRef("r", 32, 96))
    SharedMemoryManager.write_output(window, np.full(8, 7, dtype=np.int32).tobytes(), "y")
    del array, window
    manager.close()
    written = (root / "obj").read_bytes()[offset + 96 : offset + 128]
    assert np.frombuffer(written, dtype=np.int32).tolist() == [7] * 8


def test_bytes_inputs_parse_from_the_region(root: Path) -> None:
    wire = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"", b"xyz"))
    key = make_object(root, "obj", wire + bytes(10))
    manager = SharedMemoryManager(root=root)
    register(manager, "r", key, 0, len(wire) + 10)
    array = manager.input_array(SharedMemoryRef("r", len(wire)), DataType.BYTES, (3,), "s", "m")
    assert array.tolist() == [b"ab", b"", b"xyz"]
    bad = error(
        lambda: manager.input_array(SharedMemoryRef("r", len(wire)), DataType.BYTES, (2,), "s", "m")
    )
    assert bad.message == (
        "[request id: <id_unknown>] unexpected number of string elements 3 for inference "
        "input 's' for model 'm', expecting 2"
    )
    manager.close()


def test_request_errors_use_tritons_words(root: Path) -> None:
    key = make_object(root, "obj", bytes(64))
    manager = SharedMemoryManager(root=root)
    register(manager, "r", key, 0, 64)
    unknown = error(lambda: manager.window(SharedMemoryRef("nope", 4)))
    assert unknown.code is ErrorCode.NOT_FOUND
    assert unknown.message == "Unable to find shared memory region: 'nope'"
    past = error(lambda: manager.window(SharedMemoryRef("r", 4, 64)))
    assert past.message == "Invalid offset for shared memory region: 'r'"
    over = error(lambda: manager.window(SharedMemoryRef("r", 8, 60)))
    assert over.message == "Invalid offset + byte size for shared memory region: 'r'"
    # Triton checks offset + byte_size against size_t's largest value before the region.
    wraps = error(lambda: manager.window(SharedMemoryRef("r", 2**64 - 32, 32)))
    assert wraps.code is ErrorCode.INVALID_ARG
    assert wraps.message == (
        "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds "
        "maximum value (18446744073709551615) for region 'r'"
    )
    mismatch = error(
        lambda: manager.input_array(SharedMemoryRef("r", 32), DataType.INT32, (1, 16), "IN", "m")
    )
    assert mismatch.code is ErrorCode.INVALID_ARG
    assert mismatch.message == (
        "[request id: <id_unknown>] input byte size mismatch for input 'IN' for model 'm'. "
        "Expected 64, got 32"
    )
    window = manager.window(SharedMemoryRef("r", 8))
    small = error(lambda: SharedMemoryManager.write_output(window, b"1" * 9, "o"))
    assert small.message == (
        "shared memory size specified with the request for output 'o' (8 bytes) should be at "
        "least 9 bytes to hold the results"
    )
    manager.close()  # with a view still held: released when the view goes


def test_registration_errors(root: Path) -> None:
    manager = SharedMemoryManager(root=root)
    key = make_object(root, "obj", bytes(64))
    register(manager, "r", key, 0, 64)
    cases = {
        "duplicate": (lambda: register(manager, "r", key, 0, 8), ErrorCode.ALREADY_EXISTS,
                      "shared memory region 'r' already in manager"),
        "past the end": (lambda: register(manager, "s", key, 32, 64), ErrorCode.INVALID_ARG,
                         "failed to register shared memory region 's': invalid args"),
        # Triton's code: INTERNAL (a missing key is named before any size check).
        "missing key": (lambda: register(manager, "s", "/no-such-object", 0, 0),
                        ErrorCode.INTERNAL, "Unable to open shared memory region: "
                        "'/no-such-object'"),
        # Triton checks the bounds first, then its mmap(2) of 0 bytes fails (EINVAL).
        "empty size past the end": (lambda: register(manager, "s", key, 65, 0),
                                    ErrorCode.INVALID_ARG,
                                    "failed to register shared memory region 's': invalid args"),
        "empty size": (lambda: register(manager, "s", key, 0, 0), ErrorCode.INVALID_ARG,
                       "failed to register shared memory region 's': unable to process "
                       "address spaceInvalid argument"),
        "no name": (lambda: register(manager, "", key, 0, 8), ErrorCode.INVALID_ARG,
                    "'region name' is necessary"),
    }  # fmt: skip
    for what, (call, code, text) in cases.items():
        got = error(call)
        assert got.code is code, what
        assert text in got.message, (what, got.message)
    assert [r.name for r in manager.status()] == ["r"]
    manager.close()


@pytest.mark.parametrize("key", ["/../etc/passwd", "a/b", "/", "", "..", "/x\0y"])
def test_keys_cannot_leave_the_shared_memory_folder(root: Path, key: str) -> None:
    with pytest.raises(ServerError) as info:
        object_path(root, key, "r")
    assert (
        info.value.message == f"cannot register shared memory region 'r' - invalid shm key '{key}'"
    )


def test_links_and_folders_are_refused(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret"
    outside.write_bytes(bytes(64))
    (root / "link").symlink_to(outside)
    (root / "folder").mkdir()
    manager = SharedMemoryManager(root=root)
    assert "Unable to open" in error(lambda: register(manager, "l", "/link", 0, 8)).message
    assert "Unable to open" in error(lambda: register(manager, "f", "/folder", 0, 8)).message
    assert manager.status() == []


def test_unregister_while_a_view_is_held_keeps_the_view_valid(root: Path) -> None:
    values = np.arange(8, dtype=np.int64)
    key = make_object(root, "obj", values.tobytes())
    manager = SharedMemoryManager(root=root)
    baseline = open_fds(root)
    assert baseline == 0
    register(manager, "r", key, 0, 64)
    assert open_fds(root) == baseline + 1  # the mapping's own descriptor, nothing more
    held = manager.input_array(SharedMemoryRef("r", 64), DataType.INT64, (8,), "x", "m")
    manager.unregister("r")  # must not raise although a view exists
    assert manager.status() == []
    assert error(lambda: manager.window(SharedMemoryRef("r", 8))).code is ErrorCode.NOT_FOUND
    np.testing.assert_array_equal(held, values)  # still mapped, still right
    assert open_fds(root) == baseline + 1
    del held
    gc.collect()
    assert open_fds(root) == baseline  # the last view let the mapping and its descriptor go


def test_close_releases_every_descriptor(root: Path) -> None:
    manager = SharedMemoryManager(root=root)
    baseline = open_fds(root)
    assert baseline == 0
    for i in range(5):
        register(manager, f"r{i}", make_object(root, f"o{i}", bytes(PAGE)), 0, PAGE)
    assert open_fds(root) == baseline + 5
    manager.close()
    assert open_fds(root) == baseline


def test_regions_are_capped_by_the_open_file_limit(root: Path) -> None:
    # Each region holds a descriptor: unbounded registrations would leave the server none
    # for connections. Past the cap a registration is refused, and nothing is opened.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert SharedMemoryManager(root=root).max_regions == max(soft // 2, 1)
    manager = SharedMemoryManager(root=root, max_regions=2)
    key = make_object(root, "obj", bytes(64))
    register(manager, "a", key, 0, 32)
    register(manager, "b", key, 32, 32)
    refused = error(lambda: register(manager, "c", key, 0, 32))
    assert refused.code is ErrorCode.INVALID_ARG
    assert refused.message.startswith(
        "failed to register shared memory region 'c': 2 regions are registered, the most "
        "this server's open-file limit allows"
    )
    assert open_fds(root) == 2
    manager.unregister("a")
    register(manager, "c", key, 0, 32)
    manager.close()


def test_a_disabled_manager_refuses_registration_and_unregistration(root: Path) -> None:
    manager = SharedMemoryManager(enabled=False, root=root)
    key = make_object(root, "obj", bytes(64))
    disabled = (
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
        "to enable."
    )
    for call in (
        lambda: register(manager, "r", key, 0, 8),
        lambda: manager.unregister("r"),
        manager.unregister,
        lambda: manager.cuda_unregister("r"),
        lambda: manager.cuda_register("r"),
    ):
        refused = error(call)
        assert (refused.code, refused.message) == (ErrorCode.UNSUPPORTED, disabled)
    assert manager.status() == []  # status answers, as Triton's does
    assert error(lambda: manager.window(SharedMemoryRef("r", 8))).code is ErrorCode.NOT_FOUND


def test_a_region_unregistered_while_in_use_stays_until_its_requests_end(root: Path) -> None:
    """Triton's UnregisterHelper: a region in use is only marked; it stays in the status
    and usable by later requests, and goes when the last request using it ends."""
    manager = SharedMemoryManager(root=root)
    key = make_object(root, "obj", bytes(64))
    register(manager, "r", key, 0, 64)
    register(manager, "idle", key, 0, 64)
    first: list[Any] = []
    manager.window(SharedMemoryRef("r", 8), first)
    manager.unregister()  # every region: the idle one goes, the used one is marked
    assert [r.name for r in manager.status()] == ["r"]
    assert [r.name for r in manager.status("r")] == ["r"]
    assert error(lambda: register(manager, "r", key, 0, 8)).code is ErrorCode.ALREADY_EXISTS
    later: list[Any] = []
    manager.window(SharedMemoryRef("r", 8, 8), later)  # a request sent after still uses it
    manager.release(first)
    assert [r.name for r in manager.status()] == ["r"]
    manager.release(later)
    assert manager.status() == []
    assert error(lambda: manager.window(SharedMemoryRef("r", 8))).code is ErrorCode.NOT_FOUND
    register(manager, "r", key, 0, 64)  # the name is free again
    manager.close()


def test_a_refused_request_holds_no_region(root: Path) -> None:
    manager = SharedMemoryManager(root=root)
    register(manager, "r", make_object(root, "obj", bytes(64)), 0, 64)
    held: list[Any] = []
    manager.input_array(SharedMemoryRef("r", 64), DataType.INT32, (1, 16), "IN", "m", held=held)
    assert len(held) == 1
    manager.release(held)
    assert held == []
    manager.unregister("r")
    assert manager.status() == []
    manager.close()


def test_cuda_shared_memory_is_empty(root: Path) -> None:
    manager = SharedMemoryManager(root=root)
    register(manager, "sys", make_object(root, "obj", bytes(8)), 0, 8)
    assert manager.cuda_status() == []
    manager.cuda_unregister()
    manager.cuda_unregister("sys")  # another kind's region: nothing to do, as in Triton
    assert [r.name for r in manager.status()] == ["sys"]
    assert "registered as system shared memory" in error(lambda: manager.cuda_status("sys")).message
    assert error(lambda: manager.cuda_status("x")).code is ErrorCode.NOT_FOUND
    gpu = error(lambda: manager.cuda_register("c"))
    assert gpu.code is ErrorCode.INVALID_ARG
    assert gpu.message == "failed to register shared memory region: invalid args"
    manager.close()


def test_an_object_shrunk_after_registration_is_refused_not_a_crash(root: Path) -> None:
    """Reading mapped pages past a truncated object's end is SIGBUS; check the size first."""
    key = make_object(root, "obj", bytes(3 * PAGE))
    manager = SharedMemoryManager(root=root)
    register(manager, "r", key, PAGE, 2 * PAGE)
    assert manager.window(SharedMemoryRef("r", 16, PAGE)).nbytes == 16
    os.truncate(root / "obj", PAGE + 8)
    refused = error(lambda: manager.window(SharedMemoryRef("r", 16, PAGE)))
    assert refused.code is ErrorCode.INVALID_ARG
    assert "shrank to" in refused.message
    # What is still inside the object can still be used.
    assert bytes(manager.window(SharedMemoryRef("r", 8))) == bytes(8)
    manager.close()
