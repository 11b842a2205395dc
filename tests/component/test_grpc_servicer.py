"""The servicer's conversions for the RPCs whose core side other work fills in (statistics,
repository load/unload, logging), driven directly with a recording core."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.grpc.servicer import GrpcServicer
from ge_serve.server.inference.reports import (
    BatchStatistics,
    InferStatistics,
    MemoryUsage,
    ModelStatistics,
    StatisticDuration,
)


class Aborted(Exception):
    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Context:
    def __init__(self) -> None:
        self.code: Any = None
        self.details = ""

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    async def abort(self, code: Any, details: str) -> None:
        raise Aborted(code, details)


async def refused(call: Awaitable[object], context: Context) -> Aborted:
    """The status a unary RPC ended with: a handler that fails sets the code and details
    and returns no message (grpc sends only the status)."""
    try:
        response = await call
    except Aborted as exc:
        return exc
    assert response is None, "a refused call returned a message"
    assert context.code is not None, "the call was not refused"
    return Aborted(context.code, context.details)


def _took(count: int, ns: int) -> StatisticDuration:
    return StatisticDuration(count, ns)


STATS = (
    ModelStatistics(
        name="simple",
        version=1,
        last_inference=1700000000123,
        inference_count=12,
        execution_count=5,
        inference_stats=InferStatistics(
            success=_took(12, 9000),
            fail=_took(1, 50),
            queue=_took(12, 700),
            compute_input=_took(5, 100),
            compute_infer=_took(5, 6000),
            compute_output=_took(5, 200),
        ),
        batch_stats=(BatchStatistics(4, _took(3, 60), _took(3, 4000), _took(3, 90)),),
        memory_usage=(MemoryUsage("CPU", 0, 4096),),
    ),
)


class RecordingCore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.log = {"log_info": True, "log_verbose_level": 0, "log_format": "default"}

    def statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        self.calls.append(("statistics", (name, version)))
        return STATS

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        self.calls.append(("load", (name, config_json, files)))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.calls.append(("unload", (name, unload_dependents)))

    def log_settings(self) -> dict[str, Any]:
        return dict(self.log)

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("update_log", (changes,)))
        self.log.update(changes)
        return dict(self.log)


@pytest.fixture
def core() -> RecordingCore:
    return RecordingCore()


@pytest.fixture
def servicer(core: RecordingCore) -> GrpcServicer:
    return GrpcServicer(core)  # type: ignore[arg-type]


async def test_statistics(servicer: GrpcServicer, core: RecordingCore) -> None:
    response = await servicer.ModelStatistics(
        pb.ModelStatisticsRequest(name="simple", version="1"), Context()
    )
    assert core.calls == [("statistics", ("simple", "1"))]
    assert response is not None  # guard answers None only for a refused call
    (stats,) = response.model_stats
    assert (stats.name, stats.version, stats.inference_count) == ("simple", "1", 12)
    assert stats.last_inference == 1700000000123
    assert stats.inference_stats.compute_infer.ns == 6000
    assert stats.inference_stats.fail.count == 1
    assert stats.batch_stats[0].batch_size == 4
    assert stats.batch_stats[0].compute_infer.count == 3
    assert stats.memory_usage[0].byte_size == 4096


async def test_load_with_config_and_files(servicer: GrpcServicer, core: RecordingCore) -> None:
    request = pb.RepositoryModelLoadRequest(model_name="m")
    request.parameters["config"].string_param = '{"max_batch_size": 2}'
    request.parameters["file:1/model.onnx"].bytes_param = b"\x08\x01"
    await servicer.RepositoryModelLoad(request, Context())
    assert core.calls == [("load", ("m", '{"max_batch_size": 2}', {"1/model.onnx": b"\x08\x01"}))]


async def test_load_without_parameters(servicer: GrpcServicer, core: RecordingCore) -> None:
    await servicer.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="m"), Context())
    assert core.calls == [("load", ("m", None, None))]


@pytest.mark.parametrize(
    ("key", "field", "value", "text"),
    [
        ("config", "bytes_param", b"{}", "must be a string_param"),
        ("file:1/model.onnx", "string_param", "abc", "must be a bytes_param"),
        ("file:", "bytes_param", b"x", "has no path"),
        ("colour", "string_param", "red", "unexpected load parameter 'colour'"),
    ],
)
async def test_load_parameter_errors(
    servicer: GrpcServicer, core: RecordingCore, key: str, field: str, value: Any, text: str
) -> None:
    request = pb.RepositoryModelLoadRequest(model_name="m")
    setattr(request.parameters[key], field, value)
    context = Context()
    info = await refused(servicer.RepositoryModelLoad(request, context), context)
    assert info.code == grpc.StatusCode.INVALID_ARGUMENT
    assert text in info.details
    assert core.calls == []


async def test_unload(servicer: GrpcServicer, core: RecordingCore) -> None:
    request = pb.RepositoryModelUnloadRequest(model_name="m")
    await servicer.RepositoryModelUnload(request, Context())
    request.parameters["unload_dependents"].bool_param = True
    await servicer.RepositoryModelUnload(request, Context())
    assert core.calls == [("unload", ("m", False)), ("unload", ("m", True))]


async def test_log_settings(servicer: GrpcServicer, core: RecordingCore) -> None:
    current = await servicer.LogSettings(pb.LogSettingsRequest(), Context())
    assert current is not None  # guard answers None only for a refused call
    assert current.settings["log_info"].bool_param is True
    assert current.settings["log_format"].string_param == "default"
    request = pb.LogSettingsRequest()
    request.settings["log_verbose_level"].uint32_param = 2
    updated = await servicer.LogSettings(request, Context())
    assert updated is not None
    assert core.calls == [("update_log", ({"log_verbose_level": 2},))]
    assert updated.settings["log_verbose_level"].uint32_param == 2


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.INVALID_ARG, grpc.StatusCode.INVALID_ARGUMENT),
        (ErrorCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
        (ErrorCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
        (ErrorCode.UNSUPPORTED, grpc.StatusCode.UNIMPLEMENTED),
        (ErrorCode.INTERNAL, grpc.StatusCode.INTERNAL),
        (ErrorCode.ALREADY_EXISTS, grpc.StatusCode.ALREADY_EXISTS),
    ],
)
async def test_core_errors_map_to_status(
    servicer: GrpcServicer, core: RecordingCore, code: ErrorCode, status: Any
) -> None:
    def failing(name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        raise ServerError(code, "the reason")

    core.statistics = failing  # type: ignore[method-assign]
    context = Context()
    info = await refused(servicer.ModelStatistics(pb.ModelStatisticsRequest(), context), context)
    assert (info.code, info.details) == (status, "the reason")


async def test_unexpected_errors_are_internal(servicer: GrpcServicer, core: RecordingCore) -> None:
    def broken(name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        raise KeyError("boom")

    core.statistics = broken  # type: ignore[method-assign]
    context = Context()
    info = await refused(servicer.ModelStatistics(pb.ModelStatisticsRequest(), context), context)
    assert info.code == grpc.StatusCode.INTERNAL
    assert "KeyError" in info.details
