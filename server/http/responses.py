"""The JSON response every HTTP route answers with (error bodies are in errors.py)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from . import codec


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(codec.encode_json(obj), status_code=status, media_type="application/json")
