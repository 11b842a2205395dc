"""A decoupled ensemble: one with a decoupled step, answering a request any number of times.

As in Triton's ensemble scheduler (core ensemble_scheduler.cc): every response of a
decoupled step is one more set of the tensors it writes, and runs the steps that read
them; a step runs once for each set of its inputs that belong together. The ensemble
sends a response each time its outputs are all there for one set, and its final flag once
no step of the request is running or can run: with its last response when that response
ends the request, else on its own (also when no response was sent at all).

Sets are told apart by a key: the ensemble's inputs have the key (), the i-th response of
a decoupled step run on key K writes under K + (i,), and any other step writes under the
key it ran on. The load-time check (a step reads tensors from one decoupled origin, and
so do the outputs) makes the key spaces of a step's inputs the same, so a step reads the
tensors of one key. Triton pairs them by arrival order per tensor instead; the two agree
unless steps after a decoupled one finish out of order, where the key keeps the
responses of one origin together.

The responses go to the request's sink (`item.context.responses`), which the core's
decoupled path reads; a failure raises from `submit`, which that path sends as the
request's final, error response after those already sent. A failing step stops the
steps still running at once (Triton lets them finish, then sends the same error).
Cancelling the request (the client went away) cancels every step in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from ge_serve.backends.base import ParamValue, ResponseSink
from ge_serve.server.errors import ErrorCode, ServerError

from .correlation import SequenceFlags
from .ensemble import (
    NO_SEQUENCE,
    EnsemblePlan,
    EnsembleScheduler,
    Slot,
    StepCall,
    StepReleases,
    StepResult,
    StepRunner,
    StepStreamer,
    answered_sequence,
    echo,
    present,
)
from .ensemble_prune import runs
from .work import Array, WorkItem

Key = tuple[int, ...]


@dataclass(slots=True)
class _Event:
    """What a running step reports: tensors it wrote under `key`, that it is done, or
    that it failed."""

    index: int
    key: Key
    produced: dict[str, Slot]
    done: bool
    error: BaseException | None = None


@dataclass(slots=True)
class StepRoutes:
    """How ensemble steps reach their models, set by the core that serves them (the
    scheduler knows nothing of it): `runner` for a step answering once, `streamer` for a
    decoupled step's responses."""

    runner: StepRunner | None = None
    streamer: StepStreamer | None = None

    async def run(self, call: StepCall) -> StepResult:
        if self.runner is None:
            raise ServerError(ErrorCode.UNAVAILABLE, "ensembles need an inference server")
        return await self.runner(call)

    async def stream(self, call: StepCall) -> AsyncGenerator[StepResult, None]:
        if self.streamer is None:
            raise ServerError(ErrorCode.UNAVAILABLE, "ensembles need an inference server")
        results = self.streamer(call)
        async with contextlib.aclosing(results):  # closed with this, as its caller closes it
            async for result in results:
                yield result


def ensemble_scheduler(plan: EnsemblePlan, routes: StepRoutes) -> EnsembleScheduler:
    """The scheduler a plan needs: a decoupled ensemble's runs its decoupled steps as
    streams; any other's awaits each step once."""
    if plan.decoupled:
        return DecoupledEnsembleScheduler(plan, routes.run, routes.stream)
    return EnsembleScheduler(plan, routes.run)


class DecoupledEnsembleScheduler(EnsembleScheduler):
    def __init__(self, plan: EnsemblePlan, runner: StepRunner, streamer: StepStreamer) -> None:
        super().__init__(plan, runner)
        self._streamer = streamer

    async def _run(self, item: WorkItem) -> dict[str, Array]:
        context = item.context
        sink = context.responses if context is not None else None
        if sink is None:
            # The core sends a decoupled model's requests through its streaming path only.
            raise ServerError(
                ErrorCode.INTERNAL, f"ensemble '{self.plan.name}' is decoupled: stream it"
            )
        requested = context.requested_outputs if context is not None else ()
        await _Run(self, item, sink, requested).run()
        return {}


class _Run:
    """One request of a decoupled ensemble."""

    def __init__(
        self,
        scheduler: DecoupledEnsembleScheduler,
        item: WorkItem,
        sink: ResponseSink,
        requested: tuple[str, ...],
    ) -> None:
        self.scheduler = scheduler
        self.plan = plan = scheduler.plan
        self.item = item
        self.sink = sink
        # As Triton: a response goes out once the outputs the client asked for are there,
        # and only the steps those outputs need run.
        self.wanted = tuple(n for n in plan.outputs if n in requested) or plan.outputs
        self.needed = scheduler.needed(self.wanted)
        # A placeholder (None) for an optional input left out or an output a step's
        # response did not carry, as in the ensemble scheduler.
        self.tensors: dict[tuple[str, Key], Slot] = {}
        # How many more times each tensor of a key will be read (by steps, and by the
        # response when it is an output): a long stream must not keep every response.
        self.uses: dict[tuple[str, Key], int] = {}
        for name, array in item.inputs.items():
            self._keep(name, (), array)
        for name in plan.inputs:
            if name not in item.inputs:
                self._keep(name, (), None)
        self.carried: dict[tuple[str, Key], SequenceFlags] = {}
        # The batch size of the request that made each tensor (ensemble.py).
        batch = item.batch_size if plan.batching else 0
        self.sizes: dict[tuple[str, Key], int] = dict.fromkeys(self.tensors, batch)
        self.releases = StepReleases(item.timings)
        self.events: asyncio.Queue[_Event] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        # Steps started and not yet done: Triton's in-flight step counter.
        self.live = 0

    async def run(self) -> None:
        try:
            needs = self.plan.needs
            self._start([(i, ()) for i, count in enumerate(needs) if count == 0 and self._runs(i)])
            while self.live:
                event = await self.events.get()
                if event.error is not None:
                    raise event.error
                if event.done:
                    self.live -= 1
                self._start(self._written(event.index, event.key, event.produced))
                response = self._response(event.key, event.produced)
                if response is not None:
                    self.sink.send(response[0], None, self.live == 0, response[1])
                elif not self.live:
                    self.sink.send(None, None, True)
        finally:
            for task in self.tasks:
                task.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        # The ensemble's request is released after its steps' requests, as in Triton.
        await self.releases.wait()

    def _runs(self, index: int) -> bool:
        return runs(self.needed, index)

    def _keep(self, tensor: str, key: Key, array: Slot) -> None:
        self.tensors[(tensor, key)] = array
        readers = self.plan.readers.get(tensor, ())
        uses = sum(self._runs(r) for r in readers) + (tensor in self.wanted)
        self.uses[(tensor, key)] = uses

    def _used(self, tensors: set[str], key: Key) -> None:
        for tensor in tensors:
            entry = (tensor, key)
            left = self.uses.get(entry, 0) - 1
            if left > 0:
                self.uses[entry] = left
                continue
            self.uses.pop(entry, None)
            self.tensors.pop(entry, None)
            self.carried.pop(entry, None)
            self.sizes.pop(entry, None)

    def _start(self, ready: list[tuple[int, Key]]) -> None:
        for index, key in ready:
            self.live += 1
            task = asyncio.ensure_future(self._step(index, key))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _step(self, index: int, key: Key) -> None:
        scheduler, step = self.scheduler, self.plan.steps[index]
        view = {t: self.tensors[(t, key)] for _, t in step.inputs if (t, key) in self.tensors}
        carried = {t: self.carried[(t, key)] for _, t in step.inputs if (t, key) in self.carried}
        sizes = {t: self.sizes[(t, key)] for _, t in step.inputs if (t, key) in self.sizes}
        call = scheduler._call(index, view, carried, sizes, self.item, self.releases)
        self._used({t for _, t in step.inputs}, key)
        try:
            if not step.decoupled:
                result = await scheduler._runner(call)
                self._report(index, key, call, result, True)
                return
            final = False
            results = self.scheduler._streamer(call)
            async with contextlib.aclosing(results):
                count = 0
                async for result in results:
                    final = result.final
                    self._report(index, (*key, count), call, result, final)
                    count += 1
            if not final:
                self.events.put_nowait(_Event(index, key, {}, True))
        except ServerError as exc:
            self.events.put_nowait(_Event(index, key, {}, True, scheduler._failed(exc)))
        except Exception as exc:
            self.events.put_nowait(_Event(index, key, {}, True, exc))

    def _report(
        self, index: int, key: Key, call: StepCall, result: StepResult, final: bool
    ) -> None:
        written = answered_sequence(call.sequence, result.parameters)
        carried: dict[str, SequenceFlags] = {}
        sizes: dict[str, int] = {}
        produced = self.scheduler._produced(index, result, written, carried, sizes, self.item)
        for tensor, flags in carried.items():
            self.carried[(tensor, key)] = flags
        for tensor, size in sizes.items():
            self.sizes[(tensor, key)] = size
        self.events.put_nowait(_Event(index, key, produced, final))

    def _written(self, index: int, key: Key, produced: dict[str, Slot]) -> list[tuple[int, Key]]:
        """Record a step's tensors under their key; return the steps that can now run on
        that key (each once, even when it reads several of them)."""
        for tensor, array in produced.items():
            self._keep(tensor, key, array)
        ready: list[tuple[int, Key]] = []
        for tensor in produced:
            for reader in self.plan.readers.get(tensor, ()):
                if not self._runs(reader):
                    continue
                reads = self.plan.steps[reader].inputs
                entry = (reader, key)
                if entry not in ready and all((t, key) in self.tensors for _, t in reads):
                    ready.append(entry)
        return ready

    def _response(
        self, key: Key, produced: dict[str, Slot]
    ) -> tuple[dict[str, Array], dict[str, ParamValue]] | None:
        """The ensemble's outputs of one key, once the last of them was just written (those
        left as placeholders are left out), and the sequence parameters they carry."""
        if not any(name in produced for name in self.wanted):
            return None
        if not all((name, key) in self.tensors for name in self.wanted):
            return None
        outputs = present({name: self.tensors[(name, key)] for name in self.wanted})
        sizes = {n: self.sizes[(n, key)] for n in self.wanted if (n, key) in self.sizes}
        outputs = self.scheduler._outputs(outputs, sizes)
        carried = {n: self.carried[(n, key)] for n in self.wanted if (n, key) in self.carried}
        self._used(set(self.wanted), key)
        return outputs, echo(self.item.sequence or NO_SEQUENCE, carried, self.wanted)
