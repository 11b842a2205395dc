"""Builds each loaded model version's scheduler from its config.

A generative model (backend `llm`): the generation engine's iteration-level scheduler
(GenerationScheduler). `sequence_batching`: the sequence batcher (SequenceBatcher). No
`dynamic_batching`: one request, one execution (DirectScheduler). Otherwise the dynamic
batcher, with the adaptive controller when the model or the server opts in. A scheduling
block that cannot be honoured fails the load with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ge_serve.backends.base import LoadedModel
from ge_serve.backends.llm.backend import MODEL_KEY, LlmModel
from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import invalid_arg

from .adaptive import AdaptiveController
from .base import Scheduler
from .batch import Shaper
from .batcher import DynamicBatcher
from .buckets import KEYS as BUCKET_KEYS
from .buckets import bucketing_for
from .direct import DirectScheduler
from .dispatch import ExecutorSlot, SlotPool
from .generation import GenerationScheduler
from .policy import BatchPolicy
from .ragged import ragged_for
from .ratelimit import RateLimiter, SlotNeeds, needs_of
from .sequence import SequenceBatcher
from .sequence_config import SequencePolicy

log = logging.getLogger(__name__)

DELAY_SCHEDULER_ENV = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_DELAY_SCHEDULER_ENV = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """Server-wide scheduler settings, fixed when the server starts."""

    # --adaptive-batching: the controller for every model with dynamic_batching, unless
    # the model says `adaptive_batching: "false"`.
    adaptive_batching: bool = False
    # TRITONSERVER_DELAY_SCHEDULER: hold each batcher until this many requests are queued.
    delay_count: int = 0
    # TRITONSERVER_BACKLOG_DELAY_SCHEDULER: the sequence batcher (direct) also waits for
    # this many requests in its backlog (only while delay_count holds it).
    backlog_delay_count: int = 0
    # --rate-limit execution_count: the server's one limiter; None: off.
    rate_limiter: RateLimiter | None = None


def slot_pool(
    config: model_config_pb2.ModelConfig, loaded: LoadedModel, options: SchedulerOptions
) -> SlotPool:
    needs: list[SlotNeeds | None] = []
    if options.rate_limiter is not None:
        needs = needs_of(config, [executor.slot.device_id for executor in loaded.executors])
        options.rate_limiter.check(needs)
    slots: list[ExecutorSlot] = []
    try:
        for executor in loaded.executors:
            slots.append(ExecutorSlot(executor, inline=loaded.thread_free))
    except RuntimeError as exc:  # threading's "can't start new thread"
        # The threads already started would otherwise outlive the failed load, and a
        # process short of threads fails every later load too.
        for slot in slots:
            slot.abandon()
        raise invalid_arg(
            f"model '{config.name}': could not start a thread for each of its "
            f"{len(loaded.executors)} instances, {len(slots)} started ({exc})"
        ) from exc
    if options.rate_limiter is None:
        return SlotPool(slots)
    return SlotPool(slots, options.rate_limiter, needs)


def delay_count_from(environ: Mapping[str, str], name: str = DELAY_SCHEDULER_ENV) -> int:
    """Read TRITONSERVER_DELAY_SCHEDULER (or `name`) the way Triton does (atoi: junk
    reads as 0)."""
    text = environ.get(name, "").strip()
    digits = ""
    for char in text:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else 0


def build_scheduler(
    config: model_config_pb2.ModelConfig, loaded: LoadedModel, options: SchedulerOptions
) -> Scheduler:
    """Raises ServerError(INVALID_ARG) for a policy that cannot work, before any slot
    thread starts, so the load fails cleanly."""
    generative = loaded.extra.get(MODEL_KEY)
    if isinstance(generative, LlmModel):
        # A generative model is scheduled by its own iteration loop (generation.py).
        return GenerationScheduler(generative)
    if config.HasField("sequence_batching"):
        return _sequence_batcher(config, loaded, options)
    buckets = bucketing_for(config, loaded.shape_buckets)
    ragged = ragged_for(config)
    shaper: Shaper | None = buckets or ragged
    if buckets is not None:
        log.info(
            "model '%s': shape buckets %s (%s)",
            config.name,
            buckets.describe(),
            "exact shapes only" if buckets.exact else "requests padded up to them",
        )
        if ragged is not None:
            raise invalid_arg(
                f"model '{config.name}': shape buckets cannot be combined with ragged "
                "batching (allow_ragged_batch, batch_input, batch_output)"
            )
    if ragged is not None:
        if loaded.gears:
            raise invalid_arg(
                f"model '{config.name}': ragged batching cannot pad to the executor's batch "
                f"gears {list(loaded.gears)}"
            )
        if loaded.per_request and (ragged.batch_inputs or ragged.batch_outputs):
            raise invalid_arg(
                f"model '{config.name}': batch_input and batch_output need a backend that "
                "takes merged batches; this model's backend takes requests one by one"
            )
    if not config.HasField("dynamic_batching"):
        pool = slot_pool(config, loaded, options)
        return DirectScheduler(pool, loaded.gears, config.max_batch_size > 0, shaper)
    policy = BatchPolicy.from_config(config, loaded.gears, options.adaptive_batching)
    controller = AdaptiveController(policy, loaded.gears) if policy.adaptive else None
    if controller is not None:
        log.info(
            "model '%s': adaptive batching, batches up to %d, budgets %s",
            config.name,
            policy.max_size,
            dict(policy.adaptive.budgets_us) if policy.adaptive else {},
        )
    if options.delay_count:
        log.info(
            "model '%s': batcher held until %d requests are queued (%s)",
            config.name,
            options.delay_count,
            DELAY_SCHEDULER_ENV,
        )
    pool = slot_pool(config, loaded, options)
    return DynamicBatcher(pool, policy, loaded.gears, controller, options.delay_count, shaper)


def _sequence_batcher(
    config: model_config_pb2.ModelConfig, loaded: LoadedModel, options: SchedulerOptions
) -> Scheduler:
    policy = SequencePolicy.from_config(config)
    if loaded.shape_buckets or any(key in config.parameters for key in BUCKET_KEYS):
        raise invalid_arg(
            f"model '{config.name}': shape buckets cannot be combined with sequence batching"
        )
    if ragged_for(config) is not None:
        raise invalid_arg(
            f"model '{config.name}': ragged batching (allow_ragged_batch, batch_input, "
            "batch_output) cannot be combined with sequence batching"
        )
    log.info(
        "model '%s': sequence batching (%s), %d slots per instance, idle after %d us",
        config.name,
        policy.strategy.value,
        policy.slots_per_instance,
        policy.idle_us,
    )
    delays = options.delay_count, options.backlog_delay_count
    if options.delay_count:
        log.info(
            "model '%s': sequence batcher held until %d requests are queued (%s; %s %d)",
            config.name,
            options.delay_count,
            DELAY_SCHEDULER_ENV,
            BACKLOG_DELAY_SCHEDULER_ENV,
            options.backlog_delay_count,
        )
    pool = slot_pool(config, loaded, options)
    return SequenceBatcher(pool, policy, loaded.gears, delays)
