"""Sequence batching end to end: Triton's own client sequence examples, unchanged, pass
against a `simple_sequence` model built as Triton's docs describe; the errors a client
sees for requests that break a sequence's rules; a sequence sent through an ensemble to
its sequence step, and one sent to a model without sequence batching."""

from __future__ import annotations

import queue
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from ensemblerepo import ensemble_config, step, tensor, write_ensemble
from modelgen import (
    ACCUMULATOR_CONFIG,
    SIMPLE_SEQUENCE_CONFIG,
    accumulator_model,
    identity_model,
    simple_sequence_model,
    write_model,
)
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
INT32_1 = "TYPE_INT32", [1]
# running_total: IN -> the accumulator (a sequence model) -> identity (a model without
# sequence batching, which gets the sequence too) -> OUT, the sum so far of the sequence.
RUNNING_TOTAL = ensemble_config(
    "running_total",
    [
        step("accumulator", {"INPUT": "IN"}, {"OUTPUT": "total"}),
        step("identity", {"INPUT": "total"}, {"OUTPUT": "OUT"}),
    ],
    (tensor("IN", *INT32_1),),
    (tensor("OUT", *INT32_1),),
    max_batch_size=4,
)


@pytest.fixture(scope="module")
def sequence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequence-repo")
    write_model(repo, "simple_sequence", simple_sequence_model(), SIMPLE_SEQUENCE_CONFIG)
    write_model(repo, "identity", identity_model(TensorProto.INT32, ("batch", 1)), IDENTITY)
    accumulator = ACCUMULATOR_CONFIG.format(
        name="accumulator", platform='platform: "onnxruntime_onnx"'
    )
    write_model(repo, "accumulator", accumulator_model(), accumulator)
    write_ensemble(repo, "running_total", RUNNING_TOTAL)
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


def _running_total(triton: Triton, value: int, **sequence: Any) -> tuple[int, dict[str, Any]]:
    result = triton.infer("running_total", {"IN": np.full((1, 1), value, np.int32)}, **sequence)
    return int(result.as_numpy("OUT")[0][0]), triton.response_parameters(result)


def _echo(sequence_id: int | str, start: bool, end: bool) -> dict[str, Any]:
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_carries_a_sequence_to_its_sequence_step(
    sequence_server: ServerProcess, protocol: str
) -> None:
    triton = Triton.connect(protocol, sequence_server)
    seq_a = 41 if protocol == "http" else 42
    seq_b = f"run-{protocol}"
    try:
        # Two sequences, interleaved: START, middle, END each; the accumulator keeps each
        # one's sum, and the response echoes the request's sequence as Triton's does.
        got = [
            _running_total(triton, 3, sequence_id=seq_a, sequence_start=True),
            _running_total(triton, 10, sequence_id=seq_b, sequence_start=True),
            _running_total(triton, 4, sequence_id=seq_a),
            _running_total(triton, 20, sequence_id=seq_b),
            _running_total(triton, 5, sequence_id=seq_a, sequence_end=True),
            _running_total(triton, 30, sequence_id=seq_b, sequence_end=True),
        ]
        assert got == [
            (3, _echo(seq_a, True, False)),
            (10, _echo(seq_b, True, False)),
            (7, _echo(seq_a, False, False)),
            (30, _echo(seq_b, False, False)),
            (12, _echo(seq_a, False, True)),
            (60, _echo(seq_b, False, True)),
        ]
        # The END ended it in the step model: going on needs a new START.
        with pytest.raises(InferenceServerException) as caught:
            _running_total(triton, 1, sequence_id=seq_a)
        triton.expect_error(
            caught.value,
            "INVALID_ARGUMENT",
            f"in ensemble 'running_total', inference request for sequence {seq_a} to model "
            "'accumulator' must specify the START flag on the first request of the sequence",
        )
        with pytest.raises(InferenceServerException) as caught:
            _running_total(triton, 1)
        triton.expect_error(
            caught.value,
            "INVALID_ARGUMENT",
            "in ensemble 'running_total', inference request to model 'accumulator' must "
            "specify a non-zero or non-empty correlation ID",
        )
    finally:
        triton.close()


def test_an_ensembles_stream_responses_echo_the_sequence_flags(
    sequence_server: ServerProcess,
) -> None:
    """Triton's qa L0_simple_ensemble test_ensemble_sequence_flags, over this ensemble."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index, value in enumerate((2, 3, 4)):
            tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
            client.async_stream_infer(
                "running_total",
                [tensor],
                request_id=str(index),
                sequence_id=77,
                sequence_start=index == 0,
                sequence_end=index == 2,
            )
        got = []
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            parameters = result.get_response().parameters
            flags = [parameters[k].bool_param for k in ("sequence_start", "sequence_end")]
            got.append((int(result.as_numpy("OUT")[0][0]), flags))
        assert got == [(2, [True, False]), (5, [False, False]), (9, [False, True])]
    finally:
        client.stop_stream()
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
