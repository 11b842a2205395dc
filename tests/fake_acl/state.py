"""The fake pyACL's state: pyACL's return codes, what each handle stands for, and the checks
every call starts with (initialised, a current context, an injected failure). The calls
themselves are in core.py (acl, acl.rt), models.py (acl.mdl) and dynamic.py (shapes)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

SUCCESS = 0
INVALID_PARAM = 100000
UNINITIALIZE = 100001
REPEAT_INITIALIZE = 100002
INVALID_FILE = 100003
INVALID_MODEL_ID = 100010
REPEAT_FINALIZE = 100037
RT_PARAM_INVALID = 107000
RT_INVALID_DEVICEID = 107001
RT_CONTEXT_NULL = 107002
RT_MEMORY_ALLOCATION = 207001
RT_INTERNAL = 507899

DYNAMIC_INPUT = "ascend_mbatch_shape_data"
ACL_DTYPES = {
    0: np.float32,
    1: np.float16,
    2: np.int8,
    3: np.int32,
    4: np.uint8,
    6: np.int16,
    7: np.uint16,
    8: np.uint32,
    9: np.int64,
    10: np.uint64,
    11: np.float64,
    12: np.bool_,
}


@dataclass
class Alloc:
    device: int
    buffer: Any
    size: int


@dataclass
class Stream:
    device: int
    context: int
    inflight: list[int] = field(default_factory=list)  # model ids
    pending_ptrs: set[int] = field(default_factory=set)


@dataclass
class Dataset:
    buffers: list[int] = field(default_factory=list)
    # The batch gear, or the index of the ND / image-size gear set on it.
    gear: int | None = None
    # input index -> tensor desc set on it (shape-range models)
    tensor_descs: dict[int, int] = field(default_factory=dict)
    # Output shapes of the last execution, and the descs describing them.
    out_shapes: list[list[int]] | None = None
    out_descs: list[int] = field(default_factory=list)


@dataclass
class TensorInfo:
    name: str
    dtype: int
    dims: list[int]
    size: int


@dataclass
class Model:
    device: int
    session: ort.InferenceSession | None
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    gears: list[int]
    dynamic_index: int | None
    running_on: int | None = None
    # The OM's shape mode (dynamic.py): {"mode": "dims"|"hw"|"range", ...}; {} otherwise.
    shape: dict[str, Any] = field(default_factory=dict)
    last_outputs: list[list[int]] | None = None


class AclState:
    """Every handle the fake has handed out, and the rules each call checks first."""

    def __init__(
        self, devices: int = 1, soc: str = "Ascend310P3", memory: int = 8 * 1024**3
    ) -> None:
        self.device_total = devices
        self.soc = soc
        self.memory = memory
        self.initialized = False
        self.finalized = False
        self.violations: list[str] = []
        self.calls: list[str] = []
        self._failures: dict[str, int] = {}
        self._ids = itertools.count(0x7F00_0000_1000, 0x10)
        self._model_ids = itertools.count(1)
        self._lock = threading.RLock()
        self._tls = threading.local()
        self.set_devices: dict[int, int] = {}
        self.contexts: dict[int, int] = {}  # context -> device
        self.streams: dict[int, Stream] = {}
        self.allocs: dict[int, Alloc] = {}
        self.data_buffers: dict[int, tuple[int, int]] = {}
        self.datasets: dict[int, Dataset] = {}
        self.descs: dict[int, int | None] = {}
        self.tensor_descs: dict[int, tuple[int, list[int], int]] = {}
        self.models: dict[int, Model] = {}
        self.executions = 0

    # --- helpers ------------------------------------------------------------------------

    def fail_next(self, call: str, code: int) -> None:
        """Make the next call named `call` (e.g. "acl.rt.malloc") return `code`."""
        self._failures[call] = code

    def _enter(self, call: str) -> int:
        self.calls.append(call)
        code = self._failures.pop(call, 0)
        if code:
            return code
        if not self.initialized and call not in ("acl.init", "acl.get_soc_name"):
            return self._violate(UNINITIALIZE, f"{call} before acl.init")
        return 0

    def _violate(self, code: int, message: str) -> int:
        self.violations.append(message)
        return code

    def _context(self, call: str) -> tuple[int, int] | int:
        """The thread's current (context, device), or an error code."""
        context = getattr(self._tls, "context", None)
        if context is None or context not in self.contexts:
            return self._violate(
                RT_CONTEXT_NULL, f"{call} without a current context on this thread"
            )
        return context, self.contexts[context]

    def _enter_in_context(self, call: str) -> tuple[int, int] | int:
        """`_enter`, then the thread's current (context, device): an error code if either
        fails, as pyACL checks both before doing anything."""
        code = self._enter(call)
        return code if code else self._context(call)

    def _model_and_dataset(
        self, call: str, model_id: int, dataset: int
    ) -> tuple[Model, Dataset] | int:
        """`_enter_in_context`, then the loaded model and the dataset named, or an error
        code: what every call that sets a gear or a shape on a dataset checks first."""
        current = self._enter_in_context(call)
        if isinstance(current, int):
            return current
        model = self.models.get(model_id)
        entry = self.datasets.get(dataset)
        if model is None or entry is None:
            return self._violate(INVALID_PARAM, f"{call}: unknown model or dataset")
        return model, entry

    def _new_id(self) -> int:
        return next(self._ids)

    def leaks(self) -> list[str]:
        found = []
        for ptr, alloc in self.allocs.items():
            found.append(f"device memory {ptr:#x} ({alloc.size} bytes) not freed")
        for handle in self.data_buffers:
            found.append(f"data buffer {handle:#x} not destroyed")
        for handle in self.datasets:
            found.append(f"dataset {handle:#x} not destroyed")
        for handle in self.descs:
            found.append(f"model description {handle:#x} not destroyed")
        owned = {h for entry in self.datasets.values() for h in entry.out_descs}
        for handle in self.tensor_descs:
            if handle not in owned:
                found.append(f"tensor description {handle:#x} not destroyed")
        for model_id in self.models:
            found.append(f"model {model_id} not unloaded")
        for stream in self.streams:
            found.append(f"stream {stream:#x} not destroyed")
        for context in self.contexts:
            found.append(f"context {context:#x} not destroyed")
        for device in self.set_devices:
            found.append(f"device {device} not reset")
        return found

    def _desc_model(self, model_desc: int) -> Model | None:
        model_id = self.descs.get(model_desc)
        return self.models.get(model_id) if model_id is not None else None
