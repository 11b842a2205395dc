"""The gRPC server inside the real process: its flags, its log line, and a graceful stop
while a client still holds a stream open."""

from __future__ import annotations

import queue
import shutil
import signal
import socket
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serverproc import running_server, start_server

from ge_serve.server.cli import parse_settings
from ge_serve.server.startup.part_settings import grpc_settings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_log_line_and_stop_with_an_open_stream() -> None:
    # An exit timeout far longer than the test allows: the server must not wait for it
    # just because a client keeps its stream open.
    with running_server(extra=["--exit-timeout-secs", "600"]) as server:
        assert f"Started GRPCInferenceService at {server.grpc_url}" in server.log()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        a = np.ones((1, 16), dtype=np.int32)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        client.async_stream_infer("simple", inputs, request_id="before-stop")
        result, error = results.get(timeout=30)
        assert error is None and result.get_response().id == "before-stop"

        assert server.stop(signal.SIGTERM, timeout=60) == 0
        client.stop_stream()
        client.close()
        assert "stopped" in server.log()


def test_allow_grpc_false() -> None:
    with running_server(extra=["--allow-grpc", "false"]) as server:
        assert "GRPCInferenceService" not in server.log()
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", server.grpc_port)) != 0


def test_grpc_port_in_use_fails_startup() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server(extra=["--grpc-port", str(port)], wait_ready=False)
        try:
            assert server.process.wait(timeout=60) == 1
            assert f"cannot listen for gRPC on 127.0.0.1:{port}" in server.log()
        finally:
            server.stop()
            shutil.rmtree(server.log_path.parent, ignore_errors=True)


def test_grpc_flags_become_server_settings() -> None:
    settings = parse_settings(
        [
            "--model-repository", "/nonexistent",
            "--grpc-address", "::1",
            "--grpc-port", "9001",
            "--grpc-keepalive-time", "10000",
            "--grpc-keepalive-timeout", "5000",
            "--grpc-keepalive-permit-without-calls", "true",
            "--grpc-http2-max-pings-without-data", "0",
            "--grpc-http2-min-recv-ping-interval-without-data", "5000",
            "--grpc-restricted-protocol", "model-repository,statistics:Admin-Key=s3cret",
        ]
    )  # fmt: skip
    for_grpc = grpc_settings(settings)
    assert for_grpc.target == "[::1]:9001"
    # The header as written (Triton's refusal names it so); it is matched in any case.
    assert for_grpc.restricted == (
        ("model-repository", "Admin-Key", "s3cret"),
        ("statistics", "Admin-Key", "s3cret"),
    )
    options = dict(for_grpc.channel_options())
    assert options["grpc.keepalive_time_ms"] == 10000
    assert options["grpc.keepalive_timeout_ms"] == 5000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert options["grpc.http2.min_recv_ping_interval_without_data_ms"] == 5000
    assert options["grpc.max_receive_message_length"] == 2**31 - 1
    assert options["grpc.max_send_message_length"] == 2**31 - 1
