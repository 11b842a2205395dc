"""Batching and queue policy read from ModelConfig: levels, timeouts, and load-time errors."""

from __future__ import annotations

import pytest
from fake_executor import make_config, set_policy

from ge_serve.backends.base import LoadedModel
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler, delay_count_from
from ge_serve.scheduler.policy import BatchPolicy, QueuePolicy, TimeoutAction
from ge_serve.server.errors import ErrorCode, ServerError


def test_levels_default_and_out_of_range_priorities() -> None:
    config = make_config(priority_levels=3, default_level=2)
    set_policy(config, 1, "DELAY", timeout_us=100, allow_override=True, max_queue_size=4)
    policy = BatchPolicy.from_config(config)
    assert [policy.level_for(p) for p in (0, 1, 2, 3, 4, 99)] == [2, 1, 2, 3, 2, 2]
    assert policy.levels[1] == QueuePolicy(TimeoutAction.DELAY, 100, True, 4)
    assert policy.levels[2] == QueuePolicy()  # the default policy fills unnamed levels
    assert BatchPolicy.from_config(make_config()).level_for(5) == 0


def test_timeout_override_rules() -> None:
    assert QueuePolicy(default_timeout_us=100).timeout_us(50) == 100
    allowed = QueuePolicy(default_timeout_us=100, allow_timeout_override=True)
    assert allowed.timeout_us(50) == 50
    assert allowed.timeout_us(500) == 100
    assert allowed.timeout_us(0) == 100
    # Triton's PolicyQueue: a default of 0 (no timeout) is not overridden.
    assert QueuePolicy(allow_timeout_override=True).timeout_us(70) == 0


def test_a_preferred_size_of_max_batch_size_is_no_preference() -> None:
    # What Triton's core fills in and the config API shows: loaded back, it batches as the
    # config without it did (the turn path, and a gear-capped largest batch).
    policy = BatchPolicy.from_config(make_config(max_batch_size=16, preferred=[16]), gears=(1, 8))
    assert policy.preferred_sizes == () and policy.max_size == 8
    assert BatchPolicy.from_config(make_config(preferred=[4, 8])).preferred_sizes == (4, 8)


def test_max_size_is_capped_by_the_largest_gear() -> None:
    assert BatchPolicy.from_config(make_config(max_batch_size=16), gears=(1, 4, 8)).max_size == 8
    assert BatchPolicy.from_config(make_config(max_batch_size=4), gears=(1, 8)).max_size == 4
    assert BatchPolicy.from_config(make_config(max_batch_size=0)).max_size == 1


@pytest.mark.parametrize(
    ("kwargs", "policies", "message"),
    [
        (
            {"priority_levels": 2, "default_level": 3},
            {},
            "default priority level must be in range [1, 2] for m",
        ),
        (
            {"priority_levels": 2, "default_level": 0},
            {},
            "default priority level must be in range [1, 2] for m",
        ),
        (
            {"priority_levels": 2, "default_level": 1},
            {3: "REJECT"},
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            {"max_batch_size": 4, "preferred": [8]},
            {},
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            {"preferred": [0]},
            {},
            "dynamic batching preferred size must be positive for m",
        ),
        (
            {"priority_levels": 2, "default_level": 1, "preserve_ordering": True},
            {},
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            {"preserve_ordering": True},
            {None: "DELAY"},
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
            "true for m",
        ),
    ],
)
def test_config_errors_are_invalid_arg_with_a_reason(
    kwargs: dict[str, object], policies: dict[int | None, str], message: str
) -> None:
    config = make_config(**kwargs)  # type: ignore[arg-type]
    for level, action in policies.items():
        set_policy(config, level, action, timeout_us=100)
    with pytest.raises(ServerError) as info:
        BatchPolicy.from_config(config)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == message


def test_adaptive_parameters() -> None:
    off = BatchPolicy.from_config(make_config())
    assert off.adaptive is None
    assert BatchPolicy.from_config(make_config(), adaptive_default=True).adaptive is not None
    opted_out = make_config(parameters={"adaptive_batching": "false"})
    assert BatchPolicy.from_config(opted_out, adaptive_default=True).adaptive is None
    config = make_config(
        priority_levels=2,
        default_level=2,
        parameters={
            "adaptive_batching": "TRUE",
            "adaptive_latency_budget_us": "4000",
            "adaptive_latency_budget_us.1": "500",
        },
    )
    adaptive = BatchPolicy.from_config(config).adaptive
    assert adaptive is not None
    assert adaptive.base_budget_us == 4000
    assert dict(adaptive.budgets_us) == {1: 500}


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"adaptive_batching": "maybe"}, "must be true or false"),
        ({"adaptive_latency_budget_us": "-5"}, "must be a positive integer"),
        ({"adaptive_latency_budget_us": "fast"}, "must be a positive integer"),
        ({"adaptive_latency_budget_us.3": "100"}, "names priority level '3'"),
        ({"adaptive_latency_budget_us.x": "100"}, "names priority level 'x'"),
    ],
)
def test_bad_adaptive_parameters_fail_the_load(parameters: dict[str, str], fragment: str) -> None:
    config = make_config(priority_levels=2, default_level=1, parameters=parameters)
    with pytest.raises(ServerError, match=fragment) as info:
        BatchPolicy.from_config(config)
    assert info.value.code is ErrorCode.INVALID_ARG


def test_budget_for_a_level_without_priority_levels_is_refused() -> None:
    config = make_config(parameters={"adaptive_latency_budget_us.1": "100"})
    with pytest.raises(ServerError, match="has no priority_levels"):
        BatchPolicy.from_config(config)


def test_delay_scheduler_env_reads_like_atoi() -> None:
    assert delay_count_from({}) == 0
    assert delay_count_from({"TRITONSERVER_DELAY_SCHEDULER": "4"}) == 4
    assert delay_count_from({"TRITONSERVER_DELAY_SCHEDULER": " 12abc"}) == 12
    assert delay_count_from({"TRITONSERVER_DELAY_SCHEDULER": "x"}) == 0


class _NoExecutor:
    """Never runs: the factory must refuse the config before it starts a slot."""

    def __init__(self) -> None:
        from ge_serve.backends.base import SlotInfo

        self.slot = SlotInfo(name="none", device="cpu")
        self.closed = False

    def execute(self, inputs: object) -> dict[str, object]:
        raise AssertionError("not reached")

    def close(self) -> None:
        self.closed = True


async def test_factory_picks_the_scheduler_and_refuses_bad_policies() -> None:
    loaded = LoadedModel(executors=[_NoExecutor()])  # type: ignore[list-item]
    plain = make_config()
    plain.ClearField("dynamic_batching")
    direct = build_scheduler(plain, loaded, SchedulerOptions())
    assert isinstance(direct, DirectScheduler)
    await direct.close(1.0)
    batcher = build_scheduler(make_config(), loaded, SchedulerOptions(adaptive_batching=True))
    assert isinstance(batcher, DynamicBatcher)
    assert batcher.controller is not None
    await batcher.close(1.0)
    with pytest.raises(ServerError, match="default priority level"):
        build_scheduler(make_config(priority_levels=2, default_level=5), loaded, SchedulerOptions())


UINT64_MAX = 2**64 - 1


def test_priority_levels_at_the_uint64_maximum_store_only_the_named_levels() -> None:
    config = make_config(priority_levels=UINT64_MAX, default_level=2**32)
    set_policy(config, 7, max_queue_size=3)
    policy = BatchPolicy.from_config(config)
    assert dict(policy.levels) == {2**32: QueuePolicy(), 7: QueuePolicy(max_queue_size=3)}
    assert [policy.level_for(p) for p in (0, 1, 2**32, UINT64_MAX)] == [2**32, 1, 2**32, UINT64_MAX]
    assert policy.queue_policy(5) == QueuePolicy()
    assert policy.listed_levels == (7, 2**32)
