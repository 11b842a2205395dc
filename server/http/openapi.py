"""The OpenAPI document of the HTTP API, served at `/openapi.json`.

The routes are plain starlette routes (see app.py), which FastAPI's generator skips, so
each one carries what the document says about it (`ApiRoute`): its path parameters come
from the path, and its JSON body from the pydantic model the endpoint checks the body with
(bodies.py). `extend` adds them to the document FastAPI builds, which still lists any
FastAPI route an extension adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute, Route

from .bodies import ErrorBody

PATH: Final = "/openapi.json"
_REF: Final = "#/components/schemas/{model}"


@dataclass(frozen=True, slots=True)
class Body:
    """The request body of a route's POST: a JSON document and, optionally, other media
    types and header parameters (the binary tensor data extension)."""

    model: type[BaseModel]
    # False when an empty body means the defaults.
    required: bool = True
    other_content: Mapping[str, Any] = field(default_factory=dict)
    headers: tuple[Mapping[str, Any], ...] = ()


class ApiRoute(Route):
    """A starlette route with what the OpenAPI document says about it."""

    def __init__(
        self,
        path: str,
        endpoint: Any,
        *,
        methods: list[str],
        body: Body | None = None,
        error: type[BaseModel] = ErrorBody,
    ) -> None:
        super().__init__(path, endpoint, methods=methods)
        self.body = body
        # The body of its error answers (the /v1 routes answer with OpenAI's).
        self.error = error


def extend(document: dict[str, Any], routes: Iterable[BaseRoute]) -> dict[str, Any]:
    """Add every `ApiRoute` to `document` (FastAPI's, from `app.openapi()`), in place."""
    api_routes = [route for route in routes if isinstance(route, ApiRoute)]
    models = {route.error for route in api_routes}
    models |= {ErrorBody} | {route.body.model for route in api_routes if route.body}
    refs, schemas = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template=_REF,
    )
    components = document.setdefault("components", {}).setdefault("schemas", {})
    components.update(schemas.get("$defs", {}))
    paths = document.setdefault("paths", {})
    for route in api_routes:
        item = paths.setdefault(route.path, {})
        for method in sorted((route.methods or set()) - {"HEAD"}):
            operation = _operation(route, refs[(route.error, "validation")])
            if method == "POST" and route.body is not None:
                schema = refs[(route.body.model, "validation")]
                _add_body(operation, route.body, schema)
            item[method.lower()] = operation
    return document


def _operation(route: ApiRoute, error: dict[str, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": route.name.replace("_", " ").capitalize(),
        "responses": {
            "200": {"description": "Success"},
            "default": {
                "description": "An error",
                "content": {"application/json": {"schema": error}},
            },
        },
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in route.param_convertors
    ]
    if parameters:
        operation["parameters"] = parameters
    return operation


def _add_body(operation: dict[str, Any], body: Body, schema: dict[str, Any]) -> None:
    operation["requestBody"] = {
        "required": body.required,
        "content": {"application/json": {"schema": schema}, **body.other_content},
    }
    if body.headers:
        operation.setdefault("parameters", []).extend(body.headers)
