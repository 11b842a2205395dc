"""The soak's server and load: the server on a copied repository, the HTTP and gRPC clients,
the reloader and the RSS sampler, on one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio
import httpx
import numpy as np
import psutil

from bench.lib.server import ServerProcess, start_server
from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

from .calls import (
    GrpcCall,
    HttpCall,
    check_grpc_answer,
    check_http_answer,
    grpc_infer_request,
    http_binary_call,
    http_json_call,
    random_operands,
)
from .invalid import HTTP_MAX_INPUT, grpc_invalid_cases, http_invalid_cases
from .outcomes import MAX_FAILURE_SAMPLES, UNEXPECTED, Tally, classify_grpc, classify_http
from .report import ProtocolSummary, ReloadSummary, SoakReport, rss_windows, summarise_rss

MODELS: Final = ("simple", "simple_string")


def make_repository(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for name in MODELS:
        shutil.copytree(source / name, target / name)
    return target


def start_soak_server(repo: Path, extra: Sequence[str] = ()) -> ServerProcess:
    """ge-serve on `repo` in explicit mode with every model loaded, not waited for."""
    flags = [
        "--model-control-mode", "explicit", "--load-model", "*",
        "--http-max-input-size", str(HTTP_MAX_INPUT),
        *extra,
    ]  # fmt: skip
    return start_server([repo], flags, wait_ready=False)


async def wait_ready(server: ServerProcess, timeout_s: float) -> None:
    """Poll HTTP ready and gRPC ServerReady (real signals), or raise with the server's log."""
    deadline = time.monotonic() + timeout_s
    http_ok = grpc_ok = False
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http,
        grpc.aio.insecure_channel(server.grpc_url) as channel,
    ):
        stub = _stub(channel)
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"ge-serve exited early:\n{server.log()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                http_ok = http_ok or (await http.get("/v2/health/ready")).status_code == 200
            with contextlib.suppress(grpc.aio.AioRpcError):
                if not grpc_ok:
                    reply = await stub.ServerReady(pb.ServerReadyRequest(), timeout=1.0)
                    grpc_ok = bool(reply.ready)
            if http_ok and grpc_ok:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"ge-serve was not ready in {timeout_s:g} s:\n{server.log()[-4000:]}")


def _stub(channel: Any) -> Any:
    """The generated stub (untyped code): its methods answer the proto messages."""
    return pb_grpc.GRPCInferenceServiceStub(channel)


def rss_of(pid: int) -> int:
    """RSS of the process and its children (a backend could run in one)."""
    process = psutil.Process(pid)
    total = int(process.memory_info().rss)
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += int(child.memory_info().rss)
    return total


# --- the load -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    duration_s: float
    http_clients: int = 32
    grpc_clients: int = 32
    think_s: float = 0.1
    invalid_fraction: float = 0.1
    string_fraction: float = 0.1  # of valid requests, on simple_string
    reload_every_s: float = 30.0
    rss_every_s: float = 2.0
    request_timeout_s: float = 30.0
    seed: int = 0


@dataclass(slots=True)
class Run:
    """State the tasks of one run share (one event loop, so no locks)."""

    plan: Plan
    started: float
    deadline: float
    http: Tally = field(default_factory=Tally)
    grpc: Tally = field(default_factory=Tally)
    reloading: bool = False
    reloads_started: int = 0
    reload_times_s: list[tuple[float, float]] = field(default_factory=list)
    reload_failures: list[str] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    def reload_mark(self) -> tuple[bool, int]:
        return self.reloading, self.reloads_started

    def overlapped(self, mark: tuple[bool, int]) -> bool:
        """Whether a reload was in flight at some point since `mark` was taken."""
        return mark[0] or self.reloading or mark[1] != self.reloads_started

    def settle(
        self, tally: Tally, problem: str | None, began: float, client: int, kind: str,
        mark: tuple[bool, int],
    ) -> None:  # fmt: skip
        """Record one valid request: its latency if it was answered right, else why not."""
        if problem is None:
            tally.ok(self.now(), time.monotonic() - began, client)
        else:
            tally.failed(self.now(), f"{kind}: {problem}", self.overlapped(mark))


def _model(rng: np.random.Generator, plan: Plan) -> str:
    return "simple_string" if rng.random() < plan.string_fraction else "simple"


async def _think(run: Run, rng: np.random.Generator) -> None:
    await asyncio.sleep(float(rng.uniform(0.0, 2.0 * run.plan.think_s)))


async def http_client(
    run: Run, index: int, base_url: str, cases: dict[str, HttpCall], tls: ssl.SSLContext
) -> None:
    rng = np.random.default_rng([run.plan.seed, 1, index])
    names = sorted(cases)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tally = run.http
    async with httpx.AsyncClient(
        base_url=base_url, timeout=run.plan.request_timeout_s, limits=limits, verify=tls
    ) as http:
        while not run.over():
            if rng.random() < run.plan.invalid_fraction:
                name = names[int(rng.integers(len(names)))]
                call = cases[name]
                try:
                    response = await http.request(
                        call.method, call.path, content=call.body, headers=dict(call.headers)
                    )
                except httpx.HTTPError as exc:
                    tally.answered(name, f"transport: {type(exc).__name__}", UNEXPECTED)
                else:
                    status = response.status_code
                    tally.answered(name, str(status), classify_http(status))
            else:
                expected = random_operands(rng, _model(rng, run.plan))
                binary = rng.random() < 0.5
                call = http_binary_call(expected) if binary else http_json_call(expected)
                mark = run.reload_mark()
                began = time.monotonic()
                try:
                    response = await http.request(
                        call.method, call.path, content=call.body, headers=dict(call.headers)
                    )
                    problem = check_http_answer(
                        expected, response.status_code, response.headers, response.content
                    )
                except httpx.HTTPError as exc:
                    problem = f"transport: {type(exc).__name__}: {exc}"
                run.settle(tally, problem, began, index, "binary" if binary else "json", mark)
            await _think(run, rng)


async def grpc_client(run: Run, index: int, target: str, cases: dict[str, GrpcCall]) -> None:
    rng = np.random.default_rng([run.plan.seed, 2, index])
    names = sorted(cases)
    tally = run.grpc
    timeout = run.plan.request_timeout_s
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = _stub(channel)
        while not run.over():
            if rng.random() < run.plan.invalid_fraction:
                name = names[int(rng.integers(len(names)))]
                call = cases[name]
                try:
                    await getattr(stub, call.rpc)(call.request, timeout=timeout)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                    tally.answered(name, code, classify_grpc(code))
                else:
                    tally.answered(name, "OK", UNEXPECTED)
            else:
                expected = random_operands(rng, _model(rng, run.plan))
                typed = rng.random() < 0.25
                request = grpc_infer_request(expected, typed)
                mark = run.reload_mark()
                began = time.monotonic()
                try:
                    response = await stub.ModelInfer(request, timeout=timeout)
                    problem = check_grpc_answer(expected, response)
                except grpc.aio.AioRpcError as exc:
                    problem = f"{exc.code().name}: {exc.details()}"
                run.settle(tally, problem, began, index, "typed" if typed else "raw", mark)
            await _think(run, rng)


async def _sleep_until(run: Run, at: float) -> bool:
    """Sleep until `at` seconds into the run; False when the run ends first."""
    delay = min(at, run.deadline - run.started) - run.now()
    if delay > 0:
        await asyncio.sleep(delay)
    return not run.over()


async def reloader(run: Run, base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=120.0) as http:
        count = 1
        while await _sleep_until(run, count * run.plan.reload_every_s):
            count += 1
            run.reloading = True
            run.reloads_started += 1
            began = time.monotonic()
            at = run.now()
            try:
                response = await http.post("/v2/repository/models/simple/load")
                problem = (
                    None
                    if response.status_code == 200
                    else (f"HTTP {response.status_code}: {response.text[:200]}")
                )
            except httpx.HTTPError as exc:
                problem = f"transport: {type(exc).__name__}: {exc}"
            finally:
                run.reloading = False
            if problem is None:
                run.reload_times_s.append((at, time.monotonic() - began))
            else:
                run.reload_failures.append(f"t={at:.1f}s: {problem}")


async def rss_sampler(run: Run, pid: int) -> None:
    count = 0
    while True:
        with contextlib.suppress(psutil.Error):
            run.rss.append((run.now(), rss_of(pid)))
        count += 1
        if not await _sleep_until(run, count * run.plan.rss_every_s):
            break
    with contextlib.suppress(psutil.Error):
        run.rss.append((run.now(), rss_of(pid)))


async def run_soak(server: ServerProcess, plan: Plan) -> SoakReport:
    """Drive the load for `plan.duration_s` against a ready server and summarise it."""
    http_cases = http_invalid_cases()
    grpc_cases = grpc_invalid_cases()
    server_process = psutil.Process(server.process.pid)
    server_cpu = server_process.cpu_times()
    client_cpu = time.process_time()
    started = time.monotonic()
    run = Run(plan, started, started + plan.duration_s)
    tls = ssl.create_default_context()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(rss_sampler(run, server.process.pid))
        tasks.create_task(reloader(run, server.base_url))
        for i in range(plan.http_clients):
            tasks.create_task(http_client(run, i, server.base_url, http_cases, tls))
        for i in range(plan.grpc_clients):
            tasks.create_task(grpc_client(run, i, server.grpc_url, grpc_cases))
    client_cpu = time.process_time() - client_cpu
    server_now = server_process.cpu_times()
    server_cpu_s = server_now.user + server_now.system - server_cpu.user - server_cpu.system
    warmup, window = rss_windows(plan.duration_s, plan.rss_every_s)
    width = max(1.0, round(plan.duration_s / 60.0))
    return SoakReport(
        duration_s=run.now(),
        http_clients=plan.http_clients,
        grpc_clients=plan.grpc_clients,
        invalid_fraction=plan.invalid_fraction,
        reload_every_s=plan.reload_every_s,
        protocols=[
            ProtocolSummary.of("http", run.http, width),
            ProtocolSummary.of("grpc", run.grpc, width),
        ],
        reloads=ReloadSummary(
            done=len(run.reload_times_s),
            failed=len(run.reload_failures),
            max_s=max((d for _, d in run.reload_times_s), default=None),
            failures=run.reload_failures[:MAX_FAILURE_SAMPLES],
            times=run.reload_times_s,
        ),
        rss=summarise_rss(run.rss, warmup, window),
        client_cpu_s=client_cpu,
        server_cpu_s=server_cpu_s,
    )
