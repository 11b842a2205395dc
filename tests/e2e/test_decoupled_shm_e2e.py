"""Shared-memory outputs of a decoupled model, over a gRPC stream: each response's output
is written into the client's region and described without data, as Triton's stream
handler writes every response through the request's region map (perf_analyzer
`--streaming --shared-memory system` relies on it). A region too small for a response
fails that response only, inline on the stream."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from polling import poll
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# One response per request holding IN * 10, then the final flag on its own.
TIMES_TEN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values * 10)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("decoupled-shm")
    pymodels.write_model(
        repo,
        "times_ten",
        TIMES_TEN,
        'name: "times_ten"\nbackend: "python"\n'
        "model_transaction_policy { decoupled: true }\n"
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n',
    )
    with running_server([repo], ["--allow-client-shm=true"]) as proc:
        yield proc


def stream_once(
    client: grpcclient.InferenceServerClient, values: list[int], region: str, size: int
) -> tuple[Any, Any]:
    """(result, error) of one request on a fresh stream, its OUT asked for in `region`."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, np.int32))
        out = grpcclient.InferRequestedOutput("OUT")
        out.set_shared_memory(region, size)
        client.async_stream_infer("times_ten", [tensor], outputs=[out])
        return answers.get(timeout=30)
    finally:
        client.stop_stream()


def test_each_response_is_written_to_the_region(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    name = f"out_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/ge_test_{name}", 16)
    try:
        client.register_system_shared_memory(name, f"/ge_test_{name}", 16)
        for values in ([1, 2, 3, 4], [5, 6]):
            result, error = stream_once(client, values, name, 16)
            assert error is None
            output = result.get_output("OUT")
            # Described, not carried: shape and datatype here, the data in the region.
            assert list(output.shape) == [len(values)] and output.datatype == "INT32"
            got = shm.get_contents_as_numpy(handle, np.int32, [len(values)])
            np.testing.assert_array_equal(got, np.array(values, np.int32) * 10)
        # Too small for the response: that response fails, in Triton's words; the server
        # and the region serve on.
        result, error = stream_once(client, [1, 2, 3, 4, 5], name, 16)
        assert result is None and error is not None
        assert "shared memory size specified with the request for output 'OUT'" in str(error)
        result, error = stream_once(client, [7], name, 16)
        assert error is None
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1]), [70])
    finally:
        client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)
        client.close()


def test_a_failed_write_does_not_keep_the_region_mapped(server: ServerProcess) -> None:
    """A response too big for its region fails inline; once the client unregisters the
    region, the server has let go of it (its mapping is gone), not only after the garbage
    collector happens to run."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    name = f"small_{uuid.uuid4().hex[:8]}"
    key = f"/ge_test_{name}"
    handle = shm.create_shared_memory_region(name, key, 8)
    try:
        client.register_system_shared_memory(name, key, 8)
        result, error = stream_once(client, [1, 2, 3, 4], name, 8)
        assert result is None and error is not None
        client.unregister_system_shared_memory(name)
        maps = Path(f"/proc/{server.process.pid}/maps")
        # The stream's end and the release may trail the client's unregister a moment.
        poll(lambda: f"/dev/shm{key}" not in maps.read_text(), 2.0, "the region unmapped")
    finally:
        shm.destroy_shared_memory_region(handle)
        client.close()
