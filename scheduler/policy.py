"""Batching and queue policy, derived once from a model's config at load.

Every check here runs before the scheduler exists, so a bad `dynamic_batching` block
fails the load with a reason a person can act on (Triton's wording where it has one).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ge_serve.backends.text_bool import parse_bool
from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import invalid_arg

# Model `parameters` keys that opt a model in to the adaptive controller.
ADAPTIVE_KEY = "adaptive_batching"
BUDGET_KEY = "adaptive_latency_budget_us"
# Up to this many priority levels, every level is listed for the adaptive controller to
# watch; beyond it, only the levels the config names (a constant, so that no config value
# makes the load take time or memory in proportion to it).
LISTED_LEVELS = 64


class TimeoutAction(enum.Enum):
    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's `ModelQueuePolicy`."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded

    @classmethod
    def from_proto(cls, proto: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
        delay = proto.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY
        return cls(
            timeout_action=TimeoutAction.DELAY if delay else TimeoutAction.REJECT,
            default_timeout_us=int(proto.default_timeout_microseconds),
            allow_timeout_override=bool(proto.allow_timeout_override),
            max_queue_size=int(proto.max_queue_size),
        )

    def timeout_us(self, requested_us: int) -> int:
        """The timeout a request gets: the level's default, or the request's own when the
        level allows overrides and it is shorter. As in Triton's PolicyQueue, a default of
        0 ("no timeout") is never overridden: no request timeout is less than 0."""
        timeout = self.default_timeout_us
        if self.allow_timeout_override and 0 < requested_us < timeout:
            timeout = requested_us
        return timeout


@dataclass(frozen=True, slots=True)
class AdaptivePolicy:
    """Opt-in settings for the adaptive controller.

    `budgets_us` holds each level's queueing-delay budget when one was configured; levels
    without one get `base_budget_us` scaled by level (level 1 shortest), or, when no base
    is configured either, a budget the controller derives from measured execution time.
    """

    base_budget_us: int = 0  # 0: derive from measured execution time
    budgets_us: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """Everything the dynamic batcher honours, from `max_batch_size` and `dynamic_batching`."""

    model: str
    # 0: the model has no batch dimension; every request runs alone.
    max_batch_size: int
    # The batcher never forms a batch larger than this (max_batch_size and the largest gear).
    max_size: int
    preferred_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_level: int = 0
    # The levels the config names, with their policies: the default level and those of
    # `priority_queue_policy`, or {0: default} without priorities. Levels are sparse: any
    # other level in [1, priority_levels] has `default_policy` and exists only while it
    # holds requests (queue.py), so a huge `priority_levels` costs nothing.
    levels: Mapping[int, QueuePolicy] = field(default_factory=lambda: {0: QueuePolicy()})
    default_policy: QueuePolicy = QueuePolicy()
    adaptive: AdaptivePolicy | None = None

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def queue_policy(self, level: int) -> QueuePolicy:
        """The policy of `level`: its own when the config names one, else the default."""
        return self.levels.get(level, self.default_policy)

    @property
    def listed_levels(self) -> tuple[int, ...]:
        """The levels worth enumerating (the adaptive controller watches these), in order:
        every level when there are at most LISTED_LEVELS, else only the named ones."""
        count = self.priority_levels
        if count <= LISTED_LEVELS:
            return tuple(range(1, count + 1)) if count else (0,)
        return tuple(sorted(self.levels))

    def level_for(self, priority: int) -> int:
        """A request's queue level: its priority, or the default for 0 and out of range."""
        if self.priority_levels == 0:
            return 0
        if 1 <= priority <= self.priority_levels:
            return priority
        return self.default_level

    @classmethod
    def from_config(
        cls,
        config: model_config_pb2.ModelConfig,
        gears: Sequence[int] = (),
        adaptive_default: bool = False,
    ) -> BatchPolicy:
        """Read and check the policy; raises ServerError(INVALID_ARG) with the reason."""
        name = config.name
        mbs = int(config.max_batch_size)
        dyn = config.dynamic_batching
        largest = max(gears) if gears else 0
        max_size = max(mbs, 1)
        if mbs > 0 and largest > 0:
            max_size = min(mbs, largest)
        preferred: list[int] = []
        for size in dyn.preferred_batch_size:
            if size <= 0:
                raise invalid_arg(f"dynamic batching preferred size must be positive for {name}")
            if size > mbs:
                raise invalid_arg(
                    f"dynamic batching preferred size must be <= max batch size for {name}"
                )
            preferred.append(int(size))
        # [max_batch_size] is what Triton's core fills in where a config names none (the
        # config API shows it): a full batch goes at once with or without it, so it reads as
        # no preference, and a config loaded back from the API batches as it did.
        if preferred == [mbs]:
            preferred = []
        levels_count = int(dyn.priority_levels)
        default_policy = QueuePolicy.from_proto(dyn.default_queue_policy)
        levels: dict[int, QueuePolicy]
        if levels_count == 0:
            levels = {0: default_policy}
            default_level = 0
        else:
            default_level = int(dyn.default_priority_level)
            if default_level == 0 or default_level > levels_count:
                raise invalid_arg(
                    f"default priority level must be in range [1, {levels_count}] for {name}"
                )
            for level in dyn.priority_queue_policy:
                if level == 0 or level > levels_count:
                    raise invalid_arg(
                        "priority queue policy must have priority level in range "
                        f"[1, {levels_count}] for {name}"
                    )
            # Only the named levels: never one per level (see `levels`).
            levels = {default_level: default_policy}
            for level, proto in dyn.priority_queue_policy.items():
                levels[int(level)] = QueuePolicy.from_proto(proto)
        if dyn.preserve_ordering:
            if levels_count > 1:
                raise invalid_arg(
                    "Only one priority level is allowed when 'preserve_ordering' is true "
                    f"for {name}"
                )
            for policy in (default_policy, *levels.values()):
                if policy.default_timeout_us and policy.timeout_action is TimeoutAction.DELAY:
                    raise invalid_arg(
                        "Queue policy can not have DELAY as timeout action when "
                        f"'preserve_ordering' is true for {name}"
                    )
        return cls(
            model=name,
            max_batch_size=mbs,
            max_size=max_size,
            preferred_sizes=tuple(sorted(set(preferred))),
            max_queue_delay_us=int(dyn.max_queue_delay_microseconds),
            preserve_ordering=bool(dyn.preserve_ordering),
            priority_levels=levels_count,
            default_level=default_level,
            levels=levels,
            default_policy=default_policy,
            adaptive=_adaptive(config, levels_count, adaptive_default),
        )


def _adaptive(
    config: model_config_pb2.ModelConfig, levels_count: int, server_default: bool
) -> AdaptivePolicy | None:
    params = {key: str(value.string_value) for key, value in config.parameters.items()}
    name = config.name
    enabled = server_default
    if ADAPTIVE_KEY in params:
        try:
            enabled = parse_bool(params[ADAPTIVE_KEY])
        except ValueError:
            raise invalid_arg(
                f"parameter '{ADAPTIVE_KEY}' of model '{name}' must be true or false, "
                f"got '{params[ADAPTIVE_KEY]}'"
            ) from None
    budgets: dict[int, int] = {}
    base = 0
    for key, value in params.items():
        if key == BUDGET_KEY:
            base = _positive_int(key, value, name)
        elif key.startswith(BUDGET_KEY + "."):
            suffix = key[len(BUDGET_KEY) + 1 :]
            level = int(suffix) if suffix.isdigit() else -1
            if levels_count == 0 or not 1 <= level <= levels_count:
                raise invalid_arg(
                    f"parameter '{key}' of model '{name}' names priority level '{suffix}', "
                    f"but the model's levels are [1, {levels_count}]"
                    if levels_count
                    else f"parameter '{key}' of model '{name}' names a priority level, but "
                    "the model has no priority_levels"
                )
            budgets[level] = _positive_int(key, value, name)
    if not enabled:
        return None
    return AdaptivePolicy(base_budget_us=base, budgets_us=budgets)


def _positive_int(key: str, value: str, model: str) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) <= 0:
        raise invalid_arg(
            f"parameter '{key}' of model '{model}' must be a positive integer "
            f"(microseconds), got '{value}'"
        )
    return int(text)
