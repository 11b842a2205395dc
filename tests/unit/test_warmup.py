"""`model_warmup` samples (backends/warmup.py), and the host backend running them at load."""

from __future__ import annotations

import copy
import pickle
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from ge_helpers import EXAMPLES, SIMPLE_IO, make_model, spec_for
from google.protobuf import text_format
from modelgen import SIMPLE_SEQUENCE_CONFIG, identity_model, simple_sequence_model
from onnx import TensorProto, helper

from ge_serve.backends.base import DataRejected
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.warmup import warmup_samples
from ge_serve.protos import model_config_pb2

SIMPLE = EXAMPLES / "simple" / "1" / "model.onnx"


def config(text: str) -> model_config_pb2.ModelConfig:
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse(text, parsed)
    return parsed


def warmup(name: str, batch: int, inputs: str, count: int = 0) -> str:
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch} count: {count}\n{inputs} }} ]\n'


def entry(name: str, data: str, dtype: str = "TYPE_INT32", dims: str = "16") -> str:
    return f'inputs {{ key: "{name}" value: {{ data_type: {dtype} dims: [ {dims} ] {data} }} }}\n'


def test_zero_random_and_file_data(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "in1").write_bytes(np.arange(32, dtype=np.int32).tobytes())
    text = "max_batch_size: 4\n" + SIMPLE_IO
    text += warmup(
        "mixed", 2, entry("INPUT0", "random_data: true") + entry("INPUT1", 'input_data_file: "in1"')
    )
    (sample,) = warmup_samples(config(text), tmp_path)
    assert (sample.name, sample.batch_size, sample.count) == ("mixed", 2, 1)
    assert sample.inputs["INPUT0"].shape == (2, 16) and sample.inputs["INPUT0"].dtype == np.int32
    assert sample.inputs["INPUT1"].tolist() == np.arange(32).reshape(2, 16).tolist()
    text = "max_batch_size: 0\n" + SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ 2, 16 ]")
    text += warmup("zeros", 5, entry("INPUT0", "zero_data: true", dims="2, 16"), count=3)
    text = text.replace(
        "count: 3\n", "count: 3\n" + entry("INPUT1", "zero_data: true", dims="2, 16")
    )
    (sample,) = warmup_samples(config(text), tmp_path)
    assert sample.batch_size == 1 and sample.count == 3
    assert sample.inputs["INPUT0"].shape == (2, 16) and not sample.inputs["INPUT0"].any()


def test_strings_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    raw = b"".join(struct.pack("<I", len(v)) + v for v in (b"ab", b"", b"xyz"))
    (tmp_path / "warmup" / "s").write_bytes(raw)
    text = """max_batch_size: 0
input [ { name: "S" data_type: TYPE_STRING dims: [ 3 ] } ]
output [ { name: "O" data_type: TYPE_STRING dims: [ 3 ] } ]
""" + warmup("s", 1, entry("S", 'input_data_file: "s"', "TYPE_STRING", "3"))
    (sample,) = warmup_samples(config(text), tmp_path)
    assert sample.inputs["S"].tolist() == [b"ab", b"", b"xyz"]


def test_reshape_is_applied(tmp_path: Path) -> None:
    text = """max_batch_size: 2
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
""" + warmup("r", 2, entry("X", "zero_data: true", "TYPE_FP32", "4"))
    (sample,) = warmup_samples(config(text), tmp_path)
    assert sample.inputs["X"].shape == (2, 2, 2)


@pytest.mark.parametrize(
    ("inputs", "batch", "message"),
    [
        (entry("INPUT0", "zero_data: true"), 1, r"gives no data for input\(s\) \['INPUT1'\]"),
        (entry("NOPE", "zero_data: true"), 1, "names input 'NOPE', which the model lacks"),
        (entry("INPUT0", 'input_data_file: "gone"'), 1, "does not exist"),
        (
            entry("INPUT0", "zero_data: true") + entry("INPUT1", "zero_data: true"),
            9,
            "batch_size 9 exceeds max_batch_size 8",
        ),
    ],
)
def test_bad_warmup_is_a_clear_error(tmp_path: Path, inputs: str, batch: int, message: str) -> None:
    text = "max_batch_size: 8\n" + SIMPLE_IO + warmup("w", batch, inputs)
    with pytest.raises(ValueError, match=message):
        warmup_samples(config(text), tmp_path)


def test_the_host_backend_runs_warmup_before_ready(tmp_path: Path) -> None:
    inputs = entry("INPUT0", "zero_data: true") + entry("INPUT1", 'input_data_file: "in1"')
    body = "max_batch_size: 8\n" + SIMPLE_IO + warmup("w", 1, inputs)
    folder = make_model(tmp_path, "simple", body, SIMPLE)
    with pytest.raises(ValueError, match="warmup 'w': input data file"):
        OnnxRuntimeBackend().load(spec_for(folder))
    (folder / "warmup").mkdir()
    (folder / "warmup" / "in1").write_bytes(b"\0" * 3)  # too short for 16 INT32
    with pytest.raises(ValueError, match="has 3 bytes, input 'INPUT1' of shape"):
        OnnxRuntimeBackend().load(spec_for(folder))
    (folder / "warmup" / "in1").write_bytes(np.ones(16, np.int32).tobytes())
    loaded = OnnxRuntimeBackend().load(spec_for(folder))
    assert len(loaded.executors) == 1


def test_bf16_inputs_warm_up_on_the_host_backend(tmp_path: Path) -> None:
    text = """max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_BF16 dims: [ 2 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_BF16 dims: [ 2 ] } ]
"""
    for data in ("zero_data: true", "random_data: true", 'input_data_file: "x"'):
        text += warmup("w", 2, entry("INPUT", data, "TYPE_BF16", "2"))
    folder = make_model(tmp_path, "bf", text, onnx_model=identity_model(TensorProto.BFLOAT16))
    (folder / "warmup").mkdir()
    (folder / "warmup" / "x").write_bytes(np.array([1, 2, 3, 4], ml_dtypes.bfloat16).tobytes())
    zero, rand, from_file = warmup_samples(spec_for(folder).config, folder)
    assert zero.inputs["INPUT"].dtype == ml_dtypes.bfloat16 and not zero.inputs["INPUT"].any()
    assert rand.inputs["INPUT"].shape == (2, 2)
    assert from_file.inputs["INPUT"].astype(np.float32).tolist() == [[1, 2], [3, 4]]
    loaded = OnnxRuntimeBackend().load(spec_for(folder))
    assert len(loaded.executors) == 1


def test_a_sequence_model_warms_up_with_its_control_inputs(tmp_path: Path) -> None:
    # As qa L0_warmup: the sample gives START and READY, which the scheduler feeds a
    # client's request; the backend runs it as Triton's warmup hands it over.
    controls = entry("START", "zero_data: true", dims="1") + entry(
        "READY", "zero_data: true", dims="1"
    )
    inputs = entry("INPUT", "zero_data: true", dims="1") + controls
    text = SIMPLE_SEQUENCE_CONFIG.replace('name: "simple_sequence"\n', "") + warmup(
        "seq", 8, inputs, 2
    )
    folder = make_model(tmp_path, "simple_sequence", text, onnx_model=simple_sequence_model())
    (sample,) = warmup_samples(spec_for(folder).config, folder)
    assert sorted(sample.inputs) == ["INPUT", "READY", "START"]
    assert sample.inputs["START"].shape == (8, 1)
    loaded = OnnxRuntimeBackend().load(spec_for(folder))
    assert len(loaded.executors) == 1
    # A name that is neither a model input nor fed by the scheduler is still refused.
    bad = text.replace('key: "READY"', 'key: "NOPE"')
    with pytest.raises(ValueError, match="names input 'NOPE', which the model lacks"):
        warmup_samples(config(bad), folder)


def test_a_sample_whose_data_the_model_refuses_fails_the_load_naming_the_sample(
    tmp_path: Path,
) -> None:
    # The sample's index is past the table's end: onnxruntime's refusal of a request's
    # data, here the config's to mend.
    table = helper.make_tensor("T", TensorProto.FLOAT, [3], [0.0, 1.0, 2.0])
    gather = helper.make_node("Gather", ["T", "INDEX"], ["VALUE"], name="lookup")
    graph = helper.make_graph(
        [gather],
        "g",
        [helper.make_tensor_value_info("INDEX", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("VALUE", TensorProto.FLOAT, [1])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    text = """max_batch_size: 0
input [ { name: "INDEX" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "VALUE" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
    text += warmup("past", 1, entry("INDEX", 'input_data_file: "i"', "TYPE_INT64", "1"))
    folder = make_model(tmp_path, "lookup", text, onnx_model=model)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "i").write_bytes(np.array([9], np.int64).tobytes())
    with pytest.raises(RuntimeError) as failed:
        OnnxRuntimeBackend().load(spec_for(folder))
    said = str(failed.value)
    assert "warmup 'past' failed on " in said
    assert ": the model could not run on the sample's data: Gather node 'lookup': " in said
    assert "request" not in said
    (folder / "warmup" / "i").write_bytes(np.array([2], np.int64).tobytes())
    assert len(OnnxRuntimeBackend().load(spec_for(folder)).executors) == 1


def test_a_copied_refusal_keeps_its_wording_and_what_was_added() -> None:
    refused = DataRejected("Gather node 'lookup': index out of bounds")
    refused.add_note("in ensemble 'pipe'")
    for copied in (copy.copy(refused), pickle.loads(pickle.dumps(refused))):
        assert str(copied) == str(refused) and copied.refusal == refused.refusal
        assert copied.__notes__ == ["in ensemble 'pipe'"]
