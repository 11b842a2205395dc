"""The catalogue of invalid requests: each one the server must refuse with a 4xx over HTTP,
or INVALID_ARGUMENT / NOT_FOUND over gRPC."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from ge_serve.protos import grpc_service_pb2 as pb

from .calls import HEADER_LENGTH, U32, GrpcCall, HttpCall

# Small enough that an oversized body costs little to send; far above any valid request.
# The soak starts the server with this as --http-max-input-size.
HTTP_MAX_INPUT: Final = 256 * 1024


def _json_body(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _json_input(name: str, data: list[Any], shape: list[int], dtype: str = "INT32") -> Any:
    return {"name": name, "shape": shape, "datatype": dtype, "data": data}


def _good_inputs() -> list[dict[str, Any]]:
    return [
        _json_input("INPUT0", list(range(16)), [1, 16]),
        _json_input("INPUT1", [1] * 16, [1, 16]),
    ]


def _with_input0(replacement: dict[str, Any]) -> bytes:
    return _json_body([replacement, _good_inputs()[1]])


def _binary_body(entries: list[tuple[str, str, list[int], bytes]]) -> tuple[bytes, int]:
    header = {
        "inputs": [
            {"name": n, "shape": s, "datatype": d, "parameters": {"binary_data_size": len(raw)}}
            for n, d, s, raw in entries
        ]
    }
    head = json.dumps(header).encode()
    return head + b"".join(raw for *_, raw in entries), len(head)


def _binary_call(body: bytes, length: int | str, model: str = "simple") -> HttpCall:
    return HttpCall("POST", f"/v2/models/{model}/infer", body, ((HEADER_LENGTH, str(length)),))


def http_invalid_cases() -> dict[str, HttpCall]:
    """Requests the server must refuse with a 4xx: name -> request."""
    infer = "/v2/models/simple/infer"
    good = _json_body(_good_inputs())
    ints = np.arange(16, dtype="<i4").tobytes()
    binary, length = _binary_body(
        [("INPUT0", "INT32", [1, 16], ints), ("INPUT1", "INT32", [1, 16], ints)]
    )
    short, short_length = _binary_body(
        [("INPUT0", "INT32", [1, 16], ints[:-4]), ("INPUT1", "INT32", [1, 16], ints)]
    )
    ones = b"".join(U32.pack(1) + b"1" for _ in range(16))
    overrun, overrun_length = _binary_body(
        [
            ("INPUT0", "BYTES", [1, 16], U32.pack(1000) + b"12"),
            ("INPUT1", "BYTES", [1, 16], ones),
        ]
    )

    def post(body: bytes, path: str = infer, *headers: tuple[str, str]) -> HttpCall:
        return HttpCall("POST", path, body, headers)

    return {
        "unknown_model": post(good, "/v2/models/nope/infer"),
        "unknown_version": post(good, "/v2/models/simple/versions/7/infer"),
        "version_not_a_number": post(good, "/v2/models/simple/versions/abc/infer"),
        "bad_json": post(b'{"inputs": ['),
        "json_array": post(b"[1, 2]"),
        "no_inputs": post(b"{}"),
        "wrong_shape": post(_with_input0(_json_input("INPUT0", list(range(8)), [1, 8]))),
        "wrong_dtype": post(_with_input0(_json_input("INPUT0", [0.5] * 16, [1, 16], "FP32"))),
        "unknown_dtype": post(_with_input0(_json_input("INPUT0", [0] * 16, [1, 16], "INT128"))),
        "count_mismatch": post(_with_input0(_json_input("INPUT0", list(range(15)), [1, 16]))),
        "out_of_range": post(_with_input0(_json_input("INPUT0", [2**40] * 16, [1, 16]))),
        "strings_for_ints": post(_with_input0(_json_input("INPUT0", ["a"] * 16, [1, 16]))),
        "oversized_shape": post(_with_input0(_json_input("INPUT0", [0] * 16, [1, 2**40]))),
        "negative_dim": post(_with_input0(_json_input("INPUT0", [0] * 16, [-1, 16]))),
        "batch_over_max": post(
            _json_body(
                [
                    _json_input("INPUT0", [0] * 144, [9, 16]),
                    _json_input("INPUT1", [0] * 144, [9, 16]),
                ]
            )
        ),
        "missing_input": post(_json_body(_good_inputs()[:1])),
        "unknown_output": post(_json_body(_good_inputs(), outputs=[{"name": "OUTPUT7"}])),
        "bad_priority": post(_json_body(_good_inputs(), parameters={"priority": "high"})),
        "truncated_binary": _binary_call(binary[:-10], length),
        "header_length_past_body": _binary_call(binary, len(binary) + 10),
        "header_length_not_a_number": _binary_call(binary, "12abc"),
        "binary_size_mismatch": _binary_call(short, short_length),
        "bytes_prefix_overrun": _binary_call(overrun, overrun_length, "simple_string"),
        "bad_gzip": post(b"this is not gzip", infer, ("Content-Encoding", "gzip")),
        "gzip_bomb": post(
            gzip.compress(b" " * (4 * HTTP_MAX_INPUT)), infer, ("Content-Encoding", "gzip")
        ),
        "oversized_body": post(b" " * (HTTP_MAX_INPUT + 1024)),
        "load_unknown_model": post(b"", "/v2/repository/models/nope/load"),
        "index_bad_json": post(b'{"ready": ', "/v2/repository/index"),
        "metadata_unknown_model": HttpCall("GET", "/v2/models/nope"),
    }


def grpc_invalid_cases() -> dict[str, GrpcCall]:
    """Requests the server must refuse with INVALID_ARGUMENT or NOT_FOUND: name -> request."""
    ints = np.arange(16, dtype="<i4").tobytes()

    def infer(
        model: str = "simple",
        inputs: Sequence[tuple[str, str, list[int]]] = (
            ("INPUT0", "INT32", [1, 16]),
            ("INPUT1", "INT32", [1, 16]),
        ),
        raw: Sequence[bytes] = (ints, ints),
        version: str = "",
        outputs: Sequence[str] = (),
    ) -> GrpcCall:
        request = pb.ModelInferRequest(model_name=model, model_version=version)
        for name, dtype, shape in inputs:
            request.inputs.add(name=name, datatype=dtype, shape=shape)
        request.raw_input_contents.extend(raw)
        for name in outputs:
            request.outputs.add(name=name)
        return GrpcCall("ModelInfer", request)

    def typed(fill: Callable[[pb.InferTensorContents], None]) -> GrpcCall:
        call = infer(raw=())
        request = call.request
        fill(request.inputs[0].contents)
        request.inputs[1].contents.int_contents.extend(range(16))
        return call

    mixed = infer()
    mixed.request.inputs[0].contents.int_contents.extend(range(16))
    ones = b"".join(U32.pack(1) + b"1" for _ in range(16))
    strings = (("INPUT0", "BYTES", [1, 16]), ("INPUT1", "BYTES", [1, 16]))
    return {
        "unknown_model": infer(model="nope"),
        "empty_model_name": infer(model=""),
        "unknown_version": infer(version="7"),
        "version_not_a_number": infer(version="abc"),
        "raw_wrong_size": infer(raw=(ints[:-4], ints)),
        "raw_count_mismatch": infer(raw=(ints,)),
        "wrong_dtype": infer(inputs=(("INPUT0", "FP32", [1, 16]), ("INPUT1", "INT32", [1, 16]))),
        "unknown_dtype": infer(
            inputs=(("INPUT0", "INT128", [1, 16]), ("INPUT1", "INT32", [1, 16]))
        ),
        "wrong_shape": infer(
            inputs=(("INPUT0", "INT32", [1, 8]), ("INPUT1", "INT32", [1, 16])),
            raw=(ints[:32], ints),
        ),
        "oversized_shape": infer(
            inputs=(("INPUT0", "INT32", [1, 2**40]), ("INPUT1", "INT32", [1, 16]))
        ),
        "negative_dim": infer(inputs=(("INPUT0", "INT32", [-4, 16]), ("INPUT1", "INT32", [1, 16]))),
        "batch_over_max": infer(
            inputs=(("INPUT0", "INT32", [9, 16]), ("INPUT1", "INT32", [9, 16])),
            raw=(ints * 9, ints * 9),
        ),
        "missing_input": infer(inputs=(("INPUT0", "INT32", [1, 16]),), raw=(ints,)),
        "unknown_output": infer(outputs=("OUTPUT7",)),
        "contents_and_raw": mixed,
        "wrong_contents_field": typed(lambda c: c.fp32_contents.extend([0.5] * 16)),
        "contents_count_mismatch": typed(lambda c: c.int_contents.extend(range(15))),
        "bytes_prefix_overrun": infer(
            model="simple_string", inputs=strings, raw=(U32.pack(1000) + b"12", ones)
        ),
        "bytes_count_short": infer(model="simple_string", inputs=strings, raw=(ones[:15], ones)),
        "metadata_unknown_model": GrpcCall("ModelMetadata", pb.ModelMetadataRequest(name="nope")),
    }
