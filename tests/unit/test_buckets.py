"""Shape-bucketed batching, through the batcher's public submit() and the load-time checks."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from fake_executor import FakeExecutor, make_config, queued

from ge_serve.backends.base import LoadedModel, ShapeBucket
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(30)


class Recording(FakeExecutor):
    """Keeps every input it ran, whole; answers y = x * 2 and a per-row length."""

    def __init__(self) -> None:
        super().__init__("rec", blocked=True)
        self.inputs: list[dict[str, np.ndarray]] = []

    def execute(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.inputs.append({k: np.array(v) for k, v in inputs.items()})
        result = super().execute(inputs)
        result["mask_sum"] = inputs["mask"].sum(axis=1, keepdims=True)
        result["fixed"] = np.zeros((inputs["x"].shape[0], 4), dtype=np.float32)
        return result


def bucket_config(**params: str) -> model_config_pb2.ModelConfig:
    config = make_config(max_batch_size=8, parameters=params)
    for name, dtype in (("x", model_config_pb2.TYPE_FP32), ("mask", model_config_pb2.TYPE_INT64)):
        config.input.add(name=name, data_type=dtype, dims=[-1])
    config.output.add(name="y", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    config.output.add(name="mask_sum", data_type=model_config_pb2.TYPE_INT64, dims=[1])
    config.output.add(name="fixed", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    return config


NLP = {
    "bucket_inputs": "x:0,mask:0",
    "bucket_sizes": "4,8,16",
    "bucket_pad_values": "x:-1,mask:0",
}


def seq(value: float, length: int) -> WorkItem:
    x = np.full((1, length), value, dtype=np.float32)
    mask = np.ones((1, length), dtype=np.int64)
    return WorkItem(inputs={"x": x, "mask": mask}, batch_size=1)


def batcher_for(
    config: model_config_pb2.ModelConfig, fake: FakeExecutor, **loaded: Any
) -> DynamicBatcher:
    scheduler = build_scheduler(config, LoadedModel(executors=[fake], **loaded), SchedulerOptions())
    assert isinstance(scheduler, DynamicBatcher)
    return scheduler


async def test_lengths_of_one_bucket_batch_together_padded_and_trimmed_back() -> None:
    fake = Recording()
    batcher = batcher_for(bucket_config(**NLP), fake)
    try:
        blocker = asyncio.ensure_future(batcher.submit(seq(0, 16)))
        assert await fake.started() == 1
        lengths = (3, 2, 4, 7, 5)
        tasks = [
            asyncio.ensure_future(batcher.submit(seq(v + 1, n))) for v, n in enumerate(lengths)
        ]
        await queued(batcher, len(lengths))
        fake.open()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        await blocker
        # 3, 2 and 4 fit bucket 4; 7 and 5 bucket 8: two batches, never padded to 16.
        assert fake.shapes[1:] == [(3, 4), (2, 8)]
        first = fake.inputs[1]
        assert first["x"][0].tolist() == [1.0, 1.0, 1.0, -1.0]  # the pad value of x
        assert first["mask"].sum(axis=1).tolist() == [3, 2, 4]  # mask padded with 0
        for value, (length, result) in enumerate(zip(lengths, results, strict=True)):
            assert result["y"].shape == (1, length)  # trimmed back to its own length
            assert result["y"].tolist() == [[2.0 * (value + 1)] * length]
            assert result["mask_sum"].tolist() == [[length]]
            # A fixed output dim is never trimmed, even where it equals the bucket's size.
            assert result["fixed"].shape == (1, 4)
    finally:
        fake.open()
        await batcher.close(5.0)


async def test_a_request_longer_than_every_bucket_is_refused_naming_the_buckets() -> None:
    fake = Recording()
    fake.open()
    batcher = batcher_for(bucket_config(**NLP), fake)
    try:
        with pytest.raises(ServerError) as info:
            await batcher.submit(seq(1, 17))
        assert info.value.code is ErrorCode.INVALID_ARG
        assert "fits none of its shape buckets (x[1,17], mask[1,17])" in info.value.message
        assert "x[4], mask[4]; x[8], mask[8]; x[16], mask[16]" in info.value.message
        assert fake.batches == []
    finally:
        await batcher.close(5.0)


async def test_the_backends_buckets_are_the_only_shapes_executed() -> None:
    fake = Recording()
    fake.open()
    gears = tuple(ShapeBucket({"x": (-1, n), "mask": (-1, n)}) for n in (32, 64))
    config = bucket_config(bucket_pad_values="x:0")
    batcher = batcher_for(config, fake, shape_buckets=gears)
    try:
        result = await asyncio.wait_for(batcher.submit(seq(3, 40)), 10)
        assert fake.shapes == [(1, 64)]
        assert result["y"].shape == (1, 40)
    finally:
        await batcher.close(5.0)


async def test_without_padding_only_a_gears_exact_shape_runs() -> None:
    # Padding changes what a model that reads the padded positions computes (a mean over
    # them): such a model runs only the shapes its gears have, as on the NPU.
    fake = Recording()
    fake.open()
    gears = tuple(ShapeBucket({"x": (-1, n), "mask": (-1, n)}) for n in (32, 64))
    batcher = batcher_for(bucket_config(bucket_padding="false"), fake, shape_buckets=gears)
    try:
        result = await asyncio.wait_for(batcher.submit(seq(3, 64)), 10)
        assert fake.shapes == [(1, 64)] and result["y"].shape == (1, 64)
        with pytest.raises(ServerError) as info:
            await batcher.submit(seq(3, 40))
        assert info.value.code is ErrorCode.INVALID_ARG
        assert "matches none of its shape buckets (mask[1,40], x[1,40])" in info.value.message
        assert fake.shapes == [(1, 64)], "nothing padded ran"
    finally:
        await batcher.close(5.0)


async def test_the_adaptive_controller_prices_each_bucket_on_its_own() -> None:
    fake = Recording()
    fake.open()
    batcher = batcher_for(bucket_config(adaptive_batching="true", **NLP), fake)
    try:
        for length in (3, 12, 3):
            await asyncio.wait_for(batcher.submit(seq(1, length)), 10)
        snapshot = batcher.adaptive_snapshot()
        assert snapshot is not None
        # Bucket 1 (length 4) ran twice, bucket 3 (length 16) once: separate costs.
        assert set(snapshot["cost_us_by_bucket"]) == {0, 1, 3}
    finally:
        await batcher.close(5.0)


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"bucket_inputs": "x:0"}, "must set both 'bucket_inputs' and 'bucket_sizes'"),
        ({"bucket_inputs": "z:0", "bucket_sizes": "4"}, "names 'z', which is not one"),
        ({"bucket_inputs": "x:1", "bucket_sizes": "4"}, "must index its config dims [0, 0]"),
        ({"bucket_inputs": "x:0", "bucket_sizes": "4,big"}, "bucket 'big' must be one"),
        ({"bucket_inputs": "x:0", "bucket_sizes": "4x4"}, "bucket '4x4' must be one"),
        ({"bucket_pad_values": "x:0"}, "but has no shape buckets"),
        ({"bucket_padding": "false"}, "but has no shape buckets"),
        (
            {"bucket_inputs": "x:0", "bucket_sizes": "4", "bucket_padding": "sometimes"},
            "'bucket_padding' of model 'm' must be true or false, got 'sometimes'",
        ),
        (
            {"bucket_inputs": "x:0", "bucket_sizes": "4", "bucket_pad_values": "x:zero"},
            "pad value 'zero' of 'x' is not a number",
        ),
        (
            {"bucket_inputs": "x:0", "bucket_sizes": "4", "bucket_trim_outputs": "y:0"},
            "must be 'output:dim=input:dim' pairs",
        ),
    ],
)
def test_bad_bucket_parameters_fail_the_load(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(ServerError) as info:
        build_scheduler(bucket_config(**params), LoadedModel(executors=[]), SchedulerOptions())
    assert info.value.code is ErrorCode.INVALID_ARG
    assert fragment in info.value.message


def test_a_fixed_dim_cannot_be_padded() -> None:
    config = bucket_config(bucket_inputs="x:0", bucket_sizes="4")
    config.input[0].dims[0] = 8
    with pytest.raises(ServerError, match="is fixed at 8 in the config"):
        build_scheduler(config, LoadedModel(executors=[]), SchedulerOptions())


def test_configured_sizes_and_backend_gears_together_are_refused() -> None:
    gears = (ShapeBucket({"x": (-1, 8)}),)
    with pytest.raises(ServerError, match="has shape buckets from its backend"):
        build_scheduler(
            bucket_config(**NLP), LoadedModel(executors=[], shape_buckets=gears), SchedulerOptions()
        )


async def test_nd_gears_that_fix_the_batch_cap_and_pad_each_bucket_to_its_own() -> None:
    # GE ND gears "1,128;4,128;8,64": length 128 runs at batch 1 or 4, length 64 at 8.
    fake = Recording()
    gears = tuple(
        ShapeBucket({"x": (b, n), "mask": (b, n)}) for b, n in ((1, 128), (4, 128), (8, 64))
    )
    batcher = batcher_for(bucket_config(), fake, shape_buckets=gears)
    try:
        blocker = asyncio.ensure_future(batcher.submit(seq(0, 128)))
        assert await fake.started() == 1
        long = [asyncio.ensure_future(batcher.submit(seq(1, 100))) for _ in range(5)]
        short = [asyncio.ensure_future(batcher.submit(seq(2, 50))) for _ in range(3)]
        await queued(batcher, 8)
        fake.open()
        results = await asyncio.wait_for(asyncio.gather(*long, *short), 10)
        await blocker
    finally:
        fake.open()
        await batcher.close(5.0)
    # Never more than a bucket's largest batch; padded to one of its own batch sizes; the
    # 50-token requests in the 64 bucket, though its gears list it after 128's first.
    assert fake.shapes == [(1, 128), (4, 128), (1, 128), (8, 64)]
    assert [r["y"].shape for r in results] == [(1, 100)] * 5 + [(1, 50)] * 3
