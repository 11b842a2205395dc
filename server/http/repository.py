"""Decoding the model repository extension's load and unload request bodies."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from ge_serve.server.control import FILE_PREFIX
from ge_serve.server.errors import ErrorCode, ServerError

from . import codec


@dataclass(slots=True)
class LoadRequest:
    config: str | None = None
    # `<version>/<name>` -> decoded content
    files: dict[str, bytes] = field(default_factory=dict)


def _parameters(body: bytes, what: str) -> dict[str, Any]:
    if not body.strip():
        return {}
    request = codec.decode_json_object(body, what)
    params = request.get("parameters", {})
    if not isinstance(params, dict):
        raise ServerError(ErrorCode.INVALID_ARG, f"'parameters' of the {what} must be an object")
    return params


def decode_load(body: bytes) -> LoadRequest:
    """`{"parameters": {"config": "<json>", "file:<v>/<name>": "<base64>"}}`, all optional."""
    load = LoadRequest()
    for key, value in _parameters(body, "load request").items():
        if key == "config":
            if not isinstance(value, str):
                raise ServerError(
                    ErrorCode.INVALID_ARG, "load parameter 'config' must be a JSON string"
                )
            load.config = value
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, str):
                raise ServerError(
                    ErrorCode.INVALID_ARG, f"load parameter '{key}' must be a base64 string"
                )
            try:
                content = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ServerError(
                    ErrorCode.INVALID_ARG, f"load parameter '{key}' is not valid base64"
                ) from None
            load.files[key[len(FILE_PREFIX) :]] = content
    return load


def decode_unload(body: bytes) -> bool:
    """`{"parameters": {"unload_dependents": bool}}`; returns unload_dependents."""
    flag = _parameters(body, "unload request").get("unload_dependents", False)
    if not isinstance(flag, bool):
        raise ServerError(
            ErrorCode.INVALID_ARG, "unload parameter 'unload_dependents' must be a boolean"
        )
    return flag
