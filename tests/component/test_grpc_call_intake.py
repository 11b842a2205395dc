"""The gRPC call intake: its open requests take ModelInfer calls as grpc.aio's own loop
would (answers, errors, metadata, interceptors), end with the server, and where the
installed grpcio lacks the internals it uses, the server says so and serves anyway."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc
from ge_serve.server.grpc import call_intake
from ge_serve.server.grpc.call_intake import CallIntake, missing_internals

SERVICE = "inference.GRPCInferenceService"
DEPTH = 4
CALLS = 24


async def answer(request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
    """Echo the id; an id starting "bad" is refused, with trailing metadata."""
    await asyncio.sleep(0)
    if request.id.startswith("bad"):
        context.set_trailing_metadata((("why", request.id),))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"refused {request.id}")
    return pb.ModelInferResponse(model_name=request.model_name, id=request.id)


class Counting(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        self.seen.append(str(details.method))
        return await continuation(details)


class Served:
    def __init__(self, server: grpc.aio.Server, intake: CallIntake, port: int) -> None:
        self.server, self.intake, self.port = server, intake, port
        self.attached = False


async def serve(interceptors: list[Any]) -> Served:
    server = grpc.aio.server(interceptors=interceptors)
    handler = grpc.unary_unary_rpc_method_handler(
        answer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),)
    )
    intake = CallIntake(server, SERVICE, "ModelInfer", handler, interceptors, depth=DEPTH)
    intake.register()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    served = Served(server, intake, port)
    served.attached = intake.attach()
    return served


@pytest.fixture
async def counting() -> Counting:
    return Counting()


@pytest.fixture
async def served(counting: Counting) -> AsyncIterator[Served]:
    served = await serve([counting])
    yield served
    await served.server.stop(None)
    await served.intake.close()


async def call(port: int, ids: list[str]) -> list[Any]:
    """Every call at once, on one channel; each result is the answer or the error."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelInfer(pb.ModelInferRequest(model_name="m", id=i)) for i in ids]
        return list(await asyncio.gather(*calls, return_exceptions=True))


def test_the_installed_grpcio_has_what_the_intake_uses() -> None:
    assert missing_internals() is None


async def test_calls_are_answered_through_the_intake(served: Served, counting: Counting) -> None:
    assert served.attached
    ids = [f"call-{n}" for n in range(CALLS)]
    answers = await call(served.port, ids)
    assert [a.id for a in answers] == ids
    assert all(a.model_name == "m" for a in answers)
    # Five open requests for ModelInfer, four of them the intake's; grpc core hands calls
    # to open requests in the order they were opened, so the intake takes most of them.
    assert served.intake.taken >= CALLS // 2
    # The interceptors ran for every call, whichever request took it.
    assert counting.seen == [f"/{SERVICE}/ModelInfer"] * CALLS
    # Every taker asked again after its call.
    assert served.intake.open_requests == DEPTH


async def test_errors_and_trailing_metadata_reach_the_client(served: Served) -> None:
    ids = [f"bad-{n}" for n in range(CALLS)]
    errors = await call(served.port, ids)
    assert served.intake.taken >= CALLS // 2
    for rpc_id, error in zip(ids, errors, strict=True):
        assert isinstance(error, grpc.aio.AioRpcError)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == f"refused {rpc_id}"
        assert ("why", rpc_id) in tuple(error.trailing_metadata() or ())
    # The server still serves.
    assert [a.id for a in await call(served.port, ["after"])] == ["after"]


async def test_requests_end_with_the_server(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Takers that outlived the server would be cancelled only after this long.
    monkeypatch.setattr(call_intake, "CLOSE_WAIT_S", 60.0)
    served = await serve([counting])
    assert [a.id for a in await call(served.port, ["one"])] == ["one"]
    await served.server.stop(None)
    await asyncio.wait_for(served.intake.close(), 5.0)
    assert served.intake.open_requests == 0
    running = [t for t in asyncio.all_tasks() if t.get_name().startswith("grpc-intake")]
    assert running == []


async def test_an_unregistered_method_is_not_taken(caplog: pytest.LogCaptureFixture) -> None:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(answer)
    intake = CallIntake(server, SERVICE, "ModelInfer", handler, depth=DEPTH)
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with caplog.at_level(logging.WARNING, logger=call_intake.__name__):
            assert not intake.attach()
        assert "was not registered before the server started" in caplog.text
        assert intake.open_requests == 0
    finally:
        await server.stop(None)
        await intake.close()


async def test_without_the_internals_grpc_aio_takes_every_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, counting: Counting
) -> None:
    monkeypatch.setattr(call_intake, "missing_internals", lambda: "cygrpc has no _handle_rpc")
    with caplog.at_level(logging.WARNING, logger=call_intake.__name__):
        served = await serve([counting])
    try:
        assert not served.attached
        assert "cygrpc has no _handle_rpc" in caplog.text
        assert "start one per loop wakeup" in caplog.text
        ids = [f"call-{n}" for n in range(CALLS)]
        assert [a.id for a in await call(served.port, ids)] == ids
        assert served.intake.taken == 0
        assert served.intake.open_requests == 0
    finally:
        await served.server.stop(None)
        await served.intake.close()
