"""The fake pyACL's dynamic shapes: ND gears, image-size gears and shape ranges.

Part of `FakeAcl` (core.py), on the state of state.py. It enforces the contract of each
call the way pyACL documents it:

- `acl.mdl.get_input_dynamic_gear_count(desc, -1)`, `get_input_dynamic_dims(desc, -1,
  count)`, `get_dynamic_hw(desc, -1)`: the reserved index must be -1, the count must be
  the model's; gears come back as pyACL gives them (every input's dims in a row; [h, w]);
- `acl.mdl.get_input_dims_range(desc, i)`: (low, high) per dim;
- `set_input_dynamic_dims(model, dataset, index, dims)`: `dims` a dict with an int
  `dimCount` and a list of ints `dims`, on the `ascend_mbatch_shape_data` index, one of
  the model's gears, on an ND-gear model only;
- `set_dynamic_hw_size(model, dataset, index, h, w)`: ints, one of the model's gears;
- `create_tensor_desc(type, dims, format)` / `set_dataset_tensor_desc(dataset, desc, i)`:
  dims within the model's ranges, checked when it executes; every data input of a range
  model needs one before it executes;
- after an execution: `get_dataset_tensor_desc(outputs, i)` (range models) and
  `get_cur_output_dims(desc, i)` (gear models) give the output shapes, and only then;
- `acl.mdl.query_size(path)`: the work and weight bytes of an OM file.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from . import om as om_format
from .state import INVALID_FILE, INVALID_PARAM, SUCCESS, AclState, Dataset, Model


class DynamicShapes(AclState):
    """The calls of FakeAcl that dynamic shapes need (see the module docstring)."""

    # --- what a loaded model reports -----------------------------------------------------

    def mdl_get_input_dynamic_gear_count(self, model_desc: int, index: int) -> tuple[int, int]:
        call = "acl.mdl.get_input_dynamic_gear_count"
        code = self._enter(call)
        if code:
            return 0, code
        model = self._desc_model(model_desc)
        if model is None or index != -1:
            return 0, self._violate(INVALID_PARAM, f"{call}: unknown desc or index {index} != -1")
        return (len(model.shape["gears"]) if model.shape.get("mode") == "dims" else 0), SUCCESS

    def mdl_get_input_dynamic_dims(
        self, model_desc: int, index: int, gear_count: int
    ) -> tuple[list[dict[str, Any]], int]:
        call = "acl.mdl.get_input_dynamic_dims"
        code = self._enter(call)
        if code:
            return [], code
        model = self._desc_model(model_desc)
        if model is None or index != -1 or model.shape.get("mode") != "dims":
            return [], self._violate(INVALID_PARAM, f"{call}: not an ND-gear model, or index != -1")
        if gear_count != len(model.shape["gears"]):
            return [], self._violate(INVALID_PARAM, f"{call}: gear_count {gear_count} is wrong")
        rows = [_row(shapes) for shapes in model.shape["full"]]
        return [{"name": "", "dimCount": len(r), "dims": list(r)} for r in rows], SUCCESS

    def mdl_get_dynamic_hw(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        call = "acl.mdl.get_dynamic_hw"
        code = self._enter(call)
        if code:
            return {}, code
        model = self._desc_model(model_desc)
        if model is None or index != -1:
            return {}, self._violate(INVALID_PARAM, f"{call}: unknown desc or index {index} != -1")
        gears = model.shape["gears"] if model.shape.get("mode") == "hw" else []
        return {"hwCount": len(gears), "hw": [list(g) for g in gears]}, SUCCESS

    def mdl_get_input_dims_range(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        call = "acl.mdl.get_input_dims_range"
        code = self._enter(call)
        if code:
            return {}, code
        model = self._desc_model(model_desc)
        if model is None or not 0 <= index < len(model.inputs):
            return {}, self._violate(INVALID_PARAM, f"{call}: unknown desc or index {index}")
        if model.shape.get("mode") != "range":
            dims = model.inputs[index].dims
            if any(d < 0 for d in dims):  # gears, not ranges: pyACL reports none
                return {"rangeCount": 0, "range": []}, SUCCESS
            return {"rangeCount": len(dims), "range": [[d, d] for d in dims]}, SUCCESS
        ranges = model.shape["ranges"][index]
        return {"rangeCount": len(ranges), "range": [list(r) for r in ranges]}, SUCCESS

    def mdl_query_size(self, model_path: str) -> tuple[int, int, int]:
        call = "acl.mdl.query_size"
        code = self._enter(call)
        if code:
            return 0, 0, code
        try:
            data = om_format.read_path(model_path)
        except (OSError, ValueError):
            return 0, 0, self._violate(INVALID_FILE, f"{call}: '{model_path}' is not an OM")
        if data["onnx_b64"] is None:
            return 0, 0, SUCCESS
        model = onnx.load_from_string(base64.b64decode(data["onnx_b64"]))
        weight = sum(len(t.raw_data) or 4 * int(np.prod(t.dims)) for t in model.graph.initializer)
        return 64 * 1024, max(weight, 1), SUCCESS

    # --- selecting a gear or describing shapes -------------------------------------------

    def _shape_model(
        self, call: str, model_id: int, dataset: int, mode: str
    ) -> tuple[Model, Dataset] | int:
        found = self._model_and_dataset(call, model_id, dataset)
        if isinstance(found, int):
            return found
        model, entry = found
        if model.shape.get("mode") != mode:
            return self._violate(INVALID_PARAM, f"{call} on a model that is not {mode}-shaped")
        return model, entry

    def mdl_set_input_dynamic_dims(self, model_id: int, dataset: int, index: int, dims: Any) -> int:
        call = "acl.mdl.set_input_dynamic_dims"
        found = self._shape_model(call, model_id, dataset, "dims")
        if isinstance(found, int):
            return found
        model, entry = found
        if (
            not isinstance(dims, dict)
            or not isinstance(dims.get("dimCount"), int)
            or not isinstance(dims.get("dims"), list)
            or not all(isinstance(d, int) for d in dims["dims"])
        ):
            return self._violate(
                INVALID_PARAM, f"{call}: dims must be {{'dimCount': int, 'dims': [int]}}"
            )
        if index != model.dynamic_index:
            return self._violate(INVALID_PARAM, f"{call}: index {index} is not the gear input")
        row = list(dims["dims"])[: dims["dimCount"]]
        rows = [_row(shapes) for shapes in model.shape["full"]]
        if dims["dimCount"] != len(dims["dims"]) or row not in rows:
            return self._violate(INVALID_PARAM, f"{call}: {row} is not a gear of the model {rows}")
        entry.gear = rows.index(row)
        return SUCCESS

    def mdl_set_dynamic_hw_size(
        self, model_id: int, dataset: int, index: int, height: int, width: int
    ) -> int:
        call = "acl.mdl.set_dynamic_hw_size"
        found = self._shape_model(call, model_id, dataset, "hw")
        if isinstance(found, int):
            return found
        model, entry = found
        if not isinstance(height, int) or not isinstance(width, int):
            return self._violate(INVALID_PARAM, f"{call}: height and width must be ints")
        if index != model.dynamic_index:
            return self._violate(INVALID_PARAM, f"{call}: index {index} is not the gear input")
        gears = [list(g) for g in model.shape["gears"]]
        if [height, width] not in gears:
            return self._violate(
                INVALID_PARAM, f"{call}: {height}x{width} is not a gear of the model {gears}"
            )
        entry.gear = gears.index([height, width])
        return SUCCESS

    def create_tensor_desc(self, data_type: int, dims: Sequence[int], fmt: int) -> int:
        if self._enter("acl.create_tensor_desc"):
            return 0
        if not isinstance(data_type, int) or not isinstance(fmt, int):
            self._violate(INVALID_PARAM, "acl.create_tensor_desc: type and format must be ints")
            return 0
        if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
            self._violate(INVALID_PARAM, "acl.create_tensor_desc: dims must be a list of ints")
            return 0
        handle = self._new_id()
        self.tensor_descs[handle] = (data_type, list(dims), fmt)
        return handle

    def destroy_tensor_desc(self, tensor_desc: int) -> int:
        if self.tensor_descs.pop(tensor_desc, None) is None:
            return self._violate(INVALID_PARAM, "acl.destroy_tensor_desc of an unknown desc")
        for entry in self.datasets.values():
            if tensor_desc in entry.tensor_descs.values():
                return self._violate(
                    INVALID_PARAM, "acl.destroy_tensor_desc while a dataset still holds it"
                )
        return SUCCESS

    def get_tensor_desc_num_dims(self, tensor_desc: int) -> int:
        found = self.tensor_descs.get(tensor_desc)
        return len(found[1]) if found else 0

    def get_tensor_desc_dim_v2(self, tensor_desc: int, index: int) -> tuple[int, int]:
        found = self.tensor_descs.get(tensor_desc)
        if found is None or not 0 <= index < len(found[1]):
            return 0, self._violate(INVALID_PARAM, "acl.get_tensor_desc_dim_v2: bad desc or index")
        return found[1][index], SUCCESS

    def mdl_set_dataset_tensor_desc(
        self, dataset: int, tensor_desc: int, index: int
    ) -> tuple[int, int]:
        call = "acl.mdl.set_dataset_tensor_desc"
        code = self._enter(call)
        if code:
            return dataset, code
        entry = self.datasets.get(dataset)
        if entry is None or tensor_desc not in self.tensor_descs:
            return dataset, self._violate(INVALID_PARAM, f"{call}: unknown dataset or desc")
        if not 0 <= index < len(entry.buffers):
            return dataset, self._violate(
                INVALID_PARAM, f"{call}: the dataset has no input {index}"
            )
        # The dataset keeps the pointer; the caller still owns (and destroys) the desc.
        entry.tensor_descs[index] = tensor_desc
        return dataset, SUCCESS

    def mdl_get_dataset_tensor_desc(self, dataset: int, index: int) -> int:
        entry = self.datasets.get(dataset)
        if entry is None or entry.out_shapes is None or not 0 <= index < len(entry.out_shapes):
            self._violate(
                INVALID_PARAM,
                "acl.mdl.get_dataset_tensor_desc before an execution produced that output",
            )
            return 0
        return int(entry.out_descs[index])

    def mdl_get_cur_output_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        call = "acl.mdl.get_cur_output_dims"
        code = self._enter(call)
        if code:
            return {}, code
        model = self._desc_model(model_desc)
        if model is None or model.last_outputs is None or not 0 <= index < len(model.outputs):
            return {}, self._violate(INVALID_PARAM, f"{call} before the model executed")
        dims = model.last_outputs[index]
        return {"name": model.outputs[index].name, "dimCount": len(dims), "dims": dims}, SUCCESS

    # --- at execution --------------------------------------------------------------------

    def shaped_inputs(self, model: Any, inputs: Any, call: str) -> list[list[int]] | int:
        """The data input shapes of an execution, or the error code of a broken rule."""
        mode = model.shape.get("mode")
        data = [i for i in range(len(model.inputs)) if i != model.dynamic_index]
        if mode in ("dims", "hw"):
            if inputs.gear is None:
                return self._violate(INVALID_PARAM, f"{call}: no gear set on a {mode}-gear model")
            return [list(s) for s in model.shape["full"][inputs.gear]]
        shapes = []
        for index in data:
            handle = inputs.tensor_descs.get(index)
            if handle is None or handle not in self.tensor_descs:
                return self._violate(
                    INVALID_PARAM, f"{call}: input {index} of a range model has no tensor desc"
                )
            dims = self.tensor_descs[handle][1]
            ranges = model.shape["ranges"][index]
            # A high of -1: no upper bound (an OM compiled for GE dynamic shape).
            if len(dims) != len(ranges) or any(
                d < lo or (hi >= 0 and d > hi) for d, (lo, hi) in zip(dims, ranges, strict=True)
            ):
                return self._violate(
                    INVALID_PARAM, f"{call}: input {index} dims {dims} are outside {ranges}"
                )
            shapes.append(list(dims))
        return shapes

    def record_outputs(self, model: Any, outputs: Any, shapes: list[list[int]]) -> None:
        model.last_outputs = shapes
        for handle in outputs.out_descs:
            self.tensor_descs.pop(handle, None)
        outputs.out_descs = []
        for shape in shapes:
            handle = self._new_id()
            self.tensor_descs[handle] = (0, list(shape), 2)
            outputs.out_descs.append(handle)
        outputs.out_shapes = shapes


def _row(shapes: list[list[int]]) -> list[int]:
    """Every input's dims in a row, as pyACL gives an ND gear."""
    return [d for shape in shapes for d in shape]
