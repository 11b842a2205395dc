"""HTTP routes of the shared-memory extensions (Triton's
docs/protocol/extension_shared_memory.md):

    GET  /v2/systemsharedmemory[/region/{region}]/status
    POST /v2/systemsharedmemory/region/{region}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{region}]/unregister

and the same under /v2/cudasharedmemory, where nothing can be registered (no CUDA devices):
status lists nothing and unregister has nothing to do, so clients that clean up at start-up
(perf_analyzer) work.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.errors import decoding
from ge_serve.server.sharedmemory import RegionStatus

from .bodies import SystemSharedMemoryRegisterRequest, decode_body
from .openapi import Body
from .responses import json_response
from .routing import RouteHost

SYSTEM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"
REGION = "/region/{region}"


def _region(request: Request) -> str:
    return str(request.path_params.get("region", ""))


def _status_json(regions: list[RegionStatus]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


def routes(front: RouteHost) -> list[Route]:
    shm = front.core.shared_memory

    async def system_status(request: Request) -> Response:
        return json_response(_status_json(shm.status(_region(request))))

    async def system_register(request: Request) -> Response:
        body = await front.read_body(request)
        with decoding("shared memory register request"):
            doc = decode_body(
                SystemSharedMemoryRegisterRequest, body, "shared memory register request"
            )
        await shm.register(_region(request), doc.key, doc.offset, doc.byte_size)
        return Response(status_code=200)

    async def system_unregister(request: Request) -> Response:
        shm.unregister(_region(request))
        return Response(status_code=200)

    async def cuda_status(request: Request) -> Response:
        return json_response(_status_json(shm.cuda_status(_region(request))))

    async def cuda_register(request: Request) -> Response:
        shm.cuda_register(_region(request))
        return Response(status_code=200)  # pragma: no cover - cuda_register always raises

    async def cuda_unregister(request: Request) -> Response:
        shm.cuda_unregister(_region(request))
        return Response(status_code=200)

    table: list[Route] = []
    register_body = Body(SystemSharedMemoryRegisterRequest)
    for base, status, register, unregister, body in (
        (SYSTEM, system_status, system_register, system_unregister, register_body),
        (CUDA, cuda_status, cuda_register, cuda_unregister, None),
    ):
        table += [
            front.route(base + "/status", status, ["GET"]),
            front.route(base + REGION + "/status", status, ["GET"]),
            front.route(base + REGION + "/register", register, ["POST"], body),
            front.route(base + "/unregister", unregister, ["POST"]),
            front.route(base + REGION + "/unregister", unregister, ["POST"]),
        ]
    return table
