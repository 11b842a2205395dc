"""What vLLM's flags add to every HTTP answer: CORS (cors.py) and request ids
(requestid.py), applied once to each request. Without HTTP workers the server's front end
applies them; with workers, the worker that accepted the connection does, around its own
inference and what it passes on, and the internal front end the workers pass requests on
to is built without them (so no answer gets a second `X-Request-Id` or `Vary`). Both are
stateless and hold no secret, so a worker keeps answering inference itself while they are
on; `--api-key` and `--http-restricted-api`, which must see every request, stay in the
server."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.types import ASGIApp

from ge_serve.server.control.cors import CorsSettings

from .cors import with_cors
from .requestid import RequestIdHeaders


@dataclass(frozen=True, slots=True)
class Marks:
    cors: CorsSettings = field(default_factory=CorsSettings)
    request_ids: bool = False

    def apply(self, app: ASGIApp) -> ASGIApp:
        app = with_cors(app, self.cors)
        return RequestIdHeaders(app) if self.request_ids else app

    def to_json(self) -> dict[str, Any]:
        """The marks as a worker's JSON configuration carries them."""
        return {"cors": asdict(self.cors), "request_ids": self.request_ids}

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> Marks:
        cors = found["cors"]
        return cls(
            CorsSettings(
                allowed_origins=tuple(cors["allowed_origins"]),
                allowed_methods=tuple(cors["allowed_methods"]),
                allowed_headers=tuple(cors["allowed_headers"]),
                allow_credentials=bool(cors["allow_credentials"]),
            ),
            bool(found["request_ids"]),
        )
