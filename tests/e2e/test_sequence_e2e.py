"""Sequence batching end to end: Triton's own client sequence examples, unchanged, pass
against a `simple_sequence` model built as Triton's docs describe; the errors a client
sees for requests that break a sequence's rules; and a model without sequence batching
serving a request that names a sequence."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import SIMPLE_SEQUENCE_CONFIG, identity_model, simple_sequence_model, write_model
from onnx import TensorProto
from protocols import PROTOCOLS, Triton
from serverproc import REPO_ROOT, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXAMPLES = Path(__file__).parent / "triton_client_examples"
IDENTITY = """
name: "identity"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def sequence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequence-repo")
    write_model(repo, "simple_sequence", simple_sequence_model(), SIMPLE_SEQUENCE_CONFIG)
    write_model(repo, "identity", identity_model(TensorProto.INT32, ("batch", 1)), IDENTITY)
    with running_server([repo]) as server:
        yield server


@pytest.mark.parametrize(
    ("script", "grpc"),
    [
        ("simple_http_sequence_sync_infer_client.py", False),
        ("simple_grpc_sequence_sync_infer_client.py", True),
        ("simple_grpc_sequence_stream_infer_client.py", True),
        ("simple_grpc_aio_sequence_stream_infer_client.py", True),
    ],
)
def test_tritons_sequence_example_passes(
    sequence_server: ServerProcess, script: str, grpc: bool
) -> None:
    url = sequence_server.grpc_url if grpc else sequence_server.http_url
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "-u", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    # The accumulated values it checked: the first request adds START (1) to its input.
    assert "[0] 1 : 101 : 21" in result.stdout


def _inputs(module: object, value: int) -> list[object]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return [tensor]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_clients_see_tritons_errors_for_broken_sequences(
    sequence_server: ServerProcess, protocol: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    url = sequence_server.http_url if protocol == "http" else sequence_server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple_sequence", _inputs(module, 1))
        assert "must specify a non-zero or non-empty correlation ID" in str(info.value)
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple_sequence", _inputs(module, 1), sequence_id=77)
        assert (
            "inference request for sequence 77 to model 'simple_sequence' must specify the "
            "START flag on the first request of the sequence"
        ) in str(info.value)
        # A sequence of string ID, over this protocol, still works after the errors.
        first = client.infer(
            "simple_sequence", _inputs(module, 4), sequence_id="s-1", sequence_start=True
        )
        last = client.infer(
            "simple_sequence", _inputs(module, 9), sequence_id="s-1", sequence_end=True
        )
        assert first.as_numpy("OUTPUT").tolist() == [[5]]
        assert last.as_numpy("OUTPUT").tolist() == [[9]]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_without_sequence_batching_serves_a_request_naming_a_sequence(
    sequence_server: ServerProcess, protocol: str
) -> None:
    """Triton ignores the sequence of a request to such a model: it answers as without."""
    triton = Triton.connect(protocol, sequence_server)
    try:
        for sequence in (
            {"sequence_id": 5, "sequence_start": True},
            {"sequence_id": "s-5"},
            {"sequence_id": 5, "sequence_end": True},
        ):
            data = np.full((1, 1), 8, np.int32)
            result = triton.infer("identity", {"INPUT": data}, **sequence)
            assert result.as_numpy("OUTPUT").tolist() == [[8]]
            assert triton.response_parameters(result) == {}
    finally:
        triton.close()
