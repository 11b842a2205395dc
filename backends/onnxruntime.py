"""The host CPU backend: ONNX models through onnxruntime, one session per slot."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnx import TensorProto

from ge_serve.protos import model_config_pb2

from .base import Array, LoadedModel, ModelSpec, SlotInfo
from .onnx_check import check_config_fits
from .onnx_io import DEFAULT_MAX_BATCH_SIZE, TensorInfo, autocomplete_from_onnx
from .ort_failures import refused_data
from .ort_options import check_accelerators, run_options, session_options
from .warmup import run_warmup

log = logging.getLogger(__name__)


def instance_count(config: model_config_pb2.ModelConfig) -> int:
    return sum(max(group.count, 1) for group in config.instance_group) or 1


def rows_are_requests(config: model_config_pb2.ModelConfig) -> bool:
    """Whether each row (first dim) of an execution's inputs is one request's row: a
    batching model that batches no ragged inputs."""
    ragged = bool(config.batch_input) or any(i.allow_ragged_batch for i in config.input)
    return config.max_batch_size > 0 and not ragged


class OrtSession:
    """An onnxruntime session that speaks ge-serve's array conventions.

    BYTES tensors arrive as object arrays of `bytes`; onnxruntime's Python API takes and
    gives `str` for string tensors (it stores them as UTF-8, and would turn a `bytes`
    object into its repr). So each execution picks one reading of its string inputs, and
    reads its string outputs back the same way (`StringCodec`): UTF-8 when every element
    is UTF-8, so text reaches string ops (LabelEncoder keys, StringNormalizer) byte for
    byte; otherwise latin-1, which maps each byte to one character and back, so arbitrary
    bytes survive (a pass-through model returns them unchanged; a text op sees their
    latin-1 reading). onnxruntime's numpy bridge knows no bfloat16, so models with BF16
    tensors run through OrtValues that carry the raw 16-bit words.

    With `rows_apart` (a batching model whose rows are independent requests' rows), rows
    with non-UTF-8 strings run apart from the others, so that one client's bytes never
    change how another client's text is read when the batcher merges their requests.
    """

    def __init__(
        self,
        path: Path,
        options: ort.SessionOptions,
        rows_apart: bool = False,
        run_options: ort.RunOptions | None = None,
    ) -> None:
        self.rows_apart = rows_apart
        # The model's `memory.enable_memory_arena_shrinkage`; None (the default) otherwise.
        self.run_options = run_options
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        # Overridable initializers are fed like inputs when a request sends them.
        fed = [*self.session.get_inputs(), *self.session.get_overridable_initializers()]
        self.string_inputs = {i.name for i in fed if i.type == "tensor(string)"}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.bf16_inputs = {i.name for i in fed if i.type == _BF16}
        self.uses_bf16 = bool(self.bf16_inputs) or any(
            o.type == _BF16 for o in self.session.get_outputs()
        )
        # Numeric tensors in and out, none of them BF16: onnxruntime's arrays are the
        # outputs as they are, with no string reading to pick and nothing to convert.
        self.numeric = (
            not self.string_inputs
            and not self.uses_bf16
            and all(
                o.type.startswith("tensor(") and o.type != "tensor(string)"
                for o in self.session.get_outputs()
            )
        )

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        if self.numeric:
            results = self.session.run(self.output_names, inputs, self.run_options)  # type: ignore[arg-type]
            return dict(zip(self.output_names, results, strict=True))
        feed: dict[str, Any] = dict(inputs)
        strings = [n for n in self.string_inputs if n in feed and feed[n].dtype == np.object_]
        codec = StringCodec.for_inputs([feed[name] for name in strings])
        if codec is LATIN_1 and self.rows_apart:
            utf8 = utf8_rows([feed[name] for name in strings])
            if utf8.any():
                return self._run_rows_apart(feed, strings, utf8)
        return self._run_read(feed, strings, codec)

    def _run_read(
        self, feed: dict[str, Any], strings: list[str], codec: StringCodec
    ) -> dict[str, Array]:
        for name in strings:
            feed[name] = codec.to_str(feed[name])
        if self.uses_bf16:
            return self._run_bf16(feed, codec)
        results = self.session.run(self.output_names, feed, self.run_options)
        return {
            name: codec.from_ort(np.asarray(value))
            for name, value in zip(self.output_names, results, strict=True)
        }

    def _run_rows_apart(
        self, feed: dict[str, Any], strings: list[str], utf8: npt.NDArray[np.bool_]
    ) -> dict[str, Array]:
        """Run the UTF-8 rows and the other rows as two executions, each with its own
        reading, and put their outputs back in row order. Outputs whose dims depend on
        the data (a split, a tokenizer) may not fit together: then the whole execution
        runs once, read as latin-1, as it did before rows ran apart."""
        parts = []
        for rows, codec in ((np.flatnonzero(utf8), UTF_8), (np.flatnonzero(~utf8), LATIN_1)):
            part = {name: value[rows] for name, value in feed.items()}
            parts.append((rows, self._run_read(part, strings, codec)))
        merged: dict[str, Array] = {}
        for name in self.output_names:
            (rows_a, a), (rows_b, b) = ((rows, out[name]) for rows, out in parts)
            if a.shape[1:] != b.shape[1:] or len(a) != len(rows_a) or len(b) != len(rows_b):
                return self._run_read(feed, strings, LATIN_1)
            out = np.empty((len(utf8), *a.shape[1:]), dtype=a.dtype)
            out[rows_a] = a
            out[rows_b] = b
            merged[name] = out
        return merged

    def _run_bf16(self, feed: dict[str, Any], codec: StringCodec) -> dict[str, Array]:
        values: dict[str, ort.OrtValue] = {}
        for name, array in feed.items():
            if name in self.bf16_inputs:
                # The OrtValue borrows this buffer; `feed` keeps it alive through the run.
                words = np.ascontiguousarray(array).view(np.uint16)
                feed[name] = words
                values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    words, onnx_element_type=TensorProto.BFLOAT16
                )
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        results = self.session.run_with_ort_values(self.output_names, values, self.run_options)
        out: dict[str, Array] = {}
        for name, value in zip(self.output_names, results, strict=True):
            if value.data_type() == _BF16:
                size = value.tensor_size_in_bytes()
                raw = ctypes.string_at(value.data_ptr(), size) if size else b""
                out[name] = np.frombuffer(raw, dtype=ml_dtypes.bfloat16).reshape(value.shape())
            else:
                out[name] = codec.from_ort(value.numpy())
        return out


_BF16 = "tensor(bfloat16)"


class StringCodec:
    """How one execution's string tensors cross onnxruntime's `str` API (see OrtSession)."""

    __slots__ = ("encoding",)

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding

    @classmethod
    def for_inputs(cls, arrays: list[Array]) -> StringCodec:
        for array in arrays:
            for value in array.flat:
                if isinstance(value, bytes):
                    try:
                        value.decode("utf-8")
                    except UnicodeDecodeError:
                        return LATIN_1
        return UTF_8

    def to_str(self, array: Array) -> Array:
        flat = [v.decode(self.encoding) if isinstance(v, bytes) else str(v) for v in array.flat]
        result = np.empty(len(flat), dtype=object)
        result[:] = flat
        return result.reshape(array.shape)

    def from_ort(self, array: Array) -> Array:
        if array.dtype != np.object_ and array.dtype.kind != "U":
            return array
        flat = [self._encode(v) if isinstance(v, str) else bytes(v) for v in array.flat]
        result = np.empty(len(flat), dtype=object)
        result[:] = flat
        return result.reshape(array.shape)

    def _encode(self, text: str) -> bytes:
        try:
            return text.encode(self.encoding)
        except UnicodeEncodeError:
            # A character the model made up itself, past latin-1: it can only be UTF-8.
            return text.encode("utf-8")


UTF_8 = StringCodec("utf-8")
LATIN_1 = StringCodec("latin-1")


def utf8_rows(arrays: list[Array]) -> npt.NDArray[np.bool_]:
    """Per row (first dim), whether every string of every array in it is UTF-8."""
    rows = np.ones(len(arrays[0]) if arrays else 0, dtype=np.bool_)
    for array in arrays:
        for index, row in enumerate(array):
            if rows[index] and not _all_utf8(np.asarray(row, dtype=object).flat):
                rows[index] = False
    return rows


def _all_utf8(values: Iterable[object]) -> bool:
    for value in values:
        if isinstance(value, bytes):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return False
    return True


class OrtExecutor:
    """One slot's session. `dims_chosen`: the model's config lets a client choose a dim
    (ort_failures.py: whose fault a failure on dims is)."""

    def __init__(self, slot: SlotInfo, session: OrtSession, dims_chosen: bool = False) -> None:
        self.slot = slot
        self._session: OrtSession | None = session
        self._dims_chosen = dims_chosen

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        if self._session is None:
            raise RuntimeError(f"executor {self.slot.name} is closed")
        try:
            return self._session.run(inputs)
        except Exception as exc:
            refused = refused_data(exc, self._dims_chosen)
            if refused is None:
                # The server's own log says so: onnxruntime's is kept quiet (run_options).
                log.error("%s: the model's execution failed: %s", self.slot.name, exc)
                raise
            log.debug("%s: %s", self.slot.name, refused)
        # Raised outside the handler, so that it holds no context whose traceback holds
        # this frame; and dropped from the frame, which its traceback holds, with the
        # batch's inputs.
        try:
            raise refused
        finally:
            del refused

    def close(self) -> None:
        self._session = None


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        # Auto-complete's max_batch_size for models that can batch (Triton's
        # --backend-config=onnxruntime,default-max-batch-size).
        self.default_max_batch_size = default_max_batch_size

    def default_model_filename(self) -> str:
        return "model.onnx"

    def autocomplete(self, config: model_config_pb2.ModelConfig, model_path: Path) -> None:
        autocomplete_from_onnx(config, model_path, self.default_max_batch_size)

    def load(self, spec: ModelSpec) -> LoadedModel:
        if not spec.model_path.is_file():
            raise FileNotFoundError(f"model file '{spec.model_path}' does not exist")
        slots = instance_count(spec.config)
        options = session_options(spec.config, slots)
        check_accelerators(spec.config)
        per_run = run_options(spec.config, options)
        dims_chosen = any(-1 in tensor.dims for tensor in spec.config.input)
        executors: list[OrtExecutor] = []
        for index in range(slots):
            slot = SlotInfo(
                name=f"{spec.name}_{spec.version}_cpu_{index}", device="cpu", stream=index
            )
            session = OrtSession(spec.model_path, options, rows_are_requests(spec.config), per_run)
            if index == 0:
                check_config(spec.name, spec.config, session.session)
            executors.append(OrtExecutor(slot, session, dims_chosen))
        run_warmup(spec, executors)  # READY only after model_warmup ran on every slot
        size = spec.model_path.stat().st_size * slots
        # A CPU session can run on any thread.
        return LoadedModel(executors=list(executors), memory_bytes=size, thread_free=True)


_ORT_TYPES: dict[str, int] = {
    "tensor(bool)": model_config_pb2.TYPE_BOOL,
    "tensor(uint8)": model_config_pb2.TYPE_UINT8,
    "tensor(uint16)": model_config_pb2.TYPE_UINT16,
    "tensor(uint32)": model_config_pb2.TYPE_UINT32,
    "tensor(uint64)": model_config_pb2.TYPE_UINT64,
    "tensor(int8)": model_config_pb2.TYPE_INT8,
    "tensor(int16)": model_config_pb2.TYPE_INT16,
    "tensor(int32)": model_config_pb2.TYPE_INT32,
    "tensor(int64)": model_config_pb2.TYPE_INT64,
    "tensor(float16)": model_config_pb2.TYPE_FP16,
    "tensor(float)": model_config_pb2.TYPE_FP32,
    "tensor(double)": model_config_pb2.TYPE_FP64,
    "tensor(string)": model_config_pb2.TYPE_STRING,
    "tensor(bfloat16)": model_config_pb2.TYPE_BF16,
}


def check_config(
    name: str, config: model_config_pb2.ModelConfig, session: ort.InferenceSession
) -> None:
    """Refuse a config that does not fit the model at load time, not at the first request
    (`onnx_check`; onnxruntime reports an unknown rank as [], which is not checked).
    Overridable initializers may be listed as optional inputs, as in Triton."""
    check_config_fits(
        name,
        config,
        _infos(session.get_inputs()),
        _infos(session.get_outputs()),
        _infos(session.get_overridable_initializers()),
    )


def _infos(nodes: Iterable[Any]) -> list[TensorInfo]:
    """onnxruntime's NodeArgs as TensorInfo: symbolic dims -1, a type it does not map
    (a sequence, a map) TYPE_INVALID, i.e. unchecked."""
    return [
        TensorInfo(
            node.name,
            _ORT_TYPES.get(node.type, model_config_pb2.TYPE_INVALID),
            tuple(d if isinstance(d, int) and d > 0 else -1 for d in node.shape or []),
        )
        for node in nodes
    ]
