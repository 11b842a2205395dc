"""ModelStreamInfer in process: the real core, front end and grpc.aio server, with a gate in
front of each model's real scheduler so a test decides when requests run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serverproc import EXAMPLE_MODELS

from ge_serve.backends.base import LoadedModel
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.app import make_scheduler
from ge_serve.server.grpc.server import GrpcFrontEnd
from ge_serve.server.inference.cancellation import Cancellation
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import InferRequest, InferResponse
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository
from ge_serve.server.observability.tracing import Trace
from ge_serve.server.startup.part_settings import grpc_settings
from ge_serve.server.startup.settings import Settings

pytestmark = pytest.mark.timeout(60)

WAIT_S = 30.0


class Gate:
    """Holds requests at the scheduler until released; counts those cancelled while held."""

    def __init__(self, open_: bool = False) -> None:
        self.open = open_
        self.held: list[asyncio.Future[None]] = []
        self.cancelled = 0
        self.changed = asyncio.Condition()

    async def hold(self) -> None:
        if self.open:
            return
        future = asyncio.get_running_loop().create_future()
        async with self.changed:
            self.held.append(future)
            self.changed.notify_all()
        try:
            await future
        except asyncio.CancelledError:
            async with self.changed:
                self.cancelled += 1
                self.changed.notify_all()
            raise

    async def until(self, predicate: Any) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), WAIT_S)

    def release(self, index: int) -> None:
        self.held[index].set_result(None)


class GatedScheduler:
    def __init__(self, inner: Scheduler, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        await self.gate.hold()
        return await self.inner.submit(item)

    @property
    def pending(self) -> int:
        return self.inner.pending

    async def close(self, drain_timeout_s: float) -> None:
        await self.inner.close(drain_timeout_s)


class DecoupledCore(InferenceServer):
    """A core whose models answer each request with three responses, as a decoupled
    backend would through the `infer_responses` seam."""

    def is_decoupled(self, name: str, version: str = "") -> bool:
        self.model(name, version)
        return True

    async def infer_responses(
        self,
        request: InferRequest,
        errors_inline: bool = False,
        parent: Trace | None = None,
        cancellation: Cancellation | None = None,
        sampled: bool = True,
    ) -> AsyncGenerator[InferResponse, None]:
        for part in range(3):
            response = await self.infer(request)
            response.parameters = {"part": part}
            yield response


@dataclass
class Rig:
    gate: Gate
    core: InferenceServer
    front: GrpcFrontEnd
    stub: pb_grpc.GRPCInferenceServiceStub
    channel: grpc.aio.Channel


@asynccontextmanager
async def running(
    core_type: type[InferenceServer] = InferenceServer,
    open_: bool = False,
    restricted: tuple[tuple[str, str, str], ...] = (),
) -> Any:
    gate = Gate(open_)

    def factory(config: model_config_pb2.ModelConfig, loaded: LoadedModel) -> Scheduler:
        return GatedScheduler(make_scheduler(config, loaded), gate)

    lifecycle = ModelLifecycle(
        ModelRepository([EXAMPLE_MODELS]),
        {"onnxruntime": OnnxRuntimeBackend()},
        factory,
        LifecycleSettings(),
    )
    assert not await lifecycle.load_many(["simple"])
    core = core_type(lifecycle)
    settings = Settings(
        model_repositories=(EXAMPLE_MODELS,),
        grpc_address="127.0.0.1",
        grpc_port=0,
        grpc_restricted_protocol=restricted,
    )
    front = GrpcFrontEnd(core, grpc_settings(settings))
    await front.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{front.port}")
    try:
        yield Rig(gate, core, front, pb_grpc.GRPCInferenceServiceStub(channel), channel)
    finally:
        await channel.close()
        await front.stop(1.0)
        await lifecycle.close()


def simple_request(i: int, model: str = "simple") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=f"r{i}")
    for name, value in (("INPUT0", i), ("INPUT1", 1)):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.full(16, value, dtype=np.int32).tobytes())
    return message


def output0(response: pb.ModelInferResponse) -> np.ndarray:
    index = [o.name for o in response.outputs].index("OUTPUT0")
    return np.frombuffer(response.raw_output_contents[index], dtype=np.int32)


async def read_all(call: Any) -> list[pb.ModelStreamInferResponse]:
    responses: list[pb.ModelStreamInferResponse] = []
    while True:
        response = await asyncio.wait_for(call.read(), WAIT_S)
        if response is grpc.aio.EOF:
            return responses
        responses.append(response)


async def test_requests_run_together_and_answer_in_request_order() -> None:
    async with running() as rig:
        call = rig.stub.ModelStreamInfer()
        for i in range(6):
            await call.write(simple_request(i))
        # All six reach the scheduler before any has an answer: they are in flight together.
        await rig.gate.until(lambda: len(rig.gate.held) == 6)
        for index in reversed(range(6)):
            rig.gate.release(index)
        await call.done_writing()
        responses = await read_all(call)
        assert await call.code() == grpc.StatusCode.OK
        assert [r.infer_response.id for r in responses] == [f"r{i}" for i in range(6)]
        for i, response in enumerate(responses):
            assert not response.error_message
            np.testing.assert_array_equal(output0(response.infer_response), i + 1)
            final = response.infer_response.parameters["triton_final_response"]
            assert final.bool_param is True


@pytest.mark.parametrize("how", ["cancel", "close-channel"])
async def test_stream_ending_early_drops_its_queued_requests(how: str) -> None:
    async with running() as rig:
        call = rig.stub.ModelStreamInfer()
        for i in range(5):
            await call.write(simple_request(i))
        await rig.gate.until(lambda: len(rig.gate.held) == 5)
        if how == "cancel":
            call.cancel()
        else:
            await rig.channel.close()
        await rig.gate.until(lambda: rig.gate.cancelled == 5)
        assert not any(future.done() and not future.cancelled() for future in rig.gate.held)
        # The server goes on serving.
        rig.gate.open = True
        async with grpc.aio.insecure_channel(f"127.0.0.1:{rig.front.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            response = await stub.ModelInfer(simple_request(7), timeout=WAIT_S)
            np.testing.assert_array_equal(output0(response), 8)


async def test_stop_streams_ends_an_open_stream_after_its_requests() -> None:
    async with running() as rig:
        call = rig.stub.ModelStreamInfer()
        for i in range(3):
            await call.write(simple_request(i))
        await rig.gate.until(lambda: len(rig.gate.held) == 3)
        rig.front.servicer.stop_streams()
        for index in range(3):
            rig.gate.release(index)
        # The client never says it is done writing; the server answers what it read, then
        # ends the stream UNAVAILABLE: whatever the client wrote later was never read.
        responses = [await asyncio.wait_for(call.read(), WAIT_S) for _ in range(3)]
        assert [r.infer_response.id for r in responses] == ["r0", "r1", "r2"]
        assert all(not r.error_message for r in responses)
        assert await call.code() == grpc.StatusCode.UNAVAILABLE
        assert await call.details() == "Server is shutting down"


async def test_triton_grpc_error_closes_the_stream_and_cancels_the_rest() -> None:
    async with running() as rig:
        # Through the sync client: when one of its writes lands after the server ended the
        # stream, grpc.aio's client reports "INTERNAL: Internal error from Core" in place
        # of the server's status (grpc/grpc#36066; 1 run in 8 of this test here).
        requests = [simple_request(0, model="no_such_model")]
        requests += [simple_request(i) for i in range(1, 4)]

        def stream() -> Any:
            with grpc.insecure_channel(f"127.0.0.1:{rig.front.port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                responses = stub.ModelStreamInfer(
                    iter(requests), metadata=(("triton_grpc_error", "true"),)
                )
                with pytest.raises(grpc.RpcError) as caught:
                    list(responses)
                return caught.value

        error = await asyncio.to_thread(stream)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "no_such_model" in error.details()
        # Whatever reached the scheduler was cancelled there, and nothing ran.
        await rig.gate.until(lambda: rig.gate.cancelled == len(rig.gate.held))


@pytest.mark.parametrize("empty_final", [False, True])
async def test_decoupled_responses_and_the_final_flag(empty_final: bool) -> None:
    async with running(DecoupledCore, open_=True) as rig:
        call = rig.stub.ModelStreamInfer()
        message = simple_request(4)
        if empty_final:
            message.parameters["triton_enable_empty_final_response"].bool_param = True
        await call.write(message)
        await call.done_writing()
        responses = [r.infer_response for r in await read_all(call)]
        assert await call.code() == grpc.StatusCode.OK
        parts = responses[:3]
        assert [r.parameters["part"].int64_param for r in parts] == [0, 1, 2]
        assert all(not r.parameters["triton_final_response"].bool_param for r in parts)
        for response in parts:
            np.testing.assert_array_equal(output0(response), 5)
        if empty_final:
            assert len(responses) == 4
            final = responses[3]
            assert final.id == "r4" and not final.outputs
            assert final.parameters["triton_final_response"].bool_param is True
        else:
            assert len(responses) == 3


async def test_health_follows_core_readiness() -> None:
    async with running(open_=True) as rig:
        health = health_pb2_grpc.HealthStub(rig.channel)
        request = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
        answer = await health.Check(request, timeout=WAIT_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        rig.core.stop_accepting()
        answer = await health.Check(request, timeout=WAIT_S)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.stub.ModelInfer(simple_request(1), timeout=WAIT_S)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (info.value.details() or "")


async def test_a_stream_reads_no_more_than_its_in_flight_limit() -> None:
    async with running() as rig:
        rig.front.servicer.max_in_flight = 4
        call = rig.stub.ModelStreamInfer()
        for i in range(10):
            await call.write(simple_request(i))
        await rig.gate.until(lambda: len(rig.gate.held) == 4)
        # Give the reader every chance to take a fifth request: it must not.
        await asyncio.sleep(0.3)
        assert len(rig.gate.held) == 4
        rig.gate.release(0)
        await rig.gate.until(lambda: len(rig.gate.held) == 5)
        rig.gate.open = True
        for index in range(1, 5):
            rig.gate.release(index)
        await call.done_writing()
        responses = await read_all(call)
        assert [r.infer_response.id for r in responses] == [f"r{i}" for i in range(10)]


async def test_restricted_protocols_need_their_header() -> None:
    """Wired into the front end: the interceptor guards inference (unary and streaming) and
    health, and leaves other groups open."""
    restricted = (("inference", "infer-key", "secret"), ("health", "infer-key", "secret"))
    async with running(open_=True, restricted=restricted) as rig:
        expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
        key = (("triton-grpc-protocol-infer-key", "secret"),)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.stub.ModelInfer(simple_request(1), timeout=WAIT_S)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == expected
        response = await rig.stub.ModelInfer(simple_request(1), metadata=key, timeout=WAIT_S)
        np.testing.assert_array_equal(output0(response), 2)

        call = rig.stub.ModelStreamInfer()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await read_all(call)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        call = rig.stub.ModelStreamInfer(metadata=key)
        await call.write(simple_request(2))
        await call.done_writing()
        assert [r.infer_response.id for r in await read_all(call)] == ["r2"]

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.stub.ServerLive(pb.ServerLiveRequest(), timeout=WAIT_S)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        health = health_pb2_grpc.HealthStub(rig.channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(), metadata=key, timeout=WAIT_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        # Groups not named stay open.
        metadata = await rig.stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=WAIT_S)
        assert metadata.name == "triton"


async def test_stop_finishes_admitted_calls_and_refuses_new_ones_unavailable() -> None:
    async with running() as rig:
        unary = asyncio.ensure_future(rig.stub.ModelInfer(simple_request(1), timeout=WAIT_S))
        stream = rig.stub.ModelStreamInfer()
        await stream.write(simple_request(2))
        await rig.gate.until(lambda: len(rig.gate.held) == 2)

        stopping = asyncio.create_task(rig.front.stop(WAIT_S))
        for _ in range(int(WAIT_S / 0.01)):
            if not rig.front.servicer.gate.is_open:
                break
            await asyncio.sleep(0.01)
        # The listener is still open: new work is answered, UNAVAILABLE, not cancelled.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rig.stub.ModelInfer(simple_request(3), timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == "Server is shutting down"
        late = rig.stub.ModelStreamInfer()
        with pytest.raises(grpc.aio.AioRpcError) as refused_stream:
            await asyncio.wait_for(late.read(), WAIT_S)
        assert refused_stream.value.code() == grpc.StatusCode.UNAVAILABLE
        health = health_pb2_grpc.HealthStub(rig.channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=WAIT_S)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        ready = await rig.stub.ServerReady(pb.ServerReadyRequest(), timeout=WAIT_S)
        assert ready.ready is False
        assert not stopping.done()

        # What was admitted before the stop is answered in full.
        rig.gate.release(0)
        rig.gate.release(1)
        np.testing.assert_array_equal(output0(await unary), 2)
        answered = await asyncio.wait_for(stream.read(), WAIT_S)
        assert answered.infer_response.id == "r2" and not answered.error_message
        assert await stream.code() == grpc.StatusCode.UNAVAILABLE
        await asyncio.wait_for(stopping, WAIT_S)
        assert rig.gate.cancelled == 0


async def test_concurrent_calls_are_taken_by_the_intake_and_still_guarded() -> None:
    """The front end's call intake takes unary ModelInfer calls, and the restricted
    protocol interceptor guards every one it takes."""
    restricted = (("inference", "infer-key", "secret"),)
    async with running(restricted=restricted) as rig:
        intake = rig.front._intake
        assert intake is not None
        key = (("triton-grpc-protocol-infer-key", "secret"),)
        calls = [
            asyncio.ensure_future(rig.stub.ModelInfer(simple_request(i), metadata=key))
            for i in range(16)
        ]
        await rig.gate.until(lambda: len(rig.gate.held) == 16)
        for index in range(16):
            rig.gate.release(index)
        responses = await asyncio.wait_for(asyncio.gather(*calls), WAIT_S)
        assert [r.id for r in responses] == [f"r{i}" for i in range(16)]
        for i, response in enumerate(responses):
            np.testing.assert_array_equal(output0(response), i + 1)
        taken = intake.taken
        assert taken >= 8  # most of them: it holds 16 of the 17 open requests

        refused = await asyncio.gather(
            *(rig.stub.ModelInfer(simple_request(i), timeout=WAIT_S) for i in range(16)),
            return_exceptions=True,
        )
        assert all(
            isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.UNAVAILABLE
            for error in refused
        )
        assert intake.taken >= taken + 8
        assert len(rig.gate.held) == 16  # none of the refused reached the scheduler
