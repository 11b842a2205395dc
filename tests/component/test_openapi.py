"""The OpenAPI document at /openapi.json, and the pydantic models behind it.

In process (httpx over ASGI): the document lists every route of the HTTP API, the
control-plane bodies with the schemas of the models that check them, and the infer route
with the KServe v2 request schema; a body the model refuses is a 400 `{"error": ...}` in
the wording clients know, never FastAPI's 422 `{"detail": ...}`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from modelgen import make_lifecycle
from openapi_spec_validator import validate
from starlette.routing import Route

from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import DataType

pytestmark = pytest.mark.asyncio(loop_scope="module")

SCHEMAS = "#/components/schemas/"


@contextlib.asynccontextmanager
async def front_end(repo: Path) -> AsyncIterator[HttpFrontEnd]:
    lifecycle = make_lifecycle(repo)
    try:
        yield HttpFrontEnd(
            InferenceServer(lifecycle), HttpSettings(max_input_size=1 << 20, restricted_api=())
        )
    finally:
        await lifecycle.close()


@contextlib.asynccontextmanager
async def client_of(front: HttpFrontEnd) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=front.build())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def front(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HttpFrontEnd]:
    """One front end for the module: building it and its document is the costly part, and
    its tests read the document or send bodies it refuses (test_accepted_bodies, which
    changes the log settings, has a front end of its own)."""
    async with front_end(tmp_path_factory.mktemp("openapi")) as built:
        yield built


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(front: HttpFrontEnd) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(front) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def document(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    doc: dict[str, Any] = response.json()
    return doc


def body_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The component schema of a path's POST JSON body."""
    body = doc["paths"][path]["post"]["requestBody"]
    ref: str = body["content"]["application/json"]["schema"]["$ref"]
    assert ref.startswith(SCHEMAS)
    schema: dict[str, Any] = doc["components"]["schemas"][ref.removeprefix(SCHEMAS)]
    return schema


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return resolve(doc, doc["components"]["schemas"][schema["$ref"].removeprefix(SCHEMAS)])
    return schema


async def test_the_document_is_valid_openapi_and_lists_every_route(
    front: HttpFrontEnd, document: dict[str, Any]
) -> None:
    validate(document)
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"] == "ge-serve"
    routes = {
        (route.path, method.lower())
        for route in front.routes()
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    listed = {(path, method) for path, item in document["paths"].items() for method in item}
    assert listed == routes
    for path, item in document["paths"].items():
        for operation in item.values():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == {part[1:-1] for part in path.split("/") if part.startswith("{")}
            error = operation["responses"]["default"]["content"]["application/json"]["schema"]
            # Every error object has `error` (Anthropic's, on /v1/messages, `type` too).
            required = ["type", "error"] if path.startswith("/v1/messages") else ["error"]
            assert resolve(document, error)["required"] == required


async def test_control_plane_bodies_have_their_schemas(document: dict[str, Any]) -> None:
    index = body_schema(document, "/v2/repository/index")
    assert index["properties"]["ready"]["type"] == "boolean"
    assert document["paths"]["/v2/repository/index"]["post"]["requestBody"]["required"] is False

    load = body_schema(document, "/v2/repository/models/{model}/load")
    params = resolve(document, load["properties"]["parameters"])
    assert params["properties"]["config"]["type"] == "string"
    assert "default" not in params["properties"]["config"]
    assert params["patternProperties"]["^file:"]["contentEncoding"] == "base64"

    unload = body_schema(document, "/v2/repository/models/{model}/unload")
    params = resolve(document, unload["properties"]["parameters"])
    assert params["properties"]["unload_dependents"]["type"] == "boolean"

    register = body_schema(document, "/v2/systemsharedmemory/region/{region}/register")
    assert sorted(register["required"]) == ["byte_size", "key"]
    assert register["properties"]["key"]["type"] == "string"
    for count in ("offset", "byte_size"):
        assert (
            register["properties"][count] | {"type": "integer", "minimum": 0}
            == (register["properties"][count])
        )
    assert document["paths"]["/v2/systemsharedmemory/region/{region}/register"]["post"][
        "requestBody"
    ]["required"]

    logging = body_schema(document, "/v2/logging")
    assert logging["additionalProperties"] is False
    assert logging["properties"]["log_format"]["enum"] == ["default", "ISO8601"]
    assert logging["properties"]["log_verbose_level"]["minimum"] == 0
    assert {"log_info", "log_warning", "log_error", "log_file"} <= set(logging["properties"])
    assert set(document["paths"]["/v2/logging"]) == {"get", "post"}
    assert "requestBody" not in document["paths"]["/v2/logging"]["get"]


@pytest.mark.parametrize(
    "path", ["/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"]
)
async def test_the_infer_route_has_the_kserve_request_schema(
    document: dict[str, Any], path: str
) -> None:
    request = body_schema(document, path)
    assert request["required"] == ["inputs"]
    tensor = resolve(document, request["properties"]["inputs"]["items"])
    assert set(tensor["required"]) == {"name", "shape", "datatype"}
    assert tensor["properties"]["shape"]["items"] == {"type": "integer", "minimum": 0}
    datatype = resolve(document, tensor["properties"]["datatype"])
    assert datatype["enum"] == [d.value for d in DataType]
    output = resolve(document, request["properties"]["outputs"]["anyOf"][0]["items"])
    assert output["required"] == ["name"]
    operation = document["paths"][path]["post"]
    assert "application/octet-stream" in operation["requestBody"]["content"]
    headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
    assert "Inference-Header-Content-Length" in headers


async def test_the_document_path_does_not_shadow_a_model(http: httpx.AsyncClient) -> None:
    response = await http.get("/v2/models/openapi.json")
    assert response.status_code == 404
    assert "openapi.json" in response.json()["error"]


# --- the models check the bodies, in the wording clients know ----------------------------------

BAD_BODIES = [
    ("/v2/repository/index", b'{"ready": "yes"}', "Invalid value for 'ready': expected a boolean"),
    ("/v2/repository/index", b'{"ready": 1}', "Invalid value for 'ready': expected a boolean"),
    ("/v2/repository/index", b"[]", "the repository index request JSON must be an object"),
    (
        "/v2/repository/models/m/load",
        b'{"parameters": []}',
        "'parameters' of the load request must be an object",
    ),
    (
        "/v2/repository/models/m/load",
        b'{"parameters": {"config": 5}}',
        "load parameter 'config' must be a JSON string",
    ),
    (
        "/v2/repository/models/m/load",
        b'{"parameters": {"config": "{}", "file:1/{x}.onnx": 7}}',
        "load parameter 'file:1/{x}.onnx' must be a base64 string",
    ),
    (
        "/v2/repository/models/m/load",
        b'{"parameters": {"config": "{}", "file:1/m.onnx": "%%"}}',
        "load parameter 'file:1/m.onnx' is not valid base64",
    ),
    (
        "/v2/repository/models/m/unload",
        b'{"parameters": {"unload_dependents": "yes"}}',
        "unload parameter 'unload_dependents' must be a boolean",
    ),
    (
        "/v2/repository/models/m/unload",
        b'{"parameters": 3}',
        "'parameters' of the unload request must be an object",
    ),
    (
        "/v2/systemsharedmemory/region/r/register",
        b'{"byte_size": 8}',
        "Shared memory register request has no 'key' field",
    ),
    (
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": 5}',
        "Shared memory register request has no 'byte_size' field",
    ),
    (
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": 5, "byte_size": 8}',
        "'key' of the register request must be a string",
    ),
    (
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": "/k", "byte_size": 8, "offset": -1}',
        "'offset' of the register request must be a non-negative integer",
    ),
    (
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": "/k", "byte_size": 8.0}',
        "'byte_size' of the register request must be a non-negative integer",
    ),
    (
        "/v2/systemsharedmemory/region/r/register",
        b"",
        "failed to parse the shared memory register request JSON buffer",
    ),
    ("/v2/logging", b'{"log_info": "no"}', "expect boolean for 'log_info' setting"),
    (
        "/v2/logging",
        b'{"log_verbose_level": -1}',
        "expect unsigned integer for 'log_verbose_level' setting",
    ),
    (
        "/v2/logging",
        b'{"log_verbose_level": 4294967296}',
        "expect unsigned integer for 'log_verbose_level' setting",
    ),
    (
        "/v2/logging",
        b'{"log_format": "{fancy}"}',
        "invalid 'log_format' setting '{fancy}': expected one of 'default', 'ISO8601'",
    ),
    (
        "/v2/logging",
        b'{"log_colour": true}',
        "unknown log setting 'log_colour': expected one of 'log_file', 'log_info', "
        "'log_warning', 'log_error', 'log_verbose_level', 'log_format'",
    ),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_BODIES)
async def test_a_refused_body_is_a_400_error_in_our_words(
    http: httpx.AsyncClient, path: str, body: bytes, message: str
) -> None:
    response = await http.post(path, content=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert list(error) == ["error"]
    assert error["error"].startswith(message)


@pytest.mark.parametrize("body", [b'{"log_file": "/tmp/x"}', b'{"log_file": ""}'])
async def test_a_log_file_update_is_unsupported_in_tritons_words(
    http: httpx.AsyncClient, body: bytes
) -> None:
    # Triton refuses any log_file, the current one too, as unsupported (501).
    response = await http.post("/v2/logging", content=body)
    assert response.status_code == 501, response.text
    assert response.json() == {
        "error": "log file location can not be updated through network protocol"
    }
    # A null is refused as for every log setting (docs/reference.md, deliberate differences).
    response = await http.post("/v2/logging", content=b'{"log_file": null}')
    assert response.status_code == 400 and "log_file" in response.json()["error"]


async def test_accepted_bodies(tmp_path: Path) -> None:
    # A front end of its own: the test changes its log settings.
    async with front_end(tmp_path) as front, client_of(front) as http:
        assert (await http.post("/v2/repository/index", content=b"")).json() == []
        assert (await http.post("/v2/repository/index", json={"ready": True, "x": 1})).json() == []
        changed = await http.post("/v2/logging", json={"log_verbose_level": 2})
        assert changed.status_code == 200 and changed.json()["log_verbose_level"] == 2
        assert (await http.get("/v2/logging")).json()["log_verbose_level"] == 2
        # Valid bodies reach the core, which has no model control here.
        unload = await http.post("/v2/repository/models/m/unload", content=b"")
        assert unload.status_code == 503 and "error" in unload.json()


async def test_the_openai_routes_have_their_bodies_and_openai_errors(
    document: dict[str, Any],
) -> None:
    chat = body_schema(document, "/v1/chat/completions")
    # `model` optional, as vLLM's: the one generative model the server serves.
    assert chat["required"] == ["messages"]
    assert {"type": "null"} in chat["properties"]["model"]["anyOf"]
    assert chat["properties"]["temperature"]["anyOf"][0]["maximum"] == 2.0
    # vLLM's batch chat: a list of conversations, each a list of messages.
    batch = body_schema(document, "/v1/chat/completions/batch")
    assert batch["required"] == ["messages"]
    conversation = batch["properties"]["messages"]["items"]
    assert conversation["type"] == "array" and conversation["minItems"] == 1
    # `input` or vLLM's chat form `messages`.
    embeddings = body_schema(document, "/v1/embeddings")
    assert {"input", "messages"} <= set(embeddings["properties"])
    assert "task" in body_schema(document, "/pooling")["properties"]
    assert body_schema(document, "/v1/completions")["required"] == ["prompt"]
    assert body_schema(document, "/v1/responses")["required"] == ["input"]
    # vLLM's type for the thinking budget: integer or null.
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        budget = body_schema(document, path)["properties"]["thinking_token_budget"]
        assert budget["anyOf"] == [{"type": "integer"}, {"type": "null"}], path
    for path, method in (("/v1/models", "get"), ("/v1/chat/completions", "post")):
        responses = document["paths"][path][method]["responses"]
        error = resolve(document, responses["default"]["content"]["application/json"]["schema"])
        detail = resolve(document, error["properties"]["error"])
        assert sorted(detail["required"]) == ["code", "message", "param", "type"]
