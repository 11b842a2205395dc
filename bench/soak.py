"""Soak test: a real ge-serve under mixed valid and invalid traffic, with hot reloads.

    python3 bench/soak.py                      # 10 minutes, 32 HTTP + 32 gRPC clients
    python3 bench/soak.py --minutes 0.5 --json OUT.json --md OUT.md

The script copies `simple` and `simple_string` from examples/models into a temporary
repository and starts `python -m ge_serve.server.cli` on free loopback ports in explicit
model-control mode (everything loaded at startup), so `POST /v2/repository/models/simple/load`
reloads `simple` in place: the server builds new versions and swaps them in while the old ones
keep serving. It stops the server by its PID at the end.

What runs (one asyncio loop, so the load generator costs little on a small machine):

- HTTP clients (httpx, one keep-alive connection each) and gRPC clients (grpc.aio, one
  channel and connection each: a local subchannel pool, since grpc otherwise shares one
  connection among a process's channels to a target). Each sends one request, waits a
  random think time (uniform in [0, 2 * --think-ms]) and sends the next. The HTTP clients
  share one TLS context: unused on plain HTTP, but building one per client (loading the CA
  bundle) is slow enough to hold the loop up while the clients start.
- Most requests are valid infers (`simple`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 -
  INPUT1, int32 [batch, 16]; a few on `simple_string`, the same sums as decimal strings), in
  JSON and binary over HTTP and raw and typed contents over gRPC. Every answer is checked
  value for value. A valid request that fails for any reason (status, transport, timeout,
  wrong output) is a *failed valid request*.
- A fraction (`--invalid-fraction`) are drawn from a fixed catalogue of invalid requests
  (`http_invalid_cases`, `grpc_invalid_cases`). Over HTTP a 4xx answer, over gRPC
  INVALID_ARGUMENT or NOT_FOUND, is an *expected error*; a 5xx or INTERNAL / UNKNOWN is a
  *server error* and counts as a failure; anything else (a 200, UNAVAILABLE, a dropped
  connection) is an *unexpected status*, reported but not failed. Invalid and valid requests
  share each client's connection, so a server that mishandles a connection after a bad
  request shows up as failed valid requests.
- A reloader loads `simple` again every `--reload-every` seconds (30, or a quarter of the run
  when that is shorter); a reload that is not a 200 counts as a failure.
- A sampler reads the server's RSS (psutil, the process and any children) every
  `--rss-every` seconds. Start and end RSS are medians over a window (a twentieth of the
  run, 20 s at most, two samples at least): the start window opens after a warm-up of 20 s
  or a tenth of the run, whichever is shorter; the end window closes at the last sample.
  The medians keep one sample taken during a reload or a GC pause from deciding the verdict.

Latencies are measured in the client process around each valid request, so on a loaded
machine they include the load generator's own queueing. Besides p50 / p99 / max, the report
has the worst window's p99 and the longest time without any valid answer per protocol (the
JSON has every window, with how many clients got an answer in it, and each reload's time):
a stall that holds every client at once stands out there from a machine that is merely
slow. It also gives the CPU seconds the load generator and the server used.

The exit status is 1 when a valid request failed, an invalid one got a server error, a
reload failed or RSS grew more than `--max-rss-growth` per cent; 2 when the server did not
start; else 0.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import dataclasses
import gzip
import json
import math
import shutil
import ssl
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio
import httpx
import numpy as np
import numpy.typing as npt
import psutil

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
# The server starts as the tests start it (tests/serverproc.py); tests/ is not a package,
# so it goes on the path, as pytest puts it there.
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tests"))

from serverproc import ServerProcess, start_server  # noqa: E402

EXAMPLE_MODELS: Final = REPO_ROOT / "examples" / "models"
MODELS: Final = ("simple", "simple_string")
# Small enough that an oversized body costs little to send; far above any valid request.
HTTP_MAX_INPUT: Final = 256 * 1024
HEADER_LENGTH: Final = "Inference-Header-Content-Length"
_U32: Final = struct.Struct("<I")
Int32Array = npt.NDArray[np.int32]

# --- valid requests and their checks --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expected:
    """What a valid request must get back: OUTPUT0 = a + b and OUTPUT1 = a - b."""

    model: str  # "simple" (INT32) or "simple_string" (BYTES holding decimal integers)
    a: Int32Array
    b: Int32Array

    def outputs(self) -> dict[str, Int32Array]:
        return {"OUTPUT0": self.a + self.b, "OUTPUT1": self.a - self.b}


@dataclass(frozen=True, slots=True)
class HttpCall:
    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GrpcCall:
    rpc: str  # "ModelInfer" or "ModelMetadata"
    request: Any  # pb.ModelInferRequest or pb.ModelMetadataRequest


def random_operands(rng: np.random.Generator, model: str) -> Expected:
    # Batches of 1 mostly, up to simple's max_batch_size of 8; values far from int32's ends.
    batch = int(rng.choice([1, 1, 1, 2, 4, 8]))
    a = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    return Expected(model, a, b)


def _wire_type(model: str) -> str:
    return "BYTES" if model == "simple_string" else "INT32"


def _raw(model: str, values: Int32Array) -> bytes:
    if model == "simple_string":
        return b"".join(_U32.pack(len(s)) + s for s in (str(int(v)).encode() for v in values.flat))
    return np.ascontiguousarray(values, dtype="<i4").tobytes()


def _json_data(model: str, values: Int32Array) -> list[Any]:
    if model == "simple_string":
        return [str(int(v)) for v in values.flat]
    return [int(v) for v in values.flat]


def http_json_call(expected: Expected) -> HttpCall:
    """A whole-JSON infer: tensors as JSON data, outputs as JSON data."""
    dtype = _wire_type(expected.model)
    document = {
        "inputs": [
            {
                "name": name,
                "shape": list(values.shape),
                "datatype": dtype,
                "data": _json_data(expected.model, values),
            }
            for name, values in (("INPUT0", expected.a), ("INPUT1", expected.b))
        ]
    }
    body = json.dumps(document).encode()
    return HttpCall(
        "POST", f"/v2/models/{expected.model}/infer", body, (("Content-Type", "application/json"),)
    )


def http_binary_call(expected: Expected) -> HttpCall:
    """The binary tensor extension both ways: raw tensors after a JSON header."""
    dtype = _wire_type(expected.model)
    raws = [_raw(expected.model, expected.a), _raw(expected.model, expected.b)]
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(expected.a.shape),
                "datatype": dtype,
                "parameters": {"binary_data_size": len(raw)},
            }
            for name, raw in zip(("INPUT0", "INPUT1"), raws, strict=True)
        ],
        "outputs": [
            {"name": name, "parameters": {"binary_data": True}} for name in ("OUTPUT0", "OUTPUT1")
        ],
    }
    head = json.dumps(header).encode()
    return HttpCall(
        "POST",
        f"/v2/models/{expected.model}/infer",
        head + b"".join(raws),
        (("Content-Type", "application/octet-stream"), (HEADER_LENGTH, str(len(head)))),
    )


def grpc_infer_request(expected: Expected, typed: bool) -> pb.ModelInferRequest:
    """Raw input contents, or (typed) each tensor in its typed contents field."""
    dtype = _wire_type(expected.model)
    request = pb.ModelInferRequest(model_name=expected.model)
    for name, values in (("INPUT0", expected.a), ("INPUT1", expected.b)):
        tensor = request.inputs.add(name=name, datatype=dtype, shape=list(values.shape))
        if not typed:
            request.raw_input_contents.append(_raw(expected.model, values))
        elif expected.model == "simple_string":
            tensor.contents.bytes_contents.extend(str(int(v)).encode() for v in values.flat)
        else:
            tensor.contents.int_contents.extend(int(v) for v in values.flat)
    return request


def _decode_tensor(datatype: str, shape: Sequence[int], raw: bytes) -> npt.NDArray[Any]:
    count = math.prod(shape)
    if datatype == "INT32":
        if len(raw) != 4 * count:
            raise ValueError(f"{len(raw)} bytes for INT32 shape {list(shape)}")
        return np.frombuffer(raw, dtype="<i4").reshape(tuple(shape))
    if datatype == "BYTES":
        items: list[bytes] = []
        offset = 0
        while offset < len(raw):
            (length,) = _U32.unpack_from(raw, offset)
            items.append(raw[offset + 4 : offset + 4 + length])
            offset += 4 + length
        if len(items) != count or offset != len(raw):
            raise ValueError(f"{len(items)} BYTES elements for shape {list(shape)}")
        return np.array(items, dtype=object).reshape(tuple(shape))
    raise ValueError(f"unexpected output datatype {datatype}")


def _compare(expected: Expected, got: dict[str, npt.NDArray[Any]]) -> str | None:
    for name, want in expected.outputs().items():
        if name not in got:
            return f"{expected.model}: no {name} in the response"
        value = got[name]
        if value.shape != want.shape:
            return f"{expected.model}: {name} has shape {list(value.shape)}, not {list(want.shape)}"
        if expected.model == "simple_string":
            try:
                value = np.array([int(bytes(v)) for v in value.flat]).reshape(value.shape)
            except ValueError:
                return f"{expected.model}: {name} holds something other than integers"
        if not np.array_equal(value, want):
            return f"{expected.model}: {name} has wrong values"
    return None


def check_http_answer(
    expected: Expected, status: int, headers: httpx.Headers | dict[str, str], body: bytes
) -> str | None:
    """None when the answer is a 200 with the right outputs, else what is wrong."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    try:
        length_text = headers.get(HEADER_LENGTH) or headers.get(HEADER_LENGTH.lower())
        length = int(length_text) if length_text is not None else len(body)
        document = json.loads(body[:length])
        binary = body[length:]
        got: dict[str, npt.NDArray[Any]] = {}
        offset = 0
        for entry in document["outputs"]:
            shape = [int(d) for d in entry["shape"]]
            size = entry.get("parameters", {}).get("binary_data_size")
            if size is not None:
                got[entry["name"]] = _decode_tensor(
                    entry["datatype"], shape, binary[offset : offset + size]
                )
                offset += size
            elif entry["datatype"] == "BYTES":
                items = [str(v).encode() for v in entry["data"]]
                got[entry["name"]] = np.array(items, dtype=object).reshape(shape)
            else:
                got[entry["name"]] = np.array(entry["data"], dtype=np.int64).reshape(shape)
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        return f"unreadable response: {type(exc).__name__}: {exc}"
    return _compare(expected, got)


def check_grpc_answer(expected: Expected, response: pb.ModelInferResponse) -> str | None:
    """None when the response carries the right outputs, else what is wrong."""
    got: dict[str, npt.NDArray[Any]] = {}
    try:
        for index, output in enumerate(response.outputs):
            shape = [int(d) for d in output.shape]
            if index < len(response.raw_output_contents):
                raw = response.raw_output_contents[index]
                got[output.name] = _decode_tensor(output.datatype, shape, raw)
            elif output.datatype == "BYTES":
                items = list(output.contents.bytes_contents)
                got[output.name] = np.array(items, dtype=object).reshape(shape)
            else:
                values = list(output.contents.int_contents)
                got[output.name] = np.array(values, dtype=np.int64).reshape(shape)
    except (ValueError, struct.error) as exc:
        return f"unreadable response: {type(exc).__name__}: {exc}"
    return _compare(expected, got)


# --- the invalid-request catalogue ----------------------------------------------------------


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
    ones = b"".join(_U32.pack(1) + b"1" for _ in range(16))
    overrun, overrun_length = _binary_body(
        [
            ("INPUT0", "BYTES", [1, 16], _U32.pack(1000) + b"12"),
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
    ones = b"".join(_U32.pack(1) + b"1" for _ in range(16))
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
            model="simple_string", inputs=strings, raw=(_U32.pack(1000) + b"12", ones)
        ),
        "bytes_count_short": infer(model="simple_string", inputs=strings, raw=(ones[:15], ones)),
        "metadata_unknown_model": GrpcCall("ModelMetadata", pb.ModelMetadataRequest(name="nope")),
    }


# --- outcome accounting ---------------------------------------------------------------------

EXPECTED = "expected"
SERVER_ERROR = "server_error"
UNEXPECTED = "unexpected"
GRPC_EXPECTED: Final = frozenset({"INVALID_ARGUMENT", "NOT_FOUND"})
GRPC_SERVER_ERROR: Final = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS"})


def classify_http(status: int) -> str:
    if 400 <= status < 500:
        return EXPECTED
    if status >= 500:
        return SERVER_ERROR
    return UNEXPECTED


def classify_grpc(code: str) -> str:
    if code in GRPC_EXPECTED:
        return EXPECTED
    if code in GRPC_SERVER_ERROR:
        return SERVER_ERROR
    return UNEXPECTED


MAX_FAILURE_SAMPLES: Final = 20


@dataclass(slots=True)
class Tally:
    """One protocol's counts, as the clients record them."""

    valid_ok: int = 0
    valid_failed: int = 0
    failed_during_reload: int = 0
    invalid: Counter[str] = field(default_factory=Counter)  # EXPECTED / SERVER_ERROR / ...
    # Each valid request that succeeded: when it finished (s into the run) and its latency.
    finished_s: array.array[float] = field(default_factory=lambda: array.array("d"))
    latencies_s: array.array[float] = field(default_factory=lambda: array.array("d"))
    clients: array.array[int] = field(default_factory=lambda: array.array("i"))
    failures: list[str] = field(default_factory=list)
    # case -> answer ("400", "INVALID_ARGUMENT", "transport: ReadError") -> count
    cases: dict[str, Counter[str]] = field(default_factory=dict)

    def ok(self, at_s: float, latency_s: float, client: int = 0) -> None:
        self.valid_ok += 1
        self.finished_s.append(at_s)
        self.latencies_s.append(latency_s)
        self.clients.append(client)

    def failed(self, at_s: float, why: str, during_reload: bool) -> None:
        self.valid_failed += 1
        self.failed_during_reload += during_reload
        if len(self.failures) < MAX_FAILURE_SAMPLES:
            when = " (during a reload)" if during_reload else ""
            self.failures.append(f"t={at_s:.1f}s{when}: {why}")

    def answered(self, case: str, answer: str, outcome: str) -> None:
        self.invalid[outcome] += 1
        self.cases.setdefault(case, Counter())[answer] += 1


def percentile_ms(latencies_s: Sequence[float], q: float) -> float | None:
    if not len(latencies_s):
        return None
    return float(np.percentile(np.asarray(latencies_s), q)) * 1000.0


def longest_silence(finished_s: Sequence[float]) -> float | None:
    if not len(finished_s):
        return None
    times = np.sort(np.concatenate([[0.0], np.asarray(finished_s)]))
    return float(np.diff(times).max())


@dataclass(frozen=True, slots=True)
class Window:
    """The valid requests that finished in [start_s, start_s + width)."""

    start_s: float
    ok: int
    p99_ms: float | None
    max_ms: float | None
    # How many clients got an answer: none in a window means every client was stuck at once.
    clients: int = 0


def timeline(
    finished_s: Sequence[float],
    latencies_s: Sequence[float],
    width_s: float,
    clients: Sequence[int] | None = None,
) -> list[Window]:
    """Latency per window of the run, to tell a stall (a reload's?) from a slow run."""
    if not len(finished_s):
        return []
    at = np.asarray(finished_s)
    latencies = np.asarray(latencies_s)
    who = np.asarray(clients if clients is not None else np.zeros(len(at), np.int32))
    index = np.floor(at / width_s).astype(np.int64)
    windows = []
    for i in range(int(index.max()) + 1):
        mask = index == i
        chosen = latencies[mask].tolist()
        windows.append(
            Window(
                start_s=i * width_s,
                ok=len(chosen),
                p99_ms=percentile_ms(chosen, 99),
                max_ms=percentile_ms(chosen, 100),
                clients=len(np.unique(who[mask])),
            )
        )
    return windows


@dataclass(frozen=True, slots=True)
class ProtocolSummary:
    protocol: str
    valid_ok: int
    valid_failed: int
    failed_during_reload: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    invalid_expected: int
    invalid_server_error: int
    invalid_unexpected: int
    failures: list[str]
    cases: dict[str, dict[str, int]]
    timeline: list[Window] = field(default_factory=list)
    # The longest time from the run's start or one valid answer to the next.
    longest_silence_s: float | None = None

    @classmethod
    def of(cls, protocol: str, tally: Tally, window_s: float = 5.0) -> ProtocolSummary:
        return cls(
            protocol=protocol,
            valid_ok=tally.valid_ok,
            valid_failed=tally.valid_failed,
            failed_during_reload=tally.failed_during_reload,
            p50_ms=percentile_ms(tally.latencies_s, 50),
            p99_ms=percentile_ms(tally.latencies_s, 99),
            max_ms=percentile_ms(tally.latencies_s, 100),
            invalid_expected=tally.invalid[EXPECTED],
            invalid_server_error=tally.invalid[SERVER_ERROR],
            invalid_unexpected=tally.invalid[UNEXPECTED],
            failures=list(tally.failures),
            cases={case: dict(sorted(c.items())) for case, c in sorted(tally.cases.items())},
            timeline=timeline(tally.finished_s, tally.latencies_s, window_s, tally.clients),
            longest_silence_s=longest_silence(tally.finished_s),
        )

    def worst_window(self) -> Window | None:
        timed = [w for w in self.timeline if w.p99_ms is not None]
        return max(timed, key=lambda w: w.p99_ms or 0.0, default=None)

    @property
    def sent(self) -> int:
        invalid = self.invalid_expected + self.invalid_server_error + self.invalid_unexpected
        return self.valid_ok + self.valid_failed + invalid


@dataclass(frozen=True, slots=True)
class RssSummary:
    start_bytes: int | None
    end_bytes: int | None
    peak_bytes: int | None
    growth_pct: float | None
    samples: int
    # (s into the run, bytes) about every 10 s, to tell warm-up from a steady leak.
    series: list[tuple[float, int]] = field(default_factory=list)


def rss_windows(duration_s: float, rss_every_s: float) -> tuple[float, float]:
    """(warm-up, averaging window) in seconds for a run of `duration_s`."""
    warmup = min(20.0, 0.1 * duration_s)
    window = max(2.0 * rss_every_s, min(20.0, 0.05 * duration_s))
    return warmup, window


def summarise_rss(
    samples: Sequence[tuple[float, int]], warmup_s: float, window_s: float
) -> RssSummary:
    """Median RSS of the first window after the warm-up and of the last window of samples."""
    after = [(t, rss) for t, rss in samples if t >= warmup_s]
    if not after:
        return RssSummary(None, None, None, None, len(samples))
    first_t, last_t = after[0][0], after[-1][0]
    start = int(np.median([rss for t, rss in after if t <= first_t + window_s]))
    end = int(np.median([rss for t, rss in after if t >= last_t - window_s]))
    peak = max(rss for _, rss in after)
    growth = 100.0 * (end - start) / start if start > 0 else None
    series: list[tuple[float, int]] = []
    for t, rss in samples:
        if not series or t >= series[-1][0] + 10.0:
            series.append((round(t, 1), rss))
    return RssSummary(start, end, peak, growth, len(samples), series)


@dataclass(frozen=True, slots=True)
class ReloadSummary:
    done: int
    failed: int
    max_s: float | None
    failures: list[str]
    # (s into the run, how long it took) of each reload that succeeded
    times: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SoakReport:
    duration_s: float
    http_clients: int
    grpc_clients: int
    invalid_fraction: float
    reload_every_s: float
    protocols: list[ProtocolSummary]
    reloads: ReloadSummary
    rss: RssSummary
    server_exit_code: int | None = None
    server_tracebacks: int = 0
    # Old versions of simple retired before shutdown (the server log): reloads were real.
    retired_versions: int = 0
    # CPU seconds used during the run, to see how much of the machine the load took.
    client_cpu_s: float | None = None
    server_cpu_s: float | None = None

    @property
    def requests_per_s(self) -> float:
        sent = sum(p.sent for p in self.protocols)
        return sent / self.duration_s if self.duration_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "requests_per_s": self.requests_per_s}


def verdict(report: SoakReport, max_rss_growth_pct: float) -> list[str]:
    """Why the run failed; empty when it passed."""
    problems = []
    failed = sum(p.valid_failed for p in report.protocols)
    if failed:
        problems.append(f"{failed} valid request(s) failed")
    server_errors = sum(p.invalid_server_error for p in report.protocols)
    if server_errors:
        problems.append(f"{server_errors} invalid request(s) got a 5xx / INTERNAL answer")
    if report.reloads.failed:
        problems.append(f"{report.reloads.failed} reload(s) failed")
    growth = report.rss.growth_pct
    if growth is None:
        problems.append("no RSS samples after the warm-up")
    elif growth > max_rss_growth_pct:
        problems.append(f"RSS grew {growth:.1f} % (limit {max_rss_growth_pct:g} %)")
    return problems


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def markdown(report: SoakReport, problems: Sequence[str] = ()) -> str:
    rows = [
        "| protocol | valid ok | failed valid | p50 ms | p99 ms | max ms "
        "| invalid: expected | invalid: 5xx/INTERNAL | invalid: unexpected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report.protocols:
        rows.append(
            f"| {p.protocol} | {p.valid_ok} | {p.valid_failed} | {_ms(p.p50_ms)} "
            f"| {_ms(p.p99_ms)} | {_ms(p.max_ms)} | {p.invalid_expected} "
            f"| {p.invalid_server_error} | {p.invalid_unexpected} |"
        )
    rss = report.rss
    growth = "-" if rss.growth_pct is None else f"{rss.growth_pct:+.2f} %"
    reload_max = "-" if report.reloads.max_s is None else f"{report.reloads.max_s:.2f} s"
    worst = []
    for p in report.protocols:
        w = p.worst_window()
        if w is not None:
            worst.append(f"{p.protocol} {_ms(w.p99_ms)} ms at t={w.start_s:.0f} s")
    width = next((p.timeline[1].start_s for p in report.protocols if len(p.timeline) > 1), None)
    width_text = "" if width is None else f"{width:g} s "
    silences = ", ".join(f"{p.protocol} {_secs(p.longest_silence_s)} s" for p in report.protocols)
    lines = [
        f"Soak: {report.duration_s:.0f} s, {report.http_clients} HTTP + {report.grpc_clients} "
        f"gRPC clients, {100 * report.invalid_fraction:g} % invalid, "
        f"{report.requests_per_s:.0f} requests/s",
        "",
        *rows,
        "",
        "| measure | value |",
        "|---|---|",
        f"| reloads of simple (every {report.reload_every_s:g} s) | {report.reloads.done} done, "
        f"{report.reloads.failed} failed, slowest {reload_max} |",
        f"| old versions retired (server log) | {report.retired_versions} |",
        f"| RSS start / end / peak (MiB) | {_mib(rss.start_bytes)} / {_mib(rss.end_bytes)} "
        f"/ {_mib(rss.peak_bytes)} ({rss.samples} samples) |",
        f"| RSS growth | {growth} |",
        f"| worst {width_text}window p99 | {', '.join(worst) or '-'} |",
        f"| longest time without a valid answer | {silences} |",
        f"| CPU s, load generator / server | {_secs(report.client_cpu_s)} "
        f"/ {_secs(report.server_cpu_s)} |",
        f"| failed valid during a reload | "
        f"{sum(p.failed_during_reload for p in report.protocols)} |",
        f"| server exit code / tracebacks in its log | {report.server_exit_code} "
        f"/ {report.server_tracebacks} |",
        f"| verdict | {'PASS' if not problems else 'FAIL: ' + '; '.join(problems)} |",
    ]
    odd = [
        f"| {p.protocol} | {case} | "
        + ", ".join(f"{answer} x{n}" for answer, n in answers.items())
        + " |"
        for p in report.protocols
        for case, answers in p.cases.items()
        if any(_outcome_of(p.protocol, a) != EXPECTED for a in answers)
    ]
    if odd:
        lines += ["", "| protocol | invalid case | answers |", "|---|---|---|", *odd]
    failures = [f"- {p.protocol}: {f}" for p in report.protocols for f in p.failures]
    failures += [f"- reload: {f}" for f in report.reloads.failures]
    if failures:
        lines += ["", "First failures:", *failures]
    return "\n".join(lines) + "\n"


def _outcome_of(protocol: str, answer: str) -> str:
    if protocol == "http":
        return classify_http(int(answer)) if answer.isdigit() else UNEXPECTED
    return classify_grpc(answer)


# --- the server -----------------------------------------------------------------------------


def make_repository(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for name in MODELS:
        shutil.copytree(source / name, target / name)
    return target


def start_soak_server(repo: Path, extra: Sequence[str] = ()) -> ServerProcess:
    """ge-serve on `repo` in explicit mode with every model loaded, not waited for."""
    flags = [
        "--model-control-mode", "explicit", "--load-model", "*",
        "--http-max-input-size", str(HTTP_MAX_INPUT),
        *extra,
    ]  # fmt: skip
    return start_server([repo], flags, wait_ready=False)


async def wait_ready(server: ServerProcess, timeout_s: float) -> None:
    """Poll HTTP ready and gRPC ServerReady (real signals), or raise with the server's log."""
    deadline = time.monotonic() + timeout_s
    http_ok = grpc_ok = False
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http,
        grpc.aio.insecure_channel(server.grpc_url) as channel,
    ):
        stub = _stub(channel)
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"ge-serve exited early:\n{server.log()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                http_ok = http_ok or (await http.get("/v2/health/ready")).status_code == 200
            with contextlib.suppress(grpc.aio.AioRpcError):
                if not grpc_ok:
                    reply = await stub.ServerReady(pb.ServerReadyRequest(), timeout=1.0)
                    grpc_ok = bool(reply.ready)
            if http_ok and grpc_ok:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"ge-serve was not ready in {timeout_s:g} s:\n{server.log()[-4000:]}")


def _stub(channel: Any) -> Any:
    """The generated stub (untyped code): its methods answer the proto messages."""
    return pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


def rss_of(pid: int) -> int:
    """RSS of the process and its children (a backend could run in one)."""
    process = psutil.Process(pid)
    total = int(process.memory_info().rss)
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += int(child.memory_info().rss)
    return total


# --- the load -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    duration_s: float
    http_clients: int = 32
    grpc_clients: int = 32
    think_s: float = 0.1
    invalid_fraction: float = 0.1
    string_fraction: float = 0.1  # of valid requests, on simple_string
    reload_every_s: float = 30.0
    rss_every_s: float = 2.0
    request_timeout_s: float = 30.0
    seed: int = 0


@dataclass(slots=True)
class Run:
    """State the tasks of one run share (one event loop, so no locks)."""

    plan: Plan
    started: float
    deadline: float
    http: Tally = field(default_factory=Tally)
    grpc: Tally = field(default_factory=Tally)
    reloading: bool = False
    reloads_started: int = 0
    reload_times_s: list[tuple[float, float]] = field(default_factory=list)
    reload_failures: list[str] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    def reload_mark(self) -> tuple[bool, int]:
        return self.reloading, self.reloads_started

    def overlapped(self, mark: tuple[bool, int]) -> bool:
        """Whether a reload was in flight at some point since `mark` was taken."""
        return mark[0] or self.reloading or mark[1] != self.reloads_started


def _model(rng: np.random.Generator, plan: Plan) -> str:
    return "simple_string" if rng.random() < plan.string_fraction else "simple"


async def _think(run: Run, rng: np.random.Generator) -> None:
    await asyncio.sleep(float(rng.uniform(0.0, 2.0 * run.plan.think_s)))


async def http_client(
    run: Run, index: int, base_url: str, cases: dict[str, HttpCall], tls: ssl.SSLContext
) -> None:
    rng = np.random.default_rng([run.plan.seed, 1, index])
    names = sorted(cases)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tally = run.http
    async with httpx.AsyncClient(
        base_url=base_url, timeout=run.plan.request_timeout_s, limits=limits, verify=tls
    ) as http:
        while not run.over():
            if rng.random() < run.plan.invalid_fraction:
                name = names[int(rng.integers(len(names)))]
                call = cases[name]
                try:
                    response = await http.request(
                        call.method, call.path, content=call.body, headers=dict(call.headers)
                    )
                except httpx.HTTPError as exc:
                    tally.answered(name, f"transport: {type(exc).__name__}", UNEXPECTED)
                else:
                    status = response.status_code
                    tally.answered(name, str(status), classify_http(status))
            else:
                expected = random_operands(rng, _model(rng, run.plan))
                binary = rng.random() < 0.5
                call = http_binary_call(expected) if binary else http_json_call(expected)
                mark = run.reload_mark()
                began = time.monotonic()
                try:
                    response = await http.request(
                        call.method, call.path, content=call.body, headers=dict(call.headers)
                    )
                    problem = check_http_answer(
                        expected, response.status_code, response.headers, response.content
                    )
                except httpx.HTTPError as exc:
                    problem = f"transport: {type(exc).__name__}: {exc}"
                if problem is None:
                    tally.ok(run.now(), time.monotonic() - began, index)
                else:
                    kind = "binary" if binary else "json"
                    tally.failed(run.now(), f"{kind}: {problem}", run.overlapped(mark))
            await _think(run, rng)


async def grpc_client(run: Run, index: int, target: str, cases: dict[str, GrpcCall]) -> None:
    rng = np.random.default_rng([run.plan.seed, 2, index])
    names = sorted(cases)
    tally = run.grpc
    timeout = run.plan.request_timeout_s
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = _stub(channel)
        while not run.over():
            if rng.random() < run.plan.invalid_fraction:
                name = names[int(rng.integers(len(names)))]
                call = cases[name]
                try:
                    await getattr(stub, call.rpc)(call.request, timeout=timeout)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                    tally.answered(name, code, classify_grpc(code))
                else:
                    tally.answered(name, "OK", UNEXPECTED)
            else:
                expected = random_operands(rng, _model(rng, run.plan))
                typed = rng.random() < 0.25
                request = grpc_infer_request(expected, typed)
                mark = run.reload_mark()
                began = time.monotonic()
                try:
                    response = await stub.ModelInfer(request, timeout=timeout)
                    problem = check_grpc_answer(expected, response)
                except grpc.aio.AioRpcError as exc:
                    problem = f"{exc.code().name}: {exc.details()}"
                if problem is None:
                    tally.ok(run.now(), time.monotonic() - began, index)
                else:
                    kind = "typed" if typed else "raw"
                    tally.failed(run.now(), f"{kind}: {problem}", run.overlapped(mark))
            await _think(run, rng)


async def _sleep_until(run: Run, at: float) -> bool:
    """Sleep until `at` seconds into the run; False when the run ends first."""
    delay = min(at, run.deadline - run.started) - run.now()
    if delay > 0:
        await asyncio.sleep(delay)
    return not run.over()


async def reloader(run: Run, base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=120.0) as http:
        count = 1
        while await _sleep_until(run, count * run.plan.reload_every_s):
            count += 1
            run.reloading = True
            run.reloads_started += 1
            began = time.monotonic()
            at = run.now()
            try:
                response = await http.post("/v2/repository/models/simple/load")
                problem = (
                    None
                    if response.status_code == 200
                    else (f"HTTP {response.status_code}: {response.text[:200]}")
                )
            except httpx.HTTPError as exc:
                problem = f"transport: {type(exc).__name__}: {exc}"
            finally:
                run.reloading = False
            if problem is None:
                run.reload_times_s.append((at, time.monotonic() - began))
            else:
                run.reload_failures.append(f"t={at:.1f}s: {problem}")


async def rss_sampler(run: Run, pid: int) -> None:
    count = 0
    while True:
        with contextlib.suppress(psutil.Error):
            run.rss.append((run.now(), rss_of(pid)))
        count += 1
        if not await _sleep_until(run, count * run.plan.rss_every_s):
            break
    with contextlib.suppress(psutil.Error):
        run.rss.append((run.now(), rss_of(pid)))


async def run_soak(server: ServerProcess, plan: Plan) -> SoakReport:
    """Drive the load for `plan.duration_s` against a ready server and summarise it."""
    http_cases = http_invalid_cases()
    grpc_cases = grpc_invalid_cases()
    server_process = psutil.Process(server.process.pid)
    server_cpu = server_process.cpu_times()
    client_cpu = time.process_time()
    started = time.monotonic()
    run = Run(plan, started, started + plan.duration_s)
    tls = ssl.create_default_context()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(rss_sampler(run, server.process.pid))
        tasks.create_task(reloader(run, server.base_url))
        for i in range(plan.http_clients):
            tasks.create_task(http_client(run, i, server.base_url, http_cases, tls))
        for i in range(plan.grpc_clients):
            tasks.create_task(grpc_client(run, i, server.grpc_url, grpc_cases))
    client_cpu = time.process_time() - client_cpu
    server_now = server_process.cpu_times()
    server_cpu_s = server_now.user + server_now.system - server_cpu.user - server_cpu.system
    warmup, window = rss_windows(plan.duration_s, plan.rss_every_s)
    width = max(1.0, round(plan.duration_s / 60.0))
    return SoakReport(
        duration_s=run.now(),
        http_clients=plan.http_clients,
        grpc_clients=plan.grpc_clients,
        invalid_fraction=plan.invalid_fraction,
        reload_every_s=plan.reload_every_s,
        protocols=[
            ProtocolSummary.of("http", run.http, width),
            ProtocolSummary.of("grpc", run.grpc, width),
        ],
        reloads=ReloadSummary(
            done=len(run.reload_times_s),
            failed=len(run.reload_failures),
            max_s=max((d for _, d in run.reload_times_s), default=None),
            failures=run.reload_failures[:MAX_FAILURE_SAMPLES],
            times=run.reload_times_s,
        ),
        rss=summarise_rss(run.rss, warmup, window),
        client_cpu_s=client_cpu,
        server_cpu_s=server_cpu_s,
    )


# --- command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Soak ge-serve: mixed valid and invalid HTTP and gRPC traffic with hot "
        "reloads; reports failed valid requests, p99 and RSS growth."
    )
    add = parser.add_argument
    add("--minutes", type=float, default=10.0, help="how long the load runs (default 10)")
    add("--http-clients", type=int, default=32)
    add("--grpc-clients", type=int, default=32)
    add("--think-ms", type=float, default=100.0, help="mean pause between a client's requests")
    add("--invalid-fraction", type=float, default=0.1)
    add(
        "--reload-every",
        type=float,
        default=None,
        metavar="S",
        help="seconds between reloads of simple (30, or a quarter of a shorter run)",
    )
    add("--rss-every", type=float, default=2.0, metavar="S")
    add("--max-rss-growth", type=float, default=5.0, metavar="PCT")
    add("--request-timeout", type=float, default=30.0, metavar="S")
    add("--seed", type=int, default=0)
    add("--models", type=Path, default=EXAMPLE_MODELS, help="where simple and simple_string are")
    add("--server-arg", action="append", default=[], help="extra ge-serve flag (repeatable)")
    add("--json", type=Path, default=None, metavar="OUT", help="write the report as JSON")
    add("--md", type=Path, default=None, metavar="OUT", help="write the report as markdown")
    add("--log", type=Path, default=None, metavar="OUT", help="keep the server log here")
    add(
        "--out",
        type=Path,
        default=None,
        metavar="PREFIX",
        help="write PREFIX.md and PREFIX.json, as the other suites do",
    )
    return parser


def plan_from(args: argparse.Namespace) -> Plan:
    duration = 60.0 * args.minutes
    reload_every = args.reload_every if args.reload_every else min(30.0, duration / 4)
    return Plan(
        duration_s=duration,
        http_clients=args.http_clients,
        grpc_clients=args.grpc_clients,
        think_s=args.think_ms / 1000.0,
        invalid_fraction=args.invalid_fraction,
        reload_every_s=reload_every,
        rss_every_s=args.rss_every,
        request_timeout_s=args.request_timeout,
        seed=args.seed,
    )


def _count_log(log: str, needle: str) -> int:
    return sum(needle in line for line in log.splitlines())


def retired_by_reloads(log: str) -> int:
    """Old `simple` versions the reloads retired: unloads logged before shutdown began."""
    before_stop = log.split("signal received", 1)[0]
    return _count_log(before_stop, "successfully unloaded 'simple' version")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = plan_from(args)

    async def soak(server: ServerProcess) -> SoakReport:
        await wait_ready(server, 120.0)
        return await run_soak(server, plan)

    with tempfile.TemporaryDirectory(prefix="ge-serve-soak-") as tmp:
        repo = make_repository(args.models, Path(tmp) / "models")
        server = start_soak_server(repo, args.server_arg)
        try:
            report = asyncio.run(soak(server))
        except (RuntimeError, TimeoutError) as exc:
            print(f"soak: {exc}", file=sys.stderr)
            return 2
        finally:
            code = server.stop()
            log = server.log()
            shutil.rmtree(server.log_path.parent, ignore_errors=True)
            if args.log is not None:
                args.log.parent.mkdir(parents=True, exist_ok=True)
                args.log.write_text(log)
    report = dataclasses.replace(
        report,
        server_exit_code=code,
        server_tracebacks=_count_log(log, "Traceback"),
        retired_versions=retired_by_reloads(log),
    )
    problems = verdict(report, args.max_rss_growth)
    text = markdown(report, problems)
    if args.out is not None:
        args.json = args.json or args.out.with_name(args.out.name + ".json")
        args.md = args.md or args.out.with_name(args.out.name + ".md")
    print(text, end="")
    if args.json is not None:
        document = {**report.to_json(), "problems": problems, "passed": not problems}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.md is not None:
        args.md.write_text(text)
    if report.server_tracebacks or problems:
        print("\nThe end of the server log:\n" + log[-4000:], file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
