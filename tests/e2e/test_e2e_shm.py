"""The system shared-memory extension end to end: the real server, tritonclient's
shared-memory utilities (tritonclient.utils.shared_memory) and both protocols, and
perf_analyzer --shared-memory system.

Every region a test creates is destroyed (and unregistered) when the test ends, pass or fail.
"""

from __future__ import annotations

import base64
import concurrent.futures
import queue
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from polling import poll
from promtext import scrape
from protocols import PROTOCOLS, Triton, as_ints, decimal_strings
from serverproc import EXAMPLE_MODELS, ServerProcess, running_server
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from bench.lib import perfa

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

VECTOR = 16 * 4  # one [1, 16] INT32 tensor of `simple`
ALLOW = "--allow-client-shm=true"


class Regions:
    """Shared-memory objects made with tritonclient's utilities, registered on one server;
    `close()` unregisters and destroys every one of them."""

    def __init__(self, triton: Triton) -> None:
        self.triton = triton
        self.tag = uuid.uuid4().hex[:8]
        self.handles: dict[str, Any] = {}

    def name(self, base: str) -> str:
        return f"{base}_{self.tag}"

    def create(self, base: str, byte_size: int, register: bool = True) -> tuple[str, Any]:
        """A new object of `byte_size` bytes; returns (region name, handle)."""
        name = self.name(base)
        handle = shm.create_shared_memory_region(name, f"/ge_test_{name}", byte_size)
        self.handles[name] = handle
        if register:
            self.triton.client.register_system_shared_memory(name, f"/ge_test_{name}", byte_size)
        return name, handle

    def close(self) -> None:
        for name, handle in self.handles.items():
            try:
                self.triton.client.unregister_system_shared_memory(name)
            finally:
                shm.destroy_shared_memory_region(handle)
        self.handles.clear()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """This module's server (the `client` fixture's): client shared memory is off unless
    asked for, as in Triton."""
    with running_server(extra=[ALLOW]) as proc:
        yield proc


@pytest.fixture
def regions(client: Triton) -> Iterator[Regions]:
    made = Regions(client)
    try:
        yield made
    finally:
        made.close()


def status_names(triton: Triton, name: str = "") -> set[str]:
    status = triton.client.get_system_shared_memory_status(name)
    if triton.protocol == "http":
        return {region["name"] for region in status}
    return set(status.regions)


def shm_input(triton: Triton, name: str, region: str, size: int, offset: int = 0) -> Any:
    tensor = triton.module.InferInput(name, [1, 16], "INT32")
    tensor.set_shared_memory(region, size, offset=offset)
    return tensor


def shm_output(triton: Triton, name: str, region: str, size: int, offset: int = 0) -> Any:
    output = triton.module.InferRequestedOutput(name)
    output.set_shared_memory(region, size, offset=offset)
    return output


def body_input(triton: Triton, name: str, array: npt.NDArray[Any]) -> Any:
    tensor = triton.module.InferInput(name, list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return tensor


A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def expect(triton: Triton, kind: str, text: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    triton.expect_error(info.value, kind, text)


# --- the data path ---------------------------------------------------------------------------


def test_inputs_and_outputs_in_shared_memory(client: Triton, regions: Regions) -> None:
    region_in, handle_in = regions.create("in", 2 * VECTOR)
    region_out, handle_out = regions.create("out", 2 * VECTOR)
    shm.set_shared_memory_region(handle_in, [A, B])
    result = client.client.infer(
        "simple",
        [shm_input(client, "INPUT0", region_in, VECTOR),
         shm_input(client, "INPUT1", region_in, VECTOR, offset=VECTOR)],
        outputs=[shm_output(client, "OUTPUT0", region_out, VECTOR),
                 shm_output(client, "OUTPUT1", region_out, VECTOR, offset=VECTOR)],
    )  # fmt: skip
    sum_ = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16])
    diff = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=VECTOR)
    np.testing.assert_array_equal(sum_, A + B)
    np.testing.assert_array_equal(diff, A - B)
    # The response describes the outputs and carries none of their data.
    response = result.get_response()
    if client.protocol == "http":
        outputs = response["outputs"]
        assert outputs[0] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        assert all("data" not in o and "parameters" not in o for o in outputs)
    else:
        assert list(response.raw_output_contents) == [b"", b""]
        assert [list(o.shape) for o in response.outputs] == [[1, 16], [1, 16]]


def test_mixed_request_keeps_body_tensors_in_place(client: Triton, regions: Regions) -> None:
    """One input and one output in shared memory, the others on the wire: the wire ones
    must still line up (gRPC counts raw contents only for tensors not in shared memory)."""
    region_in, handle_in = regions.create("in", VECTOR)
    region_out, handle_out = regions.create("out", VECTOR)
    shm.set_shared_memory_region(handle_in, [B])
    result = client.client.infer(
        "simple",
        [body_input(client, "INPUT0", A), shm_input(client, "INPUT1", region_in, VECTOR)],
        outputs=[shm_output(client, "OUTPUT0", region_out, VECTOR),
                 client.module.InferRequestedOutput("OUTPUT1")],
    )  # fmt: skip
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [1, 16]), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_grpc_stream_with_shared_memory(server: ServerProcess) -> None:
    triton = Triton.connect("grpc", server)
    made = Regions(triton)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        region_in, handle_in = made.create("in", 2 * VECTOR)
        region_out, handle_out = made.create("out", VECTOR)
        shm.set_shared_memory_region(handle_in, [A, B])
        triton.client.start_stream(callback=lambda result, error: results.put((result, error)))
        triton.client.async_stream_infer(
            "simple",
            [shm_input(triton, "INPUT0", region_in, VECTOR),
             shm_input(triton, "INPUT1", region_in, VECTOR, offset=VECTOR)],
            outputs=[shm_output(triton, "OUTPUT0", region_out, VECTOR),
                     triton.module.InferRequestedOutput("OUTPUT1")],
        )  # fmt: skip
        result, error = results.get(timeout=60)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        out = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16])
        np.testing.assert_array_equal(out, A + B)
    finally:
        triton.client.stop_stream()
        made.close()
        triton.close()


def test_bytes_tensors_in_shared_memory(client: Triton, regions: Regions) -> None:
    numbers0, numbers1 = list(range(16)), [3] * 16
    tensors = [decimal_strings(numbers0, (1, 16)), decimal_strings(numbers1, (1, 16))]
    serialized = [serialize_byte_tensor(t) for t in tensors]
    sizes = [len(t.item()) for t in serialized]
    region_in, handle_in = regions.create("in", sum(sizes))
    region_out, handle_out = regions.create("out", 1024)
    shm.set_shared_memory_region(handle_in, serialized)
    inputs = []
    offset = 0
    for name, size in zip(("INPUT0", "INPUT1"), sizes, strict=True):
        tensor = client.module.InferInput(name, [1, 16], "BYTES")
        tensor.set_shared_memory(region_in, size, offset=offset)
        inputs.append(tensor)
        offset += size
    result = client.client.infer(
        "simple_string",
        inputs,
        outputs=[shm_output(client, "OUTPUT0", region_out, 1024),
                 client.module.InferRequestedOutput("OUTPUT1")],
    )  # fmt: skip
    written = shm.get_contents_as_numpy(handle_out, np.object_, [1, 16])
    assert as_ints(written) == [a + b for a, b in zip(numbers0, numbers1, strict=True)]
    assert as_ints(result.as_numpy("OUTPUT1")) == [
        a - b for a, b in zip(numbers0, numbers1, strict=True)
    ]


def test_status_and_unregister(client: Triton, regions: Regions) -> None:
    first, _ = regions.create("first", 64)
    second, _ = regions.create("second", 128)
    assert {first, second} <= status_names(client)
    assert status_names(client, second) == {second}
    if client.protocol == "http":
        (row,) = client.client.get_system_shared_memory_status(first)
        assert row == {"name": first, "key": f"/ge_test_{first}", "offset": 0, "byte_size": 64}
    else:
        region = client.client.get_system_shared_memory_status(first).regions[first]
        assert (region.key, region.offset, region.byte_size) == (f"/ge_test_{first}", 0, 64)
    client.client.unregister_system_shared_memory(first)
    names = status_names(client)
    assert first not in names and second in names
    expect(client, "NOT_FOUND", f"Unable to find system shared memory region: '{first}'",
           client.client.get_system_shared_memory_status, first)  # fmt: skip
    client.client.unregister_system_shared_memory()
    assert status_names(client) == set()


def test_cuda_shared_memory_is_empty_and_refuses_registration(client: Triton) -> None:
    """perf_analyzer unregisters every system and CUDA region at start-up."""
    client.client.unregister_cuda_shared_memory()
    client.client.unregister_cuda_shared_memory("anything")
    status = client.client.get_cuda_shared_memory_status()
    assert (status == []) if client.protocol == "http" else (len(status.regions) == 0)
    # A handle of the right size, which cannot be opened (no CUDA device): Triton's words.
    handle = base64.b64encode(bytes(64)).decode() if client.protocol == "http" else bytes(64)
    expect(client, "INVALID_ARGUMENT", "failed to register shared memory region: invalid args",
           client.client.register_cuda_shared_memory, "c", handle, 0, 64)  # fmt: skip
    if client.protocol == "http":  # only HTTP carries the handle as base64 text
        expect(client, "INVALID_ARGUMENT",
               "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
               client.client.register_cuda_shared_memory, "c", "AAAA", 0, 64)  # fmt: skip


def test_server_metadata_lists_the_extension(client: Triton) -> None:
    metadata = client.client.get_server_metadata()
    extensions = metadata["extensions"] if client.protocol == "http" else metadata.extensions
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" not in extensions


# --- bad input ------------------------------------------------------------------------------


def test_bad_shared_memory_requests_get_clear_errors(client: Triton, regions: Regions) -> None:
    region_in, handle_in = regions.create("in", 2 * VECTOR)
    region_small, _ = regions.create("small", VECTOR // 2)
    shm.set_shared_memory_region(handle_in, [A, B])
    good_in = shm_input(client, "INPUT1", region_in, VECTOR, offset=VECTOR)

    def infer(first: Any, outputs: Any = None) -> Any:
        return client.client.infer("simple", [first, good_in], outputs=outputs)

    expect(
        client,
        "NOT_FOUND",
        "Unable to find shared memory region: 'no_such_region'",
        infer,
        shm_input(client, "INPUT0", "no_such_region", VECTOR),
    )
    expect(
        client,
        "INVALID_ARGUMENT",
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 32",
        infer,
        shm_input(client, "INPUT0", region_in, VECTOR // 2),
    )
    expect(
        client,
        "INVALID_ARGUMENT",
        f"Invalid offset for shared memory region: '{region_in}'",
        infer,
        shm_input(client, "INPUT0", region_in, VECTOR, offset=4 * VECTOR),
    )
    expect(
        client,
        "INVALID_ARGUMENT",
        f"Invalid offset + byte size for shared memory region: '{region_in}'",
        infer,
        shm_input(client, "INPUT0", region_in, VECTOR, offset=VECTOR + 4),
    )
    if client.protocol == "http":  # gRPC's int64 parameter cannot carry it
        expect(
            client,
            "INVALID_ARGUMENT",
            "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds "
            f"maximum value (18446744073709551615) for region '{region_in}'",
            infer,
            shm_input(client, "INPUT0", region_in, VECTOR),
            [shm_output(client, "OUTPUT0", region_in, 2**64 - 32, offset=32)],
        )
    expect(
        client,
        "INVALID_ARGUMENT",
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
        "should be at least 64 bytes to hold the results",
        infer,
        shm_input(client, "INPUT0", region_in, VECTOR),
        [shm_output(client, "OUTPUT0", region_small, VECTOR // 2)],
    )
    key = f"/ge_test_{regions.name('in')}"
    expect(
        client,
        "INTERNAL" if client.protocol == "grpc" else "INVALID_ARGUMENT",  # gRPC: Triton's
        "Unable to open shared memory region: '/ge_test_missing",
        client.client.register_system_shared_memory,
        "missing",
        "/ge_test_missing",
        8,
    )
    with pytest.raises(InferenceServerException) as info:
        client.client.register_system_shared_memory(region_in, key, 8)
    assert info.value.status() == (
        "400" if client.protocol == "http" else "StatusCode.ALREADY_EXISTS"
    )
    assert f"shared memory region '{region_in}' already in manager" in info.value.message()
    expect(
        client,
        "INVALID_ARGUMENT",
        "failed to register shared memory region 'too_big': invalid args",
        client.client.register_system_shared_memory,
        "too_big",
        key,
        4 * VECTOR,
    )
    expect(
        client,
        "INVALID_ARGUMENT",
        "cannot register shared memory region 'escape' - invalid shm key '/../etc/passwd'",
        client.client.register_system_shared_memory,
        "escape",
        "/../etc/passwd",
        8,
    )
    assert "missing" not in status_names(client)
    assert "too_big" not in status_names(client)
    # The server is unharmed and still serves both kinds of request.
    assert client.client.is_server_live()
    result = client.infer("simple", {"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_http_routes_methods_and_bodies(server: ServerProcess) -> None:
    base = server.base_url + "/v2/systemsharedmemory"
    with httpx.Client(timeout=10) as http:
        assert http.get(base + "/status").status_code == 200
        assert http.post(base + "/status").status_code == 405
        assert http.get(base + "/unregister").status_code == 405
        missing_key = http.post(base + "/region/r/register", json={"byte_size": 8})
        assert missing_key.status_code == 400
        assert missing_key.json() == {"error": "Shared memory register request has no 'key' field"}
        no_size = http.post(base + "/region/r/register", json={"key": "/k"})
        assert no_size.json()["error"] == "Shared memory register request has no 'byte_size' field"
        negative = http.post(base + "/region/r/register", json={"key": "/k", "byte_size": -1})
        assert negative.status_code == 400 and "non-negative" in negative.json()["error"]
        garbage = http.post(base + "/region/r/register", content=b"{not json")
        assert garbage.status_code == 400 and "error" in garbage.json()
        unknown = http.get(base + "/region/nope/status")
        assert unknown.status_code == 404
        assert unknown.json() == {"error": "Unable to find system shared memory region: 'nope'"}
        cuda = http.get(server.base_url + "/v2/cudasharedmemory/status")
        assert cuda.status_code == 200 and cuda.json() == []
        assert http.post(server.base_url + "/v2/cudasharedmemory/unregister").status_code == 200
        assert http.get(server.base_url + "/v2/health/ready").status_code == 200


# --- lifetime: unregister while a request waits ---------------------------------------------

HOLD = 2


@pytest.fixture(scope="module")
def held_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Copies of `simple` with `dynamic_batching`, one per protocol, behind batchers held
    until HOLD requests are queued (TRITONSERVER_DELAY_SCHEDULER), so a request can be
    parked in the queue."""
    repo = tmp_path_factory.mktemp("held_repo")
    for protocol in PROTOCOLS:
        target = repo / f"held_{protocol}"
        shutil.copytree(EXAMPLE_MODELS / "simple", target)
        config = (target / "config.pbtxt").read_text()
        named = config.replace('name: "simple"', f'name: "held_{protocol}"', 1)
        (target / "config.pbtxt").write_text(named + "dynamic_batching {}\n")
    env = {"TRITONSERVER_DELAY_SCHEDULER": str(HOLD)}
    with running_server([repo], [ALLOW], env=env) as proc:
        yield proc


def wait_pending(server: ServerProcess, model: str, count: int, timeout: float = 30) -> None:
    def pending() -> bool:
        found = scrape(server.metrics_url).find("nv_inference_pending_request_count", model=model)
        return bool(found) and found[0][1] == count

    poll(pending, timeout, f"{model} to have {count} pending request(s)")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unregister_while_a_request_is_queued(held_server: ServerProcess, protocol: str) -> None:
    model = f"held_{protocol}"
    triton = Triton.connect(protocol, held_server)
    made = Regions(triton)
    try:
        region_in, handle_in = made.create("in", 2 * VECTOR)
        region_out, handle_out = made.create("out", 2 * VECTOR)
        shm.set_shared_memory_region(handle_in, [A, B])

        def parked() -> Any:
            own = Triton.connect(protocol, held_server)
            try:
                return own.client.infer(
                    model,
                    [shm_input(own, "INPUT0", region_in, VECTOR),
                     shm_input(own, "INPUT1", region_in, VECTOR, offset=VECTOR)],
                    outputs=[shm_output(own, "OUTPUT0", region_out, VECTOR),
                             shm_output(own, "OUTPUT1", region_out, VECTOR, offset=VECTOR)],
                )  # fmt: skip
            finally:
                own.close()

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(parked)
            wait_pending(held_server, model, 1)
            # Unregistered while the request that uses them waits in the queue: as in
            # Triton, they are only marked, and stay in the status...
            triton.client.unregister_system_shared_memory()
            assert status_names(triton) == {region_in, region_out}
            # ...and usable: a later request reads one (and releases the held batch).
            later = triton.client.infer(
                model,
                [shm_input(triton, "INPUT0", region_in, VECTOR), body_input(triton, "INPUT1", B)],
            )
            future.result(timeout=60)
        np.testing.assert_array_equal(later.as_numpy("OUTPUT0"), A + B)
        # Both requests have ended: the regions are gone now.
        assert status_names(triton) == set()
        # The parked request read its inputs and wrote its outputs through its own views.
        out = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16])
        np.testing.assert_array_equal(out, A + B)
        out = shm.get_contents_as_numpy(handle_out, np.int32, [1, 16], offset=VECTOR)
        np.testing.assert_array_equal(out, A - B)
        assert held_server.alive()
    finally:
        made.close()
        triton.close()


# --- off by default ----------------------------------------------------------------------


def test_client_shm_is_off_by_default(examples_server: ServerProcess) -> None:
    """Triton's default and words (qa L0_shared_memory test_client_shm_disabled_by_default):
    register and unregister are refused, status answers, the extension is still listed.
    On the session's server with the default flags: with client shared memory off, no test
    can leave a region registered on it."""
    disabled = (
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
        "to enable."
    )
    proc = examples_server
    client = httpclient.InferenceServerClient(proc.http_url)
    rpc = grpcclient.InferenceServerClient(proc.grpc_url)
    try:
        assert "system_shared_memory" in client.get_server_metadata()["extensions"]
        for call in (
            lambda: client.register_system_shared_memory("r", "/ge_test_disabled", 8),
            lambda: client.unregister_system_shared_memory("r"),
            client.unregister_system_shared_memory,
            client.unregister_cuda_shared_memory,
        ):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert (info.value.status(), info.value.message()) == ("501", disabled)
        for call in (
            lambda: rpc.register_system_shared_memory("r", "/ge_test_disabled", 8),
            lambda: rpc.unregister_system_shared_memory("r"),
        ):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.UNIMPLEMENTED"
            assert info.value.message() == disabled
        assert client.get_system_shared_memory_status() == []
        assert len(rpc.get_system_shared_memory_status().regions) == 0
        tensor = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        tensor.set_shared_memory("r", VECTOR)
        other = httpclient.InferInput("INPUT1", [1, 16], "INT32")
        other.set_data_from_numpy(B)
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple", [tensor, other])
        assert info.value.message() == "Unable to find shared memory region: 'r'"
    finally:
        client.close()
        rpc.close()


# --- perf_analyzer ---------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_perf_analyzer_with_system_shared_memory(perf_analyzer: tuple[str, dict[str, str]]) -> None:
    pa = perf_analyzer
    with running_server(extra=["--log-verbose", "1", ALLOW]) as proc:
        for protocol, url in (("http", proc.http_url), ("grpc", proc.grpc_url)):
            row = perfa.run_perf_analyzer(
                "simple", url, protocol, 2, measurement_interval_ms=500, max_trials=3,
                stability_percentage=1000, shared_memory="system", perf_analyzer=pa,
            )  # fmt: skip
            assert "--shared-memory system" in row["command"]
            assert float(row["throughput"]) > 0
            # perf_analyzer cleans up after itself: nothing stays registered.
            regions = httpx.get(proc.base_url + "/v2/systemsharedmemory/status", timeout=10)
            assert regions.json() == []
        log = proc.log()
        assert "registered system shared memory region" in log
        assert "unregistered system shared memory region" in log
        assert proc.alive()
