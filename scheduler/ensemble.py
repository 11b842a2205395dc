"""The ensemble scheduler: a DAG of steps over other models, with no executor slots of its own.

A request's tensors start as the ensemble's inputs. Each step is submitted as soon as every
tensor it reads exists, so steps that do not depend on each other run at once; its outputs
join the request's tensors under their ensemble names and may make other steps ready. The
tensors are the arrays themselves: a step's outputs are handed to the next step as they
came back, never copied here.

A step does not run its model itself. It goes through a `StepRunner`, which the server
injects: the runner enters the step's model exactly as a client request would (that
model's own scheduler, so dynamic batching merges steps of concurrent ensemble requests,
and that model's statistics). The scheduler therefore knows nothing of the lifecycle or the
core, and the model a step names is looked up for every request, so a composing model that
is reloaded is picked up by the next request without touching the ensemble.

A linear chain (one step ready, none running) awaits each step directly; tasks are made
only where steps can overlap.

Sequences pass through as in Triton's ensemble scheduler: every step request carries the
ensemble request's correlation ID and START / END flags, so a step model with
`sequence_batching` serves a sequence sent to the ensemble. A step model may answer with
the response parameters `sequence_id`, `sequence_start`, `sequence_end`; the tensors it
writes then carry those (START / END false unless given) to the steps that read them,
instead of its own request's. The ensemble's response echoes the three, as carried by its
output tensors, on every request, with or without a sequence.

Optional tensors pass as in Triton: an optional ensemble input the request leaves out, and
an output a step's model did not produce, are still "written" (Triton's placeholder, None
here), so the steps that read them run without that input (the step model's own checks
refuse it unless its input is optional too), and an ensemble output left so is missing
from the response. Only an output no step wrote at all is Triton's "unexpected deadlock".

A batch dimension is put in front of, or taken off, a tensor that passes between a model
(or the ensemble) that batches and one that does not, as Triton does (ensemble_shapes.py):
a non-batching ensemble over a batching step sends it a batch of 1 and answers without it.

An ensemble with a decoupled step is decoupled itself (its plan says so); its requests
run in ensemble_stream.py, which builds on the pieces here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from ge_serve.backends.base import ParamValue
from ge_serve.server.errors import ErrorCode, FailureReason, ServerError, invalid_arg
from ge_serve.server.inference.error_texts import request_tag

from .correlation import END_KEY, ID_KEY, START_KEY, CorrelationId, SequenceFlags
from .ensemble_prune import needed_steps, runs
from .ensemble_shapes import batch_reshape
from .inflight import InFlight
from .work import Array, Timings, WorkItem

log = logging.getLogger(__name__)

# How many sets of requested outputs keep their pruned step lists (a client can name any).
_PRUNE_CACHE = 64

# What a request that names no sequence carries to its steps: Triton's correlation ID 0
# (numeric) and no flags.
NO_SEQUENCE = SequenceFlags(0)


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    model_name: str
    # "" means the latest READY version, looked up per request (Triton's -1).
    model_version: str
    # (the step model's input, the ensemble tensor it reads), in config order.
    inputs: tuple[tuple[str, str], ...]
    # (the step model's output, the ensemble tensor it writes).
    outputs: tuple[tuple[str, str], ...]
    # The step model answers a request with any number of responses, each of which runs
    # the steps that read its outputs (ensemble_stream.py).
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    """A validated ensemble: its steps and the tensors it answers with."""

    name: str
    steps: tuple[EnsembleStep, ...]
    outputs: tuple[str, ...]
    # A step is decoupled, so the ensemble is: any number of responses per request.
    decoupled: bool = False
    # The ensemble's inputs: those a request leaves out (optional ones) are placeholders.
    inputs: tuple[str, ...] = ()
    # Whether the ensemble batches (max_batch_size > 0), and its outputs' config dims
    # (`reshape` where given): where a step's batching differs, a batch dimension of 1 is
    # taken off or put on its outputs (ensemble_shapes.py).
    batching: bool = False
    output_dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # Derived: for each step, how many of the tensors it reads are written by steps (the
    # ensemble's own inputs are there from the start), and which steps read each tensor.
    needs: tuple[int, ...] = field(init=False)
    readers: dict[str, tuple[int, ...]] = field(init=False)

    def __post_init__(self) -> None:
        written = {tensor for step in self.steps for _, tensor in step.outputs}
        needs = []
        readers: dict[str, list[int]] = {}
        for index, step in enumerate(self.steps):
            read = {tensor for _, tensor in step.inputs}
            needs.append(len(read & written))
            for tensor in read:
                readers.setdefault(tensor, []).append(index)
        object.__setattr__(self, "needs", tuple(needs))
        object.__setattr__(self, "readers", {t: tuple(s) for t, s in readers.items()})


@dataclass(slots=True)
class StepCall:
    """One step of one ensemble request, as the runner receives it."""

    model_name: str
    model_version: str
    inputs: dict[str, Array]
    priority: int = 0
    timeout_us: int = 0
    # The correlation ID and flags the step request carries (the ensemble request's, or
    # those a step before it answered with).
    sequence: SequenceFlags = NO_SEQUENCE
    # The ensemble request's ID and parameters (the sequence ones aside), which Triton
    # sets on every step request.
    request_id: str = ""
    parameters: Mapping[str, ParamValue] = field(default_factory=dict)
    # For each input, the batch size of the request that made its tensor (0: one that
    # does not batch), for the batch dimension fix-up into the step's model.
    batch_sizes: Mapping[str, int] = field(default_factory=dict)
    # A decoupled ensemble's request: its decoupled steps' compute times join its own
    # when each step's request is released, after its results (ensemble_stream.py).
    releases: StepReleases | None = None


class StepReleases:
    """The decoupled step requests of one ensemble request that are not yet released. A
    decoupled step's stream ends at its final flag, but its compute times are known only
    once its execution returns; the ensemble's request is released after its steps', as
    in Triton, with their times in its own."""

    def __init__(self, totals: Timings) -> None:
        self._totals = totals
        self._pending: set[asyncio.Future[None]] = set()

    def hold(self) -> StepRelease:
        release = StepRelease(self._totals, asyncio.get_running_loop().create_future())
        self._pending.add(release.future)
        return release

    async def wait(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending)


@dataclass(slots=True)
class StepRelease:
    """One decoupled step request's release: `done` with its timings, or `drop` when it
    failed before its release was set up."""

    totals: Timings
    future: asyncio.Future[None]

    def done(self, timings: Timings) -> None:
        if not self.future.done():
            self.totals.add_compute(timings)
            self.future.set_result(None)

    def drop(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


# An ensemble tensor: its array, or None where it is Triton's placeholder (an optional
# input left out, an output a step did not produce), read as a missing input.
Slot = Array | None


def present(slots: Mapping[str, Slot]) -> dict[str, Array]:
    """The tensors that hold an array (the placeholders left out)."""
    return {name: array for name, array in slots.items() if array is not None}


@dataclass(slots=True)
class StepResult:
    """A step model's answer: its outputs, that request's timings and its response
    parameters."""

    outputs: dict[str, Array]
    timings: Timings
    parameters: Mapping[str, ParamValue] = field(default_factory=dict)
    # Whether this is the step request's last response (a decoupled step's may not be).
    final: bool = True
    # The step request's batch size (0: its model does not batch).
    batch_size: int = 0


StepRunner = Callable[[StepCall], Awaitable[StepResult]]
# A decoupled step: every response of the step request, as each is produced.
StepStreamer = Callable[[StepCall], AsyncGenerator[StepResult, None]]


class EnsembleScheduler:
    def __init__(self, plan: EnsemblePlan, runner: StepRunner) -> None:
        self.plan = plan
        self._runner = runner
        self._in_flight = InFlight()
        # The steps each set of requested outputs needs (ensemble_prune.py).
        self._needed: dict[frozenset[str], tuple[bool, ...]] = {}

    def requested(self, item: WorkItem) -> tuple[str, ...]:
        """The outputs the request asks for, in the plan's order (all when it names none)."""
        plan = self.plan
        named = item.context.requested_outputs if item.context is not None else ()
        return tuple(name for name in plan.outputs if name in named) or plan.outputs

    def needed(self, requested: tuple[str, ...]) -> tuple[bool, ...] | None:
        """For each step, whether a request for `requested` runs it; None: every step."""
        plan = self.plan
        if len(requested) == len(plan.outputs):
            return None
        key = frozenset(requested)
        found = self._needed.get(key)
        if found is None:
            if len(self._needed) >= _PRUNE_CACHE:
                self._needed.clear()
            found = needed_steps(plan.steps, plan.outputs, plan.readers, requested)
            self._needed[key] = found
        return found

    @property
    def pending(self) -> int:
        return self._in_flight.pending

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        in_flight = self._in_flight
        in_flight.admit()
        try:
            outputs = await self._run(item)
        finally:
            in_flight.leave()
        # One ensemble request is one execution of the ensemble, as Triton counts it; its
        # compute times are the sums of its steps' (added as each step finished).
        item.timings.batch_size = item.batch_size
        item.timings.first_in_batch = True
        return outputs

    async def _run(self, item: WorkItem) -> dict[str, Array]:
        plan = self.plan
        requested = self.requested(item)
        needed = self.needed(requested)
        tensors: dict[str, Slot] = dict(item.inputs)
        for name in plan.inputs:
            tensors.setdefault(name, None)
        # The sequence each tensor a step wrote carries (the ensemble's inputs carry none).
        carried: dict[str, SequenceFlags] = {}
        # The batch size of the request that made each tensor (0: one without batching).
        sizes = dict.fromkeys(tensors, item.batch_size if plan.batching else 0)
        waiting = list(plan.needs)
        ready = [i for i, count in enumerate(waiting) if count == 0 and runs(needed, i)]
        running: dict[asyncio.Task[dict[str, Slot]], int] = {}
        try:
            while ready or running:
                if len(ready) == 1 and not running:
                    index = ready.pop()
                    produced = await self._step(index, tensors, carried, sizes, item)
                    ready.extend(self._written(index, produced, tensors, waiting, needed))
                    continue
                for index in ready:
                    step = self._step(index, tensors, carried, sizes, item)
                    task = asyncio.ensure_future(step)
                    running[task] = index
                ready.clear()
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = running.pop(task)
                    ready.extend(self._written(index, task.result(), tensors, waiting, needed))
        finally:
            # A failed step (or a cancelled request) stops the steps still running.
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        if any(name not in tensors for name in requested):
            # Triton's words and code (FinishEnsemble): the configuration's fault.
            context = item.context
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"in ensemble '{plan.name}', {request_tag(context.id if context else '')}"
                "unexpected deadlock, at least one output is not set while no more ensemble "
                "steps can be made",
                FailureReason.OTHER,
            )
        item.response_parameters = echo(item.sequence or NO_SEQUENCE, carried, requested)
        # Every output written (the response keeps the requested ones): with no step pruned,
        # the whole set, which the response cache may keep for any request. An output a
        # step did not produce is left out, as in Triton.
        written = {name: tensors.get(name) for name in plan.outputs}
        return self._outputs(present(written), sizes)

    def _outputs(self, outputs: dict[str, Array], sizes: Mapping[str, int]) -> dict[str, Array]:
        """The ensemble's outputs with a step's batch dimension taken off (or put on) where
        the ensemble's batching differs from that step's model's."""
        plan = self.plan
        for name, array in outputs.items():
            dims = plan.output_dims.get(name)
            if dims is None:
                continue
            shape = batch_reshape(dims, plan.batching, sizes.get(name, 0), array.shape)
            if shape != array.shape:
                outputs[name] = array.reshape(shape)
        return outputs

    async def _step(
        self,
        index: int,
        tensors: dict[str, Slot],
        carried: dict[str, SequenceFlags],
        sizes: dict[str, int],
        item: WorkItem,
    ) -> dict[str, Slot]:
        call = self._call(index, tensors, carried, sizes, item)
        try:
            result = await self._runner(call)
            written = answered_sequence(call.sequence, result.parameters)
        except ServerError as exc:
            raise self._failed(exc) from None
        return self._produced(index, result, written, carried, sizes, item)

    def _call(
        self,
        index: int,
        tensors: Mapping[str, Slot],
        carried: Mapping[str, SequenceFlags],
        sizes: Mapping[str, int],
        item: WorkItem,
        releases: StepReleases | None = None,
    ) -> StepCall:
        step = self.plan.steps[index]
        # A placeholder is an input the step request leaves out.
        inputs = present({name: tensors.get(tensor) for name, tensor in step.inputs})
        sequence = self._step_sequence(step, carried, item.sequence or NO_SEQUENCE)
        context = item.context
        return StepCall(
            step.model_name,
            step.model_version,
            inputs,
            item.priority,
            item.timeout_us,
            sequence,
            context.id if context is not None else "",
            context.parameters if context is not None else {},
            {name: sizes.get(tensor, 0) for name, tensor in step.inputs if tensor in sizes},
            releases,
        )

    def _failed(self, exc: ServerError) -> ServerError:
        """Triton's form: the step's own error, with the ensemble named in front. The
        ensemble's request, which its scheduler holds, fails whatever failed in the step (a
        full queue, a check, the step's backend): counted as OTHER, Triton's reason for
        every ensemble failure (core ensemble_scheduler.cc, RespondIfError)."""
        return ServerError(
            exc.code, f"in ensemble '{self.plan.name}', {exc.message}", FailureReason.OTHER
        )

    def _produced(
        self,
        index: int,
        result: StepResult,
        written: SequenceFlags,
        carried: dict[str, SequenceFlags],
        sizes: dict[str, int],
        item: WorkItem,
    ) -> dict[str, Slot]:
        """A step's answer as ensemble tensors, a placeholder for each output it did not
        produce (Triton's ConsumeResponse); its compute times join the request's."""
        outputs = result.outputs
        item.timings.add_compute(result.timings)
        step = self.plan.steps[index]
        produced = {tensor: outputs.get(name) for name, tensor in step.outputs}
        for tensor, array in produced.items():
            sizes[tensor] = result.batch_size
            if array is not None:
                carried[tensor] = written
        return produced

    def _step_sequence(
        self, step: EnsembleStep, carried: Mapping[str, SequenceFlags], request: SequenceFlags
    ) -> SequenceFlags:
        """The sequence a step request carries: that of the first tensor it reads that a
        step wrote, else the ensemble request's. Tensors that disagree are logged and the
        first kept, as Triton does."""
        chosen: SequenceFlags | None = None
        for _, tensor in step.inputs:
            found = carried.get(tensor)
            if found is None or found == chosen:
                continue
            if chosen is None:
                chosen = found
                continue
            log.error(
                "in ensemble '%s', different sequence parameters are set for '%s'; "
                "correlation ID %s, START %s, END %s is used",
                self.plan.name,
                step.model_name,
                chosen.id_text(),
                chosen.start,
                chosen.end,
            )
        return request if chosen is None else chosen

    def _written(
        self,
        index: int,
        produced: dict[str, Slot],
        tensors: dict[str, Slot],
        waiting: list[int],
        needed: tuple[bool, ...] | None,
    ) -> list[int]:
        """Record a finished step's tensors; return the steps that became ready (of those
        the request needs)."""
        tensors.update(produced)
        ready = []
        for tensor in produced:
            for reader in self.plan.readers.get(tensor, ()):
                waiting[reader] -= 1
                if waiting[reader] == 0 and runs(needed, reader):
                    ready.append(reader)
        return ready

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new requests and let those in flight finish within the timeout. There is
        nothing to free: the steps' models are loaded and unloaded on their own."""
        await self._in_flight.close(drain_timeout_s)


def answered_sequence(
    sequence: SequenceFlags, parameters: Mapping[str, ParamValue]
) -> SequenceFlags:
    """The sequence the tensors a step wrote carry: the step request's, unless its model
    answered with sequence parameters (then a flag it leaves out is false). Triton's
    messages for parameters of the wrong type."""
    if ID_KEY not in parameters and START_KEY not in parameters and END_KEY not in parameters:
        return sequence
    correlation = parameters.get(ID_KEY, sequence.correlation_id)
    if isinstance(correlation, bool) or not isinstance(correlation, int | str):
        raise invalid_arg(
            f"expected parameter '{ID_KEY}' to be TRITONSERVER_PARAMETER_INT or "
            "TRITONSERVER_PARAMETER_STRING"
        )
    flags = []
    for key in (START_KEY, END_KEY):
        value = parameters.get(key, False)
        if not isinstance(value, bool):
            raise invalid_arg(f"expect parameter '{key}' to be TRITONSERVER_PARAMETER_BOOL")
        flags.append(value)
    return SequenceFlags(correlation, flags[0], flags[1])


def echo(
    request: SequenceFlags, carried: Mapping[str, SequenceFlags], outputs: tuple[str, ...]
) -> dict[str, ParamValue]:
    """The ensemble response's sequence parameters: the sequence its outputs carry (they
    agree unless step models answered with different ones; the last output's wins, as the
    last of Triton's repeated parameters does). The ID is written in the type of the
    request's own, as Triton writes it: a string ID a step answered on a numeric request
    reads 0, a numeric one on a string request "" (SequenceId's empty other half)."""
    sequence = request
    for name in outputs:
        sequence = carried.get(name, sequence)
    correlation: CorrelationId = sequence.correlation_id
    if isinstance(request.correlation_id, str):
        correlation = correlation if isinstance(correlation, str) else ""
    else:
        correlation = correlation if isinstance(correlation, int) else 0
    return {ID_KEY: correlation, START_KEY: sequence.start, END_KEY: sequence.end}
