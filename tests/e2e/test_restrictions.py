"""Restricted APIs: categories of routes and methods, refusals, and the real HTTP server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
import tritonclient.http as httpclient
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from serverproc import ServerProcess, running_server
from swapmodels import write_addk
from tritonclient.utils import InferenceServerException

from ge_serve.server.control.restrictions import (
    CATEGORIES,
    GRPC_HEADER_PREFIX,
    RestrictedApis,
    grpc_category,
    http_category,
)
from ge_serve.server.grpc.restricted import RestrictedProtocolInterceptor


@pytest.mark.parametrize(
    ("path", "category"),
    [
        ("/v2/health/live", "health"),
        ("/v2/health/ready", "health"),
        ("/v2", "metadata"),
        ("/v2/models/simple", "metadata"),
        ("/v2/models/simple/versions/1", "metadata"),
        ("/v2/models/simple/ready", "health"),
        ("/v2/models/simple/versions/2/infer", "inference"),
        ("/v2/models/simple/generate_stream", "inference"),
        ("/v2/models/simple/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/simple/versions/1/stats", "statistics"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/simple/load", "model-repository"),
        ("/v2/repository/models/simple/unload", "model-repository"),
        ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
        ("/v2/cudasharedmemory/status", "shared-memory"),
        ("/v2/trace/setting", "trace"),
        ("/v2/models/simple/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/v1/chat/completions", "inference"),
        ("/v1/chat/completions/batch", "inference"),
        ("/openai/v1/chat/completions/batch", "inference"),
        ("/v1/completions", "inference"),
        ("/v1/embeddings", "inference"),
        ("/score", "inference"),
        ("/v1/score", "inference"),
        ("/openai/v1/score", "inference"),
        ("/rerank", "inference"),
        ("/v1/rerank", "inference"),
        ("/v2/rerank", "inference"),
        ("/v2/embed", "inference"),
        ("/openai/v1/rerank", "inference"),
        ("/pooling", "inference"),
        ("/v1/pooling", None),
        ("/v2/score", None),
        ("/v1/models", "metadata"),
        ("/v1/models/simple", "metadata"),
        ("/v1/files", None),
        ("/metrics", None),
        ("/v2/nothing/here", None),
    ],
)
def test_http_categories(path: str, category: str | None) -> None:
    assert http_category(path) == category


def test_grpc_categories() -> None:
    assert grpc_category("/inference.GRPCInferenceService/RepositoryModelLoad") == (
        "model-repository"
    )
    assert grpc_category("ModelStreamInfer") == "inference"
    assert grpc_category("/grpc.health.v1.Health/Check") == "health"
    assert grpc_category("/inference.GRPCInferenceService/Unknown") is None
    assert set(grpc_category(m) for m in ("ServerLive", "LogSettings")) <= set(CATEGORIES)


def test_refusal_needs_the_exact_value() -> None:
    apis = RestrictedApis([("model-repository", "admin-key", "s3cret")])
    assert apis.refusal("model-repository", {}) == "admin-key"
    assert apis.refusal("model-repository", {"admin-key": "wrong"}) == "admin-key"
    assert apis.refusal("model-repository", {"admin-key": "s3cret"}) is None
    assert apis.refusal("inference", {}) is None
    assert apis.refusal(None, {}) is None


def test_grpc_prefix_is_part_of_the_header() -> None:
    apis = RestrictedApis([("inference", "infer-key", "v")], header_prefix=GRPC_HEADER_PREFIX)
    assert apis.refusal("inference", {"infer-key": "v"}) == "triton-grpc-protocol-infer-key"
    assert apis.refusal("inference", {"triton-grpc-protocol-infer-key": "v"}) is None


@pytest.mark.parametrize(
    "rules",
    [
        [("bogus", "h", "v")],
        [("health", "h", "v"), ("health", "g", "w")],
        [("health", "", "v")],
    ],
)
def test_bad_rules_are_refused(rules: list[tuple[str, str, str]]) -> None:
    with pytest.raises(ValueError):
        RestrictedApis(rules)


# --- the real server -----------------------------------------------------------------------

ADMIN = {"Admin-Key": "s3cret"}


@pytest.fixture(scope="module")
def restricted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("restricted-repo")
    write_addk(repo)
    extra = [
        "--model-control-mode=explicit",
        "--load-model=addk",
        "--http-restricted-api=model-repository:Admin-Key=s3cret",
        "--http-restricted-api=model-config,statistics:stats-key=other",
    ]
    with running_server([repo], extra) as proc:
        yield proc


@pytest.mark.timeout(120)
def test_http_refuses_load_and_unload_without_the_header(
    restricted_server: ServerProcess,
) -> None:
    base = restricted_server.base_url
    for action in ("load", "unload"):
        response = httpx.post(f"{base}/v2/repository/models/addk/{action}", timeout=30)
        assert response.status_code == 403
        # Named as the flag wrote it, as Triton's refusal does; matched in any case.
        assert response.json() == {"error": "This API is restricted, expecting header 'Admin-Key'"}
    response = httpx.post(f"{base}/v2/repository/index", headers={"admin-key": "nope"})
    assert response.status_code == 403
    response = httpx.get(f"{base}/v2/models/addk/config")
    assert response.status_code == 403
    assert "expecting header 'stats-key'" in response.json()["error"]
    # Unrestricted categories are untouched.
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200
    assert httpx.get(f"{base}/v2/models/addk").status_code == 200


@pytest.mark.timeout(120)
def test_http_accepts_load_and_unload_with_the_header(
    restricted_server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(restricted_server.http_url)
    try:
        with pytest.raises(InferenceServerException, match="This API is restricted"):
            client.unload_model("addk")
        assert client.is_model_ready("addk")
        client.unload_model("addk", headers=ADMIN)
        assert not client.is_model_ready("addk")
        client.load_model("addk", headers=ADMIN)
        assert client.is_model_ready("addk")
        index = client.get_model_repository_index(headers=ADMIN)
        assert {"name": "addk", "version": "1", "state": "READY"} in index
    finally:
        client.close()


def test_restriction_flags_are_validated(tmp_path: Path) -> None:
    with running_server(
        [tmp_path], ["--http-restricted-api=model-repo:a=b"], wait_ready=False
    ) as proc:
        assert proc.process.wait(60) == 2
        assert "unknown restricted api 'model-repo'" in proc.log()


# --- the gRPC interceptor, on the standard health service --------------------------------


@pytest.mark.timeout(60)
async def test_grpc_interceptor_refuses_and_accepts() -> None:
    interceptor = RestrictedProtocolInterceptor.from_rules((("health", "admin-key", "s3cret"),))
    server = grpc.aio.server(interceptors=[interceptor])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest()
            for metadata in (
                (),
                (("admin-key", "s3cret"),),
                (("triton-grpc-protocol-admin-key", "no"),),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Check(request, metadata=metadata)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert caught.value.details() == (
                    "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
                )
            # A server-streaming method is refused the same way.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.Watch(request):
                    pass
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            ok = await stub.Check(request, metadata=(("triton-grpc-protocol-admin-key", "s3cret"),))
            assert ok.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)
