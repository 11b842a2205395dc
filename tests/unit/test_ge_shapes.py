"""Planning how a model's dims vary (backends/ge/shapes.py) and the simulated NPU's cost
model (backends/ge/sim_cost.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ge_serve.backends.ge.acl import TensorPlan
from ge_serve.backends.ge.shapes import (
    BATCH,
    DIMS,
    DYNAMIC,
    HW,
    RANGE,
    parse_input_shape,
    plan_shapes,
)
from ge_serve.backends.ge.sim_cost import DEFAULT_PROFILE, PROFILES, DeviceTimeline, parse_sim_cost

SEQ = (
    TensorPlan("ids", np.dtype(np.int64), (-1,)),
    TensorPlan("mask", np.dtype(np.int64), (-1,)),
)
IMAGE = (TensorPlan("x", np.dtype(np.float32), (3, -1, -1)),)


def test_nd_gears_fill_every_minus_one_in_order_and_compile_as_nd() -> None:
    plan = plan_shapes(
        {"ge.inputShape": "ids:-1,-1;mask:-1,-1", "ge.dynamicDims": "8,64,8,64;1,128,1,128"},
        SEQ,
        batching=True,
        max_batch_size=8,
    )
    assert plan.kind == DIMS
    # Smallest first, whatever order the config lists them in.
    assert plan.gears == (((1, 128), (1, 128)), ((8, 64), (8, 64)))
    assert plan.atc_flags == (("input_format", "ND"), ("dynamic_dims", "8,64,8,64;1,128,1,128"))
    assert plan.input_shape == "ids:-1,-1;mask:-1,-1"


def test_nd_gears_without_an_input_shape_come_from_the_config() -> None:
    plan = plan_shapes({"ge.dynamicDims": "1,16,1,16;4,16,4,16"}, SEQ, True, 4)
    assert plan.kind == DIMS and plan.input_shape == "ids:-1,-1;mask:-1,-1"


def test_one_value_per_gear_stays_batch_gears() -> None:
    assert plan_shapes({"ge.dynamicDims": "1;2;4"}, IMAGE[:0], True, 4).kind == BATCH
    fixed = (TensorPlan("x", np.dtype(np.float32), (3, 224, 224)),)
    assert plan_shapes({"ge.dynamicDims": "1,2,4"}, fixed, True, 4).kind == BATCH


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ge.inputShape": "ids:-1,-1;mask:-1,-1", "ge.dynamicDims": "1,16;4,16"},
         "has 2 value"),
        ({"ge.inputShape": "x:1,3,-1,-1", "ge.dynamicDims": "1,1", "ge.dynamicImageSize": "1,1"},
         "mutually exclusive"),
        ({"ge.inputShape": "x:8~1,3,32,32"}, "1 <= low <= high"),
        ({"ge.inputShape": "x:1,3,a,32"}, "is not a dim"),
        ({"ge.dynamicImageSize": "640"}, "is not height,width"),
    ],
)  # fmt: skip
def test_shapes_that_cannot_compile_are_clear_errors(options: dict[str, str], message: str) -> None:
    plans = IMAGE if "x:" in options.get("ge.inputShape", "x:") else SEQ
    with pytest.raises(ValueError, match=message):
        plan_shapes(options, plans, True, 1)


def test_unbounded_dims_without_gears_are_ge_dynamic_shape() -> None:
    # npu_ge's default mode: the config's -1 dims, the batch bounded by max_batch_size.
    plan = plan_shapes({}, SEQ, True, 8)
    assert plan.kind == DYNAMIC and plan.input_shape == "ids:1~8,-1;mask:1~8,-1"
    # A -1 with no upper bound in graph.ge.inputShape too, its bounded dims kept.
    plan = plan_shapes({"ge.inputShape": "x:1~8,3,32,-1"}, IMAGE, True, 8)
    assert plan.kind == DYNAMIC and plan.input_shape == "x:1~8,3,32,-1"
    assert plan_shapes({}, IMAGE, False, 0).input_shape == "x:3,-1,-1"


def test_image_size_gears_fill_height_and_width() -> None:
    plan = plan_shapes({"ge.dynamicImageSize": "960,960;640,640"}, IMAGE, True, 1)
    assert plan.kind == HW
    assert plan.gears == (((1, 3, 640, 640),), ((1, 3, 960, 960),))
    assert plan.input_shape == "x:1,3,-1,-1"


def test_ranges_keep_their_bounds() -> None:
    (shape,) = parse_input_shape("x:1~8,3,32~1280,32~1280")
    assert shape.dims == (-1, 3, -1, -1)
    assert shape.ranges == ((1, 8), (3, 3), (32, 1280), (32, 1280))
    plan = plan_shapes({"ge.inputShape": "x:1~8,3,32~1280,32~1280"}, IMAGE, True, 8)
    assert plan.kind == RANGE and plan.input_shape == "x:1~8,3,32~1280,32~1280"


def test_sim_cost_profiles_and_figures() -> None:
    default = parse_sim_cost("default")
    assert default is PROFILES[DEFAULT_PROFILE]
    # The published figures the default is derived from: 191 infer/s at batch 1 and
    # 1329 infer/s in merged batches of 32.
    assert 1e9 / default.duration_ns(1) == pytest.approx(191, rel=1e-3)
    assert 32e9 / default.duration_ns(32) == pytest.approx(1329, rel=1e-3)
    custom = parse_sim_cost("launch_us=100, per_sample_us=10")
    assert custom is not None and custom.duration_ns(4) == 140_000
    adjusted = parse_sim_cost("npu_ge_resnet50,launch_us=1000")
    assert adjusted is not None and adjusted.launch_us == 1000
    assert adjusted.per_sample_us == default.per_sample_us
    assert parse_sim_cost("") is None and parse_sim_cost("off") is None
    for bad, message in (("gpu", "unknown profile"), ("launch_us=1", "give per_sample_us"),
                         ("launch_us=x,per_sample_us=1", "must be a number"),
                         ("speed=2", "is not launch_us")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            parse_sim_cost(bad)


def test_a_device_timeline_runs_executions_one_after_another() -> None:
    timeline = DeviceTimeline()
    start = time.monotonic_ns()
    first = timeline.reserve(20_000_000)
    second = timeline.reserve(20_000_000)
    assert second - first == 20_000_000
    timeline.hold_until(second)
    assert time.monotonic_ns() - start >= 40_000_000
    timeline.hold_until(start)  # already past: an overrun
    assert timeline.overruns == 1 and timeline.executions == 2
