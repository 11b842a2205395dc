"""Restricted APIs, as Triton's `--http-restricted-api` / `--grpc-restricted-protocol`.

Each rule `<category>[,<category>...]:<header>=<value>` puts API categories behind a
header that must carry an exact value. Nothing here knows HTTP or gRPC beyond the category
of each route or method and the two refusal messages; each front end calls `refusal()`
once per request.

Triton's facts (docs/customization_guide/inference_protocols.md, src/http_server.cc,
src/grpc/grpc_handler.h):
- HTTP checks the header `<header>` and answers 403 with
  `{"error": "This API is restricted, expecting header '<header>'"}`.
- gRPC checks the metadata key `triton-grpc-protocol-<header>` and answers UNAVAILABLE
  with "This protocol is restricted, expecting header 'triton-grpc-protocol-<header>'".
- A category may appear in one rule only. A bad flag stops the start-up with Triton's
  words (src/command_line_parser.cc), where the HTTP flag names an "api" and the gRPC
  flag a "protocol".
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# gRPC method (the last part of `/inference.GRPCInferenceService/<Method>`) -> category.
GRPC_METHOD_CATEGORY = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
    # grpc.health.v1.Health is part of `health` in Triton.
    "Check": "health",
    "Watch": "health",
}

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
# HTTP (method, path) patterns -> category, first match wins. Unknown paths have none.
_HTTP_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), category)
    for pattern, category in (
        (r"/v2/health/(?:live|ready)", "health"),
        (r"/v2/models/stats", "statistics"),
        # vLLM's server load (http/openai/serverload.py): a figure about the server.
        (r"/load", "statistics"),
        (_MODEL + r"/ready", "health"),
        (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
        (_MODEL + r"/config", "model-config"),
        (_MODEL + r"/stats", "statistics"),
        (_MODEL + r"/trace/setting", "trace"),
        (r"/v2/trace/setting", "trace"),
        (r"/v2/logging", "logging"),
        (r"/v2/repository/.*", "model-repository"),
        (r"/v2/(?:system|cuda)sharedmemory(?:/.*)?", "shared-memory"),
        (r"/v2", "metadata"),
        (_MODEL, "metadata"),
        # The OpenAI-compatible API (ge-serve's own; Triton serves it from another process),
        # also under KServe's prefix, /openai/v1 (the same routes: the same categories).
        # vLLM's batch chat, /v1/chat/completions/batch, with them.
        (r"(?:/openai)?/v1/(?:chat/completions(?:/batch)?|completions|embeddings)", "inference"),
        # The Responses API, and vLLM's retrieve and cancel of a stored response.
        (r"(?:/openai)?/v1/responses(?:/[^/]+(?:/cancel)?)?", "inference"),
        # Anthropic's Messages API, on the chat path: chat's category.
        (r"(?:/openai)?/v1/messages(?:/count_tokens)?", "inference"),
        # vLLM's tokenizer routes: a model's work, as its inference is.
        (r"/(?:tokenize|detokenize|tokenizer_info)", "inference"),
        # vLLM's scoring routes (also under /openai/v1, as every /v1 route), its pooling
        # route, and Cohere's embed route (/v1/embeddings' category).
        (
            r"(?:/openai)?/v1/(?:score|rerank)|/(?:score|rerank|pooling)|/v2/(?:rerank|embed)",
            "inference",
        ),
        # vLLM's SageMaker route on its own port (http/openai/invocations.py).
        (r"/invocations", "inference"),
        # Triton's OpenAI front end puts its load and unload routes here too.
        (r"(?:/openai)?/v1/models/[^/]+/(?:load|unload)", "model-repository"),
        (r"(?:/openai)?/v1/models(?:/[^/]+)?", "metadata"),
        # Triton's OpenAI front end's readiness route, in its category there, and vLLM's
        # health route beside it.
        (r"/health(?:/ready)?|/ping", "health"),
        # vLLM's version route: the server's, as /v2's metadata.
        (r"/version", "metadata"),
        # KServe v1's liveness route (app.py).
        (r"/", "health"),
    )
)


def http_category(path: str) -> str | None:
    """The restricted-API category of an HTTP path, or None when it has none."""
    path = path.rstrip("/") or "/"
    for pattern, category in _HTTP_RULES:
        if pattern.fullmatch(path):
            return category
    return None


def grpc_category(method: str) -> str | None:
    """The category of a gRPC method, from its full name or its bare name."""
    return GRPC_METHOD_CATEGORY.get(method.rsplit("/", 1)[-1])


@dataclass(frozen=True, slots=True)
class Restriction:
    header: str  # lower case, as headers are looked up
    value: str
    shown: str  # as the flag wrote it, as Triton's refusal names it


class RestrictedApis:
    """Which categories need which header; `header_prefix` is "" for HTTP and
    `GRPC_HEADER_PREFIX` for gRPC."""

    def __init__(self, rules: Iterable[tuple[str, str, str]], header_prefix: str = "") -> None:
        self.rules: dict[str, Restriction] = {}
        kind = "protocol" if header_prefix == GRPC_HEADER_PREFIX else "api"
        for category, header, value in rules:
            if category not in CATEGORIES:
                raise ValueError(f"unknown restricted {kind} '{category}'")
            if category in self.rules:
                raise ValueError(
                    f"restricted {kind} '{category}' can not be specified in multiple config groups"
                )
            if not header:
                raise ValueError(f"restricted API category '{category}' names no header")
            named = header_prefix + header
            self.rules[category] = Restriction(named.lower(), value, named)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def refusal(self, category: str | None, headers: Mapping[str, str]) -> str | None:
        """None when the call may proceed; else the header it lacks, as the flag wrote it.

        `headers` must be keyed by lower-case names (starlette's Headers and gRPC
        metadata both are).
        """
        if category is None:
            return None
        rule = self.rules.get(category)
        if rule is None:
            return None
        given = headers.get(rule.header)
        if given is not None and hmac.compare_digest(given.encode(), rule.value.encode()):
            return None
        return rule.shown


def http_refusal_message(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


def grpc_refusal_message(header: str) -> str:
    return f"This protocol is restricted, expecting header '{header}'"
