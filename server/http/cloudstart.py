"""Starting Triton's SageMaker and Vertex AI endpoints (Triton's main.cc): each its own
uvicorn server on its own port, on the server's loop, before the HTTP front end, serving
routes onto the HTTP front end's application (sagemaker.py, vertexai.py).

A failure to start one is logged in Triton's words ("failed to start Vertex AI service:
...") and the server exits, as Triton's does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping

from starlette.types import ASGIApp

from ..control.stopping import DrainGate
from ..errors import ServerError
from ..models.registered import RegisteredRepositories
from ..startup.cloudflags import CloudSettings
from .app import HttpFrontEnd
from .monitoring import MetricsApp
from .sagemaker import SageMakerEndpoint
from .sagemaker_mme import MultiModelEndpoint
from .vertexai import VertexAiEndpoint, default_model, routes

log = logging.getLogger(__name__)

StartUvicorn = Callable[[ASGIApp, str, int, str, DrainGate | None], Awaitable[int]]


async def start_cloud(
    cloud: CloudSettings,
    front: HttpFrontEnd,
    registered: RegisteredRepositories,
    metrics: Callable[[], bytes] | None,
    start: StartUvicorn,
    environ: Mapping[str, str] = os.environ,
) -> bool:
    """Start the endpoints `cloud` allows, `metrics` rendering the metrics redirect's
    answer; False: one failed (logged), exit."""
    if not (cloud.allow_sagemaker or cloud.allow_vertex_ai):
        return True
    inner = front.build_fastapi()
    what = "Sagemaker"
    try:
        if cloud.allow_sagemaker:
            mme = MultiModelEndpoint(
                front.core,
                registered,
                front.infer_endpoint,
                front.restrictions.refusal,
                environ,
            )
            app: ASGIApp = SageMakerEndpoint(inner, mme, environ)
            await start(app, "0.0.0.0", cloud.sagemaker_port, "Sagemaker HTTP", front.gate)
        what = "Vertex AI"
        if cloud.allow_vertex_ai:
            predict, health = routes(environ)
            model = await default_model(front.core, cloud.vertex_ai_default_model)
            answer = MetricsApp(metrics) if metrics is not None else None
            app = VertexAiEndpoint(inner, answer, model, predict, health)
            await start(app, "0.0.0.0", cloud.vertex_ai_port, "Vertex AI HTTP", front.gate)
    except ServerError as exc:
        log.error("failed to start %s service: %s", what, exc.message)
        return False
    return True
