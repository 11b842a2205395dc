"""vLLM's `--api-key` (or VLLM_API_KEY): its routes need one of the server's keys.

vLLM's AuthenticationMiddleware (entrypoints/serve/middleware/authenticate.py) guards
every path under `/v1`, `/v2`, `/inference` and `/cohere`, skips OPTIONS (CORS
preflights), and takes `Authorization: Bearer <key>`, compared in constant time. Here:

- The same prefixes, as they exist in ge-serve (`GUARDED`): `/v1` and KServe's
  `/openai/v1`, vLLM's `/v2/rerank` and `/v2/embed`, and `/inference`, `/cohere`. Not
  Triton's KServe v2 protocol (`/v2/models...`, `/v2/health...`, `/v2/repository...`),
  whose clients keep Triton's `--http-restricted-api`; nor vLLM's routes outside those
  prefixes (`/tokenize`, `/score`, `/rerank`, `/pooling`, `/health`), as in vLLM.
- `x-api-key: <key>` is taken too (Anthropic's header, which litellm and curl users of
  Anthropic's API send; Anthropic's SDK sends the Bearer form), a deliberate widening.
- A refusal is a 401 in the route's own error shape (OpenAI's error object on `/v1`,
  Anthropic's on `/v1/messages`), as `--http-restricted-api` refuses there
  (restricted.py); vLLM's body is `{"error": "Unauthorized"}`.

Behind `--root-path`, a path is checked as the route it reaches (rootpath.py): vLLM's
middleware takes the root path off first too. Installed only with a key, inside the
FastAPI application: the v2 inference shortcut
(infer.py), in front of it, never reaches it. HTTP workers pass every other request on to
this process's front end (passon.py), so the check runs here for them too, and the keys
never leave this process.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from typing import Final

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import error_response
from .openai.errors import OpenAIError, is_anthropic_path, is_openai_path
from .rootpath import route_path

# A path guarded with its prefix whole: `/v1` and `/v1/...`, not `/v1x`.
GUARDED: Final = re.compile(r"/(?:openai/)?v1|/v2/(?:rerank|embed)|/inference|/cohere")
MESSAGE: Final = (
    "Invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
)
_AUTHORIZATION: Final = b"authorization"
_X_API_KEY: Final = b"x-api-key"


def guarded(path: str) -> bool:
    """Whether `path` needs a key."""
    match = GUARDED.match(path)
    return match is not None and path[match.end() : match.end() + 1] in ("", "/")


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class ApiKeys:
    """The server's keys, kept as digests: a comparison takes the same time whatever the
    key given and however much of it is right."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(key.encode("utf-8")) for key in keys)

    def admits(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the first `Authorization: Bearer` or `x-api-key` header carries a key
        (ASGI's raw headers: lower-case names)."""
        bearer: bytes | None = None
        api_key: bytes | None = None
        for name, value in headers:
            if name == _AUTHORIZATION and bearer is None:
                scheme, _, bearer = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    bearer = b""  # never a key's digest's match: keys are not empty
            elif name == _X_API_KEY and api_key is None:
                api_key = value
        found = False
        for given in (bearer, api_key):
            if given:
                digest = _digest(given)
                for known in self._digests:
                    found |= secrets.compare_digest(digest, known)
        return found


def refusal(path: str) -> Response:
    """The 401, in the error shape of `path`."""
    if is_openai_path(path):
        refused = OpenAIError(
            MESSAGE, status=401, kind="authentication_error", code="invalid_api_key"
        )
        return refused.response(is_anthropic_path(path))
    return error_response(401, MESSAGE)


class ApiKeyMiddleware:
    """Pure ASGI: a guarded path without a key is refused before anything reads it."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] != "OPTIONS"
            and guarded(path := route_path(scope))
            and not self.keys.admits(scope["headers"])
        ):
            await refusal(path)(scope, receive, send)
            return
        await self.app(scope, receive, send)
