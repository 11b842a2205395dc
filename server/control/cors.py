"""Which cross-origin requests the HTTP front end answers: vLLM's `--allowed-origins`,
`--allowed-methods`, `--allowed-headers` and `--allow-credentials`, as the command line
reads them (startup/corsflags.py) and the front end applies them (http/cors.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CorsSettings:
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False

    @property
    def on(self) -> bool:
        """Whether any origin is allowed: without one, nothing of CORS is installed."""
        return bool(self.allowed_origins)
