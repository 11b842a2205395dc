"""One small adapter over tritonclient.http and tritonclient.grpc, so each data-plane test
runs unchanged on both protocols (the `client` fixture in conftest.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

PROTOCOLS = ("http", "grpc")

# The status each protocol reports in InferenceServerException.status() for an error kind.
_STATUS = {
    "http": {
        "INVALID_ARGUMENT": "400",
        "NOT_FOUND": "404",
        "UNAVAILABLE": "503",
        "UNIMPLEMENTED": "501",
        "INTERNAL": "500",
    },
    "grpc": {
        "INVALID_ARGUMENT": "StatusCode.INVALID_ARGUMENT",
        "NOT_FOUND": "StatusCode.NOT_FOUND",
        "UNAVAILABLE": "StatusCode.UNAVAILABLE",
        "UNIMPLEMENTED": "StatusCode.UNIMPLEMENTED",
        "INTERNAL": "StatusCode.INTERNAL",
    },
}


@dataclass
class Triton:
    """A tritonclient module, its aio twin, and a connected sync client for one protocol."""

    protocol: str
    module: ModuleType
    aio: ModuleType
    url: str
    client: Any

    @classmethod
    def connect(cls, protocol: str, server: ServerProcess) -> Triton:
        if protocol == "http":
            return cls(
                protocol,
                httpclient,
                httpclient_aio,
                server.http_url,
                httpclient.InferenceServerClient(server.http_url),
            )
        return cls(
            protocol,
            grpcclient,
            grpcclient_aio,
            server.grpc_url,
            grpcclient.InferenceServerClient(server.grpc_url),
        )

    def close(self) -> None:
        self.client.close()

    def inputs(self, tensors: Mapping[str, npt.NDArray[Any]]) -> list[Any]:
        built = []
        for name, array in tensors.items():
            tensor = self.module.InferInput(
                name, list(array.shape), np_to_triton_dtype(array.dtype)
            )
            tensor.set_data_from_numpy(array)
            built.append(tensor)
        return built

    def outputs(self, names: Sequence[str], class_count: int = 0) -> list[Any]:
        return [self.module.InferRequestedOutput(name, class_count=class_count) for name in names]

    def infer(
        self,
        model: str,
        tensors: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str] = (),
        class_count: int = 0,
        **kwargs: Any,
    ) -> Any:
        requested = self.outputs(outputs, class_count) if outputs else None
        return self.client.infer(model, self.inputs(tensors), outputs=requested, **kwargs)

    def response_parameters(self, result: Any) -> dict[str, Any]:
        """The parameters of an InferResult's response, as plain values on both protocols."""
        response = result.get_response()
        if self.protocol == "http":
            return dict(response.get("parameters", {}))
        return {
            key: getattr(value, value.WhichOneof("parameter_choice"))
            for key, value in response.parameters.items()
        }

    def aio_client(self) -> Any:
        return self.aio.InferenceServerClient(self.url)

    def status(self, kind: str) -> str:
        """What InferenceServerException.status() says for `kind` (a gRPC status name)."""
        return _STATUS[self.protocol][kind]

    def expect_error(self, exc: InferenceServerException, kind: str, text: str) -> None:
        assert exc.status() == self.status(kind), (exc.status(), exc.message())
        assert text in exc.message(), exc.message()


def decimal_strings(values: Sequence[int], shape: tuple[int, ...]) -> npt.NDArray[np.object_]:
    return np.array([str(v).encode() for v in values], dtype=np.object_).reshape(shape)


def as_ints(values: npt.NDArray[Any]) -> list[int]:
    return [int(v.decode() if isinstance(v, bytes) else v) for v in values.reshape(-1)]
