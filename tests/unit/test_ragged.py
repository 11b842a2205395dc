"""Ragged batching through the batcher's public submit(): ragged inputs, every batch_input
kind, and the scatter batch output; and the ragged blocks that fail the load."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from fake_executor import FakeExecutor, queued
from google.protobuf import text_format

from ge_serve.backends.base import LoadedModel
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(30)

KINDS = {
    "COUNT": "BATCH_ELEMENT_COUNT",
    "ACC": "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "ACC0": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "MAX": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "SHAPE": "BATCH_ITEM_SHAPE",
    "FLAT": "BATCH_ITEM_SHAPE_FLATTEN",
}


def ragged_config(dynamic: bool = True) -> model_config_pb2.ModelConfig:
    batch_inputs = ",".join(
        f'{{ kind: {kind} target_name: "{target}" data_type: '
        f'{"TYPE_FP32" if target == "ACC" else "TYPE_INT32"} source_input: "x" }}'
        for target, kind in KINDS.items()
    )
    text = f"""
name: "rag"
max_batch_size: 8
input [
  {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "scale" data_type: TYPE_FP32 dims: [ 1 ] }}
]
output [
  {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "total" data_type: TYPE_FP32 dims: [ 1 ] }}
]
batch_input [ {batch_inputs} ]
batch_output [ {{ target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" }} ]
{"dynamic_batching { }" if dynamic else ""}
"""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


class RaggedModel(FakeExecutor):
    """y = x (flat, all requests) * 2, scattered back; total = scale * 3, per batch item
    (an ordinary output). Keeps every merged input."""

    def __init__(self) -> None:
        super().__init__("rag", blocked=True)
        self.inputs: list[dict[str, np.ndarray]] = []

    def execute(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.inputs.append({k: np.array(v) for k, v in inputs.items()})
        super().execute({"x": inputs["scale"]})  # the gate, and the batch it records
        return {"y": inputs["x"] * 2, "total": inputs["scale"] * 3}


def ask(values: list[float], scale: float, rows: int = 1) -> WorkItem:
    x = np.array([values] * rows, dtype=np.float32)
    return WorkItem(
        inputs={"x": x, "scale": np.full((rows, 1), scale, np.float32)}, batch_size=rows
    )


def build(config: model_config_pb2.ModelConfig, fake: FakeExecutor, **loaded: Any) -> Any:
    return build_scheduler(config, LoadedModel(executors=[fake], **loaded), SchedulerOptions())


async def test_requests_of_different_lengths_run_as_one_batch_with_every_batch_input() -> None:
    fake = RaggedModel()
    batcher = build(ragged_config(), fake)
    assert isinstance(batcher, DynamicBatcher)
    try:
        blocker = asyncio.ensure_future(batcher.submit(ask([9.0], 1.0)))
        assert await fake.started() == 1
        asks = [ask([1, 2, 3], 1.0), ask([4, 5], 10.0, rows=2), ask([6], 100.0)]
        tasks = [asyncio.ensure_future(batcher.submit(a)) for a in asks]
        await queued(batcher, 3)
        fake.open()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        await blocker
    finally:
        fake.open()
        await batcher.close(5.0)
    assert fake.sizes == [1, 4]  # three requests (four items) in one execution
    merged = fake.inputs[1]
    assert merged["x"].tolist() == [1, 2, 3, 4, 5, 4, 5, 6]  # flat, unpadded
    assert merged["COUNT"].tolist() == [3, 4, 1] and merged["COUNT"].dtype == np.int32
    assert merged["ACC"].tolist() == [3, 7, 8] and merged["ACC"].dtype == np.float32
    assert merged["ACC0"].tolist() == [0, 3, 7, 8]
    assert merged["MAX"].shape == (4,)
    assert merged["SHAPE"].tolist() == [[3], [2], [2], [1]]
    assert merged["FLAT"].tolist() == [3, 2, 2, 1]
    # Each request gets its own slice of the scattered output, in its own shape.
    assert results[0]["y"].tolist() == [[2, 4, 6]]
    assert results[1]["y"].tolist() == [[8, 10], [8, 10]]
    assert results[2]["y"].tolist() == [[12]]
    assert [r["total"].tolist() for r in results] == [[[3.0]], [[30.0], [30.0]], [[300.0]]]


async def test_a_model_without_dynamic_batching_still_gets_its_batch_inputs() -> None:
    fake = RaggedModel()
    fake.open()
    scheduler = build(ragged_config(dynamic=False), fake)
    assert isinstance(scheduler, DirectScheduler)
    try:
        result = await asyncio.wait_for(scheduler.submit(ask([1, 2], 2.0)), 10)
    finally:
        await scheduler.close(5.0)
    assert fake.inputs[0]["ACC0"].tolist() == [0, 2]
    assert result["y"].tolist() == [[2, 4]] and result["total"].tolist() == [[6.0]]


def edited(edit: Any) -> model_config_pb2.ModelConfig:
    config = ragged_config()
    edit(config)
    return config


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (
            edited(
                lambda c: c.batch_input[0].__setattr__("data_type", model_config_pb2.TYPE_INT64)
            ),
            "batch input data type must be TYPE_INT32 or TYPE_FP32 for rag",
        ),
        (
            edited(lambda c: c.batch_input[1].source_input.__setitem__(0, "nope")),
            "unknown source input name 'nope' for rag",
        ),
        (
            edited(lambda c: c.batch_input[0].source_input.append("x")),
            "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2 for rag",
        ),
        (
            edited(lambda c: c.batch_output[0].target_name.append("zzz")),
            "unknown target output name 'zzz' for rag",
        ),
        (
            edited(lambda c: c.batch_output[0].source_input.__setitem__(0, "nope")),
            "unknown source input name 'nope' for rag",
        ),
        (
            edited(lambda c: c.batch_output[0].source_input.append("x")),
            "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2 "
            "for rag",
        ),
        (edited(lambda c: c.__setattr__("max_batch_size", 0)), "need max_batch_size > 0"),
        (
            edited(
                lambda c: (
                    c.parameters["bucket_inputs"].__setattr__("string_value", "x:0"),
                    c.parameters["bucket_sizes"].__setattr__("string_value", "8"),
                )
            ),
            "shape buckets cannot be combined with ragged batching",
        ),
    ],
)
def test_ragged_blocks_that_cannot_be_honoured_fail_the_load(
    config: model_config_pb2.ModelConfig, fragment: str
) -> None:
    with pytest.raises(ServerError) as info:
        build(config, FakeExecutor.__new__(FakeExecutor))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert fragment in info.value.message


def test_ragged_batching_cannot_pad_to_batch_gears() -> None:
    with pytest.raises(ServerError, match="cannot pad to the executor's batch gears"):
        build(ragged_config(), FakeExecutor.__new__(FakeExecutor), gears=(1, 4))
