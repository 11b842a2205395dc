"""The error messages clients match on, each written once, in the current Triton server's
words (server `src/http_server.cc`, `src/grpc/infer_handler.cc`, `src/common.cc`,
`src/shared_memory_manager.cc`; core `src/infer_request.cc`, `src/tritonserver.cc`).

Core checks (shapes, byte sizes, BYTES element counts, duplicates, raw-binary deduction)
start with Triton's `[request id: <id>] ` tag, as Triton's core writes them; front-end
checks (JSON depth and sizes, binary data, element-count overflow) do not.

Where Triton answers a client's mistake with INTERNAL (a JSON `data` array that does not
match its shape), the message is Triton's but the code is INVALID_ARG: bad input is never
a server error here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..errors import ErrorCode, ServerError

INT64_MAX: Final = 2**63 - 1
INT_MAX: Final = 2**31 - 1
# Triton's HTTP_MAX_JSON_NESTING_DEPTH.
MAX_JSON_DEPTH: Final = 100
# Triton's kMaxChunkedChunks: non-empty chunks of a chunked request body.
MAX_CHUNKS: Final = 1 << 16
READY_NOT_BOOLEAN: Final = "Invalid value for 'ready': expected a boolean"
_BATCH_NOTE: Final = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
    "dimension to be prepended to each input shape. If you want to specify the full shape "
    "including the batch dim in your input dims config, try setting max_batch_size to zero. "
    "See the model configuration docs for more info on max_batch_size."
)


def _invalid(message: str) -> ServerError:
    return ServerError(ErrorCode.INVALID_ARG, message)


def dims(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass(frozen=True, slots=True)
class InputRef:
    """Which input of which request a message is about."""

    name: str
    model: str = ""
    request_id: str = ""

    @property
    def tag(self) -> str:
        return request_tag(self.request_id)


def request_tag(request_id: str) -> str:
    return f"[request id: {request_id or '<id_unknown>'}] "


# --- core: the request against the model (infer_request.cc) ---------------------------------


def unexpected_shape(
    ref: InputRef, expected: Sequence[int], got: Sequence[int], batching: bool
) -> ServerError:
    full = ([-1] if batching else []) + list(expected)
    return _invalid(
        f"{ref.tag}unexpected shape for input '{ref.name}' for model '{ref.model}'. Expected "
        f"{dims(full)}, got {dims(got)}. " + (_BATCH_NOTE if batching else "")
    )


def input_byte_size(ref: InputRef, expected: int, got: int) -> ServerError:
    return _invalid(
        f"{ref.tag}input byte size mismatch for input '{ref.name}' for model '{ref.model}'. "
        f"Expected {expected}, got {got}"
    )


def too_many_strings(ref: InputRef, checked: int, expected: int) -> ServerError:
    return _invalid(
        f"{ref.tag}unexpected number of string elements {checked} for inference input "
        f"'{ref.name}' for model '{ref.model}', expecting {expected}"
    )


def too_few_strings(ref: InputRef, expected: int, got: int) -> ServerError:
    return _invalid(
        f"{ref.tag}expected {expected} string elements for inference input '{ref.name}' for "
        f"model '{ref.model}', got {got}"
    )


def incomplete_string_length(ref: InputRef, available: int) -> ServerError:
    return _invalid(
        f"{ref.tag}incomplete string length indicator for inference input '{ref.name}' for "
        f"model '{ref.model}', expecting 4 bytes but only {available} bytes available. Please "
        "make sure the string length indicator is in one buffer."
    )


def duplicate_input(request_id: str, name: str) -> ServerError:
    return _invalid(f"{request_tag(request_id)}input '{name}' already exists in request")


def duplicate_output(request_id: str, name: str) -> ServerError:
    return _invalid(f"{request_tag(request_id)}output '{name}' already exists in request")


def raw_input_count(request_id: str, found: int, configured: int, model: str) -> ServerError:
    return _invalid(
        f"{request_tag(request_id)}Raw request must only have 1 input (found {found}) to be "
        f"deduced but got {configured} inputs in '{model}' model configuration"
    )


def raw_shape_not_deducible(request_id: str, name: str) -> ServerError:
    return _invalid(
        f"{request_tag(request_id)}The shape of the raw input '{name}' can not be deduced "
        "because there are more than one variable-sized dimension"
    )


def raw_bytes_shape(request_id: str, name: str) -> ServerError:
    return _invalid(
        f"{request_tag(request_id)}For BYTE datatype raw input '{name}', the model must "
        "have input shape [1]"
    )


# --- front ends: shapes and sizes -------------------------------------------------------------


def element_count_overflow(name: str, shape: Sequence[int], limit: int = INT64_MAX) -> ServerError:
    """Triton's limit is INT64_MAX elements; ours can be lower (a byte size must fit too),
    and the sentence then names ours."""
    return _invalid(
        f"invalid shape for input '{name}': shape {dims(shape)} causes total element count "
        f"to exceed maximum size of {limit}"
    )


def byte_size_overflow(name: str, count: int, itemsize: int) -> ServerError:
    return _invalid(
        f"byte size overflow for input '{name}': element count ({count}) * data type size "
        f"({itemsize}) exceeds maximum allowed size ({INT64_MAX})"
    )


def json_too_deep() -> ServerError:
    return _invalid(
        f"Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit "
        f"({MAX_JSON_DEPTH})"
    )


def json_document_too_deep(what: str) -> ServerError:
    """The same limit on a control-plane document (Triton's wording for 'data')."""
    return _invalid(
        f"Unable to parse the {what}: JSON nesting depth exceeds maximum allowed limit "
        f"({MAX_JSON_DEPTH})"
    )


def json_data_too_long() -> ServerError:
    return _invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")


def json_data_too_short() -> ServerError:
    return _invalid("Failed to parse 'data' field: shape does not match true shape")


def request_json_size(length: int, limit: int) -> str:
    return (
        f"request JSON size of {length} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def json_input_too_large(name: str, size: int, limit: int) -> ServerError:
    return _invalid(
        f"JSON input '{name}' has a byte_size ({size} bytes) that exceeds the maximum allowed "
        f"value of {limit} bytes. Use --http-max-input-size to increase the limit."
    )


def decompressed_too_large(limit: int) -> ServerError:
    return _invalid(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use "
        "--http-max-input-size to increase the limit."
    )


def content_length_out_of_range(declared: int) -> str:
    """Triton's answer to a Content-Length past int32 on an infer request: it reads the
    header with C's stoi (http_server.cc GetContentLength)."""
    return (
        f"Unable to parse Content-Length, value is out of range [ {-INT_MAX - 1}, {INT_MAX} ], "
        f"got: {declared}"
    )


def binary_body_too_large(limit: int) -> str:
    """A body with binary tensor data past the bound on such bodies (the larger of
    --http-max-input-size and INT_MAX): not capped by the flag, as in Triton, but still
    bounded in memory."""
    return (
        f"request body exceeds the maximum allowed size of {limit} bytes for an inference "
        "request with binary tensor data"
    )


def raw_input_too_large(size: int, limit: int) -> ServerError:
    return _invalid(
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def binary_without_header() -> ServerError:
    return _invalid(
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format"
    )


def binary_input_short(name: str, missing: int, model: str) -> ServerError:
    return _invalid(
        f"unexpected size for input '{name}', expecting {missing} additional bytes for model "
        f"'{model}'"
    )


def additional_input_data(model: str) -> ServerError:
    return _invalid(f"unexpected additional input data for model '{model}'")


def bytes_not_utf8(name: str) -> ServerError:
    """Ours: Triton writes such bytes into its JSON as they are, which no JSON reader
    takes. The way out is the binary extension, which carries any bytes."""
    return _invalid(
        f"output '{name}' holds BYTES that are not valid UTF-8, which a JSON response cannot "
        'carry; request it as binary data ("binary_data": true on the output, or '
        '"binary_data_output": true on the request)'
    )


def too_many_chunks(limit: int = MAX_CHUNKS) -> str:
    return (
        f"Chunked request body exceeds maximum of {limit} non-empty chunks. Send fewer or "
        "larger HTTP chunks."
    )


def file_too_large(key: str) -> ServerError:
    return _invalid(f"'{key}' exceeds the maximum allowed data size limit INT_MAX")


# --- gRPC (infer_handler.cc) -----------------------------------------------------------------


def contents_with_raw(name: str, model: str) -> ServerError:
    return _invalid(
        f"contents field must not be specified when using raw_input_contents for '{name}' for "
        f"model '{model}'"
    )


def contents_with_shm(name: str, model: str) -> ServerError:
    return _invalid(
        f"unexpected 'content' provided when using shared memory for input tensor '{name}' for "
        f"model '{model}'"
    )


def no_input_data(name: str, model: str) -> ServerError:
    return _invalid(
        f"unable to find data for input tensor '{name}' for model '{model}' in request."
    )


# --- shared memory (shared_memory_manager.cc, common.cc) ------------------------------------


def shm_already_registered(name: str) -> ServerError:
    return ServerError(
        ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
    )


def shm_cannot_open(key: str) -> ServerError:
    """INTERNAL, as Triton answers it (gRPC; HTTP answers 400, see http/sharedmemory.py)."""
    return ServerError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'")


# Triton's kTritonSharedMemoryRegionPrefix: keys its Python backend keeps for itself.
RESERVED_SHM_PREFIX: Final = "triton_python_backend_shm_region_"


def shm_reserved_key(name: str, key: str) -> ServerError:
    return _invalid(
        f"cannot register shared memory region '{name}' with key '{key}' as the key contains "
        f"the reserved prefix '{RESERVED_SHM_PREFIX}'"
    )


def cuda_register_refused() -> ServerError:
    """What Triton answers for a CUDA handle it cannot open (the only kind here: no CUDA
    device), in a GPU build as in one running on a host without a GPU."""
    return _invalid("failed to register shared memory region: invalid args")


def shm_invalid_args(name: str) -> ServerError:
    return _invalid(f"failed to register shared memory region '{name}': invalid args")


def shm_invalid_key(name: str, key: str) -> ServerError:
    return _invalid(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")


def shm_not_found(name: str) -> ServerError:
    return ServerError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{name}'")


def shm_invalid_offset(name: str) -> ServerError:
    return _invalid(f"Invalid offset for shared memory region: '{name}'")


def shm_integer_overflow(name: str, byte_size: int, offset: int, size_max: int) -> ServerError:
    return _invalid(
        f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
        f"exceeds maximum value ({size_max}) for region '{name}'"
    )


def shm_invalid_range(name: str) -> ServerError:
    return _invalid(f"Invalid offset + byte size for shared memory region: '{name}'")


# --- model namespacing (core model_repository_manager.cc) -----------------------------------


def ambiguous_model(name: str, count: int) -> ServerError:
    return _invalid(
        f"There are {count} identifiers of model '{name}' in global map, model namespace "
        "must be provided to resolve ambiguity."
    )


# --- statistics (core tritonserver.cc, TRITONSERVER_ServerModelStatistics) ------------------


def stats_model_unavailable(name: str) -> ServerError:
    """Statistics asked of a model with no ready version, or of no such model at all."""
    return _invalid(f"requested model '{name}' is not available")


def stats_version_unavailable(name: str) -> ServerError:
    return _invalid(f"requested model version is not available for model '{name}'")


# Triton serves one unnamed repository set; a repository named in a control request is
# refused with its words (an index request ignores the name, as Triton's does).
REPOSITORY_NAME_UNSUPPORTED: Final = "'repository_name' specification is not supported"


def repository_name_unsupported(repository: str, model: str, action: str) -> str:
    """Triton's refusal of a named repository, and where no model is named, why that is
    likely: KServe's protos give RepositoryModelLoadRequest (and Unload) only `model_name`,
    as field 1, which is `repository_name` in Triton's. Triton's words come first, so what
    matches them still does."""
    if model:
        return REPOSITORY_NAME_UNSUPPORTED
    return (
        f"{REPOSITORY_NAME_UNSUPPORTED}, and no 'model_name' was given: a client built from "
        f"KServe's protos sends the model's name ('{repository}') in field 1, which is "
        "'repository_name' in Triton's grpc_service.proto (model_name is field 2); use "
        f"Triton's protos, or POST /v2/repository/models/{repository}/{action} over HTTP"
    )
