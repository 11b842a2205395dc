"""Triton's SageMaker and Vertex AI flags (command_line_parser.cc), and the environment
variables that set their defaults, read in Triton's words.

The flags are one recorded setting (`Settings.cloud`), read here into `CloudSettings`,
so that each keeps Triton's parse (ParseOption<bool>, <int>, the `<int>-<int>` pair) and
its errors. The Vertex AI environment acts as in Triton: `AIP_MODE=PREDICTION` turns the
Vertex AI endpoint on and HTTP and gRPC off unless the command line says otherwise,
`AIP_HTTP_PORT` is the Vertex AI port's default, and `AIP_STORAGE_URI` is the model
repository when no `--model-repository` is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ge_serve.backends import text_bool

from .flags import Flag, flag
from .tritonflags import stoi

SAGEMAKER: Final = "SageMaker"
VERTEX_AI: Final = "Vertex AI"

_FLAGS: Final = (
    "--allow-sagemaker",
    "--sagemaker-port",
    "--sagemaker-safe-port-range",
    "--allow-vertex-ai",
    "--vertex-ai-port",
    "--vertex-ai-default-model",
)
_REPOSITORY_FLAGS: Final = ("--model-repository", "--model-repo", "--model-store")


@dataclass(frozen=True, slots=True)
class CloudSettings:
    allow_sagemaker: bool = False
    sagemaker_port: int = 8080
    # --sagemaker-safe-port-range: the ports the other endpoints may use.
    sagemaker_safe_range: tuple[int, int] | None = None
    allow_vertex_ai: bool = False
    vertex_ai_port: int = 8080
    vertex_ai_default_model: str = ""


def cloud_flag() -> Mapping[str, Flag]:
    return flag(
        *_FLAGS,
        record_flag=True,
        check=_read,
        metavar="VALUE",
        help="Triton's SageMaker and Vertex AI endpoints (see docs/deploying.md)",
        group="SageMaker and Vertex AI",
    )


def triton_bool(text: str) -> bool:
    """Triton's ParseOption<bool>."""
    return text_bool.triton_bool(text, "invalid value for bool option: {text}")


def _pair(text: str) -> tuple[int, int]:
    """Triton's ParsePairOption<int, int>(text, "-")."""
    first, dash, second = text.partition("-")
    if not dash:
        raise ValueError(
            "Cannot parse pair option due to incorrect number of inputs.--<pair option> "
            f"argument requires format <first>-<second>. Found: {text}"
        )
    return stoi(first), stoi(second)


def _read(_name: str, given: Sequence[tuple[str, str]]) -> CloudSettings:
    """The recorded (flag, value) pairs, in order, as CloudSettings (the last wins)."""
    values: dict[str, object] = {"vertex_ai_port": stoi(os.environ.get("AIP_HTTP_PORT", "8080"))}
    for name, value in given:
        key = name.removeprefix("--").replace("-", "_")
        if name.startswith("--allow-"):
            values[key] = triton_bool(value)
        elif name == "--sagemaker-safe-port-range":
            values["sagemaker_safe_range"] = _pair(value)
        elif name.endswith("-port"):
            values[key] = stoi(value)
        else:
            values[key] = value
    return CloudSettings(**values)  # type: ignore[arg-type]


def environment_argv(argv: list[str], environ: Mapping[str, str]) -> list[str]:
    """`argv` with the defaults the Vertex AI environment sets put first, so that what the
    command line says wins, as in Triton."""
    first: list[str] = []
    if environ.get("AIP_MODE", "") == "PREDICTION":
        first += ["--allow-vertex-ai=true", "--allow-http=false", "--allow-grpc=false"]
    storage = environ.get("AIP_STORAGE_URI", "")
    if storage and not any(_names_flag(arg, _REPOSITORY_FLAGS) for arg in argv):
        first.append(f"--model-repository={storage}")
    return first + argv


def _names_flag(arg: str, names: Iterable[str]) -> bool:
    return any(arg == name or arg.startswith(name + "=") for name in names)
