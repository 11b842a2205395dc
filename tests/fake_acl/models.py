"""The fake pyACL's acl.mdl calls: loading an OM, describing its tensors, datasets, and
execution on a stream (onnxruntime runs the model the OM wraps)."""

from __future__ import annotations

import base64
import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from . import om as om_format
from .dynamic import DynamicShapes
from .state import (
    ACL_DTYPES,
    DYNAMIC_INPUT,
    INVALID_FILE,
    INVALID_MODEL_ID,
    INVALID_PARAM,
    RT_INTERNAL,
    SUCCESS,
    Dataset,
    Model,
    TensorInfo,
)


class ModelCalls(DynamicShapes):
    """acl.mdl: models, their descriptions, datasets and execution."""

    # --- acl.mdl: models ----------------------------------------------------------------

    def mdl_load_from_file(self, model_path: str) -> tuple[int, int]:
        current = self._enter_in_context("acl.mdl.load_from_file")
        if isinstance(current, int):
            return 0, current
        try:
            data = om_format.read(Path(model_path))
        except (OSError, ValueError):
            return 0, self._violate(
                INVALID_FILE, f"acl.mdl.load_from_file: '{model_path}' is not an OM"
            )
        if data["soc_version"] != self.soc:
            return 0, self._violate(
                INVALID_FILE, f"OM built for {data['soc_version']}, the device is {self.soc}"
            )
        if data["onnx_b64"] is None:
            return 0, self._violate(INVALID_FILE, "this fake OM cannot be executed")
        gears = [int(g) for g in data["gears"]]
        rows = max(gears) if gears else 1

        def tensor(entry: dict[str, Any]) -> TensorInfo:
            dims = [int(d) for d in entry["dims"]]
            count = int(np.prod([rows if d < 0 else d for d in dims]))
            size = count * np.dtype(ACL_DTYPES[entry["dtype"]]).itemsize
            return TensorInfo(entry["name"], int(entry["dtype"]), dims, size)

        inputs = [tensor(e) for e in data["inputs"]]
        outputs = [tensor(e) for e in data["outputs"]]
        dynamic_index = None
        if gears:
            dynamic_index = len(inputs)
            inputs.append(TensorInfo(DYNAMIC_INPUT, 9, [1], 8))
        session = ort.InferenceSession(
            base64.b64decode(data["onnx_b64"]), providers=["CPUExecutionProvider"]
        )
        shape: dict[str, Any] = dict(data.get("shape") or {})
        if shape:
            sized = om_format.shaped_tensors(data, session)
            inputs = [TensorInfo(t["name"], t["dtype"], t["dims"], t["size"]) for t in sized[0]]
            outputs = [TensorInfo(t["name"], t["dtype"], t["dims"], t["size"]) for t in sized[1]]
            if shape["mode"] in ("dims", "hw"):
                dynamic_index = len(inputs)
                inputs.append(TensorInfo(DYNAMIC_INPUT, 9, [1], 8))
        model_id = next(self._model_ids)
        self.models[model_id] = Model(
            current[1], session, inputs, outputs, gears, dynamic_index, shape=shape
        )
        return model_id, SUCCESS

    def mdl_unload(self, model_id: int) -> int:
        current = self._enter_in_context("acl.mdl.unload")
        if isinstance(current, int):
            return current
        model = self.models.get(model_id)
        if model is None:
            return self._violate(INVALID_MODEL_ID, f"acl.mdl.unload({model_id}): not loaded")
        if model.running_on is not None:
            return self._violate(INVALID_PARAM, "acl.mdl.unload of a model that is still executing")
        del self.models[model_id]
        return SUCCESS

    def mdl_create_desc(self) -> int:
        if self._enter("acl.mdl.create_desc"):
            return 0
        handle = self._new_id()
        self.descs[handle] = None
        return handle

    def mdl_destroy_desc(self, model_desc: int) -> int:
        code = self._enter("acl.mdl.destroy_desc")
        if code:
            return code
        if self.descs.pop(model_desc, "missing") == "missing":
            return self._violate(INVALID_PARAM, "acl.mdl.destroy_desc of an unknown description")
        return SUCCESS

    def mdl_get_desc(self, model_desc: int, model_id: int) -> int:
        code = self._enter("acl.mdl.get_desc")
        if code:
            return code
        if model_desc not in self.descs or model_id not in self.models:
            return self._violate(INVALID_PARAM, "acl.mdl.get_desc with an unknown desc or model")
        self.descs[model_desc] = model_id
        return SUCCESS

    def mdl_get_num_inputs(self, model_desc: int) -> int:
        model = self._desc_model(model_desc)
        return len(model.inputs) if model else 0

    def mdl_get_num_outputs(self, model_desc: int) -> int:
        model = self._desc_model(model_desc)
        return len(model.outputs) if model else 0

    def _dims(
        self, tensors: list[TensorInfo] | None, index: int, call: str
    ) -> tuple[dict[str, Any], int]:
        code = self._enter(call)
        if code:
            return {}, code
        if tensors is None or not 0 <= index < len(tensors):
            return {}, self._violate(INVALID_PARAM, f"{call}: index {index} out of range")
        tensor = tensors[index]
        return {
            "name": tensor.name,
            "dimCount": len(tensor.dims),
            "dims": list(tensor.dims),
        }, SUCCESS

    def mdl_get_input_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        model = self._desc_model(model_desc)
        return self._dims(model.inputs if model else None, index, "acl.mdl.get_input_dims")

    def mdl_get_output_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        model = self._desc_model(model_desc)
        found, code = self._dims(model.outputs if model else None, index, "acl.mdl.get_output_dims")
        if not code:
            found["name"] = f"Node_{index}:{index}:{found['name']}"
        return found, code

    def mdl_get_input_data_type(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.inputs[index].dtype if model else -1

    def mdl_get_output_data_type(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.outputs[index].dtype if model else -1

    def mdl_get_input_size_by_index(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.inputs[index].size if model else 0

    def mdl_get_output_size_by_index(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.outputs[index].size if model else 0

    def mdl_get_input_name_by_index(self, model_desc: int, index: int) -> str:
        model = self._desc_model(model_desc)
        return model.inputs[index].name if model else ""

    def mdl_get_dynamic_batch(self, model_desc: int) -> tuple[dict[str, Any], int]:
        code = self._enter("acl.mdl.get_dynamic_batch")
        if code:
            return {}, code
        model = self._desc_model(model_desc)
        if model is None:
            return {}, self._violate(INVALID_PARAM, "acl.mdl.get_dynamic_batch: unknown desc")
        return {"batchCount": len(model.gears), "batch": list(model.gears)}, SUCCESS

    def mdl_get_input_index_by_name(self, model_desc: int, name: str) -> tuple[int, int]:
        code = self._enter("acl.mdl.get_input_index_by_name")
        if code:
            return 0, code
        model = self._desc_model(model_desc)
        if model is None:
            return 0, self._violate(INVALID_PARAM, "acl.mdl.get_input_index_by_name: unknown desc")
        for index, tensor in enumerate(model.inputs):
            if tensor.name == name:
                return index, SUCCESS
        return 0, INVALID_PARAM

    # --- acl.mdl: datasets and execution ------------------------------------------------

    def mdl_create_dataset(self) -> int:
        if self._enter("acl.mdl.create_dataset"):
            return 0
        handle = self._new_id()
        self.datasets[handle] = Dataset()
        return handle

    def mdl_destroy_dataset(self, dataset: int) -> int:
        code = self._enter("acl.mdl.destroy_dataset")
        if code:
            return code
        entry = self.datasets.pop(dataset, None)
        if entry is None:
            return self._violate(INVALID_PARAM, "acl.mdl.destroy_dataset of an unknown dataset")
        for handle in entry.out_descs:
            self.tensor_descs.pop(handle, None)
        return SUCCESS

    def mdl_add_dataset_buffer(self, dataset: int, data_buffer: int) -> tuple[int, int]:
        code = self._enter("acl.mdl.add_dataset_buffer")
        if code:
            return dataset, code
        entry = self.datasets.get(dataset)
        if entry is None or data_buffer not in self.data_buffers:
            return dataset, self._violate(
                INVALID_PARAM, "acl.mdl.add_dataset_buffer: unknown handle"
            )
        entry.buffers.append(data_buffer)
        return dataset, SUCCESS

    def mdl_get_dataset_num_buffers(self, dataset: int) -> int:
        entry = self.datasets.get(dataset)
        return len(entry.buffers) if entry else 0

    def mdl_get_dataset_buffer(self, dataset: int, index: int) -> int:
        entry = self.datasets.get(dataset)
        return entry.buffers[index] if entry and 0 <= index < len(entry.buffers) else 0

    def mdl_set_dynamic_batch_size(
        self, model_id: int, dataset: int, index: int, batch_size: int
    ) -> int:
        call = "acl.mdl.set_dynamic_batch_size"
        found = self._model_and_dataset(call, model_id, dataset)
        if isinstance(found, int):
            return found
        model, entry = found
        if model.dynamic_index is None:
            return self._violate(INVALID_PARAM, f"{call} on a model without batch gears")
        if index != model.dynamic_index:
            return self._violate(
                INVALID_PARAM, f"{call}: index {index} is not the {DYNAMIC_INPUT} input"
            )
        if batch_size not in model.gears:
            return self._violate(
                INVALID_PARAM, f"{call}: {batch_size} is not a gear of the model {model.gears}"
            )
        if index >= len(entry.buffers):
            return self._violate(INVALID_PARAM, f"{call}: the dataset has no buffer {index}")
        ptr, size = self.data_buffers[entry.buffers[index]]
        ctypes.memmove(ptr, np.array([batch_size], dtype=np.int64).ctypes.data, min(size, 8))
        entry.gear = batch_size
        return SUCCESS

    def mdl_execute_async(self, model_id: int, input: int, output: int, stream: int) -> int:
        call = "acl.mdl.execute_async"
        current = self._enter_in_context(call)
        if isinstance(current, int):
            return current
        model = self.models.get(model_id)
        if model is None:
            return self._violate(INVALID_MODEL_ID, f"{call}: model {model_id} is not loaded")
        entry = self.streams.get(stream)
        if entry is None:
            return self._violate(INVALID_PARAM, f"{call}: unknown stream")
        if entry.device != model.device or current[1] != model.device:
            return self._violate(
                INVALID_PARAM, f"{call}: model, stream and context differ in device"
            )
        if model.running_on is not None:
            return self._violate(
                INVALID_PARAM,
                f"{call}: model {model_id} is already executing on a stream; one loaded model "
                "runs on one stream at a time",
            )
        inputs = self.datasets.get(input)
        outputs = self.datasets.get(output)
        if inputs is None or outputs is None:
            return self._violate(INVALID_PARAM, f"{call}: unknown dataset")
        if len(inputs.buffers) != len(model.inputs) or len(outputs.buffers) != len(model.outputs):
            return self._violate(
                INVALID_PARAM, f"{call}: dataset buffer counts do not match the model"
            )
        shapes: list[list[int]] | None = None
        if model.shape:
            found = self.shaped_inputs(model, inputs, call)
            if isinstance(found, int):
                return found
            shapes = found
        if model.gears:
            if inputs.gear is None:
                return self._violate(INVALID_PARAM, f"{call}: no gear set on a dynamic-batch model")
            batch = inputs.gear
        else:
            batch = 1
        feeds: dict[str, Any] = {}
        data_index = 0
        for index, tensor in enumerate(model.inputs):
            if index == model.dynamic_index:
                continue
            dims = shapes[data_index] if shapes is not None else None
            data_index += 1
            array = self._read(inputs.buffers[index], tensor, batch, call, dims)
            if array is None:
                return INVALID_PARAM
            feeds[tensor.name] = array
        assert model.session is not None
        try:
            results = model.session.run([t.name for t in model.outputs], feeds)
        except Exception as exc:
            self.violations.append(f"{call}: model failed: {exc}")
            return RT_INTERNAL
        for index, (tensor, result) in enumerate(zip(model.outputs, results, strict=True)):
            ptr, size = self.data_buffers[outputs.buffers[index]]
            data: np.ndarray[Any, Any] = np.ascontiguousarray(
                result, dtype=ACL_DTYPES[tensor.dtype]
            )
            if data.nbytes > size:
                return self._violate(INVALID_PARAM, f"{call}: output buffer {index} too small")
            ctypes.memmove(ptr, data.ctypes.data, data.nbytes)
            entry.pending_ptrs.add(ptr)
        if model.shape:
            self.record_outputs(model, outputs, [list(np.shape(r)) for r in results])
        model.running_on = stream
        entry.inflight.append(model_id)
        self.executions += 1
        return SUCCESS

    def _read(
        self, data_buffer: int, tensor: TensorInfo, batch: int, call: str, shape: Any = None
    ) -> Any:
        ptr, size = self.data_buffers[data_buffer]
        dims = list(shape) if shape is not None else [batch if d < 0 else d for d in tensor.dims]
        dtype = np.dtype(ACL_DTYPES[tensor.dtype])
        need = int(np.prod(dims)) * dtype.itemsize
        if need > size:
            self._violate(INVALID_PARAM, f"{call}: input '{tensor.name}' buffer too small")
            return None
        raw = ctypes.string_at(ptr, need)
        return np.frombuffer(raw, dtype=dtype).reshape(dims)
