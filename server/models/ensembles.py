"""Ensembles and the models they are built on, loaded and unloaded together.

The lifecycle loads one model at a time and checks an ensemble against the composing
models it finds loaded. This module decides what else a load or an unload brings along,
following Triton's model repository manager in every control mode:

- Loading an ensemble first loads the composing models that are not loaded yet ("loaded
  along with it"); nested ensembles load their own. When a whole repository loads (startup,
  a poll), plain models load first and ensembles after them.
- When a model (re)loads, the ensembles built on it reload too, so that they are checked
  against its new config; one that could not load for want of that model loads now.
- When a model is unloaded, the ensembles built on it go down with it, UNAVAILABLE with the
  reason, and come back when it loads again. Being down for that reason does not hold
  `--strict-readiness` back, as for any model unloaded on purpose.
- `unload_dependents` on an ensemble also unloads the composing models that were loaded
  along with it and that no other ensemble uses.
- Circles between ensembles, and steps naming models the repository does not have, fail the
  ensemble's load before anything is loaded for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ge_serve.protos import model_config_pb2

from ..errors import ServerError
from .ensemble_config import is_ensemble, step_models
from .lifecycle import LoadOverride, ModelLifecycle
from .namespaces import step_key
from .repository import ModelSource, read_config

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Batch:
    """One load operation: each model in it loads once, however many ensembles need it."""

    running: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    # The models that loaded, in the order they did.
    loaded: list[str] = field(default_factory=list)

    async def run(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task = self.running.get(name)
        if task is None:
            task = self.running[name] = asyncio.ensure_future(work())
        await task


class EnsembleLoader:
    def __init__(self, lifecycle: ModelLifecycle) -> None:
        self.lifecycle = lifecycle
        # Every ensemble meant to serve (loaded, failed, or down for want of a model) ->
        # the models its steps name, as its config said when last read.
        self.links: dict[str, tuple[str, ...]] = {}
        # Models loaded only because an ensemble needed them.
        self.implicit: set[str] = set()

    # --- loading -------------------------------------------------------------------------

    async def load(self, name: str, override: LoadOverride | None = None) -> None:
        """Load (or reload) a model on request, with what it needs and what needs it."""
        self.implicit.discard(name)
        batch = _Batch()
        try:
            await batch.run(name, lambda: self._load_one(name, override, batch, ()))
        finally:
            await self._refresh(batch)

    async def load_many(self, names: list[str]) -> dict[str, str]:
        """Load several models, plain ones first; returns {name: error} for those that failed."""
        configs = await asyncio.to_thread(lambda: {n: self._read_config(n, None) for n in names})
        ensembles = {n for n, config in configs.items() if config and is_ensemble(config)}
        self.implicit.difference_update(names)
        batch = _Batch()
        errors: dict[str, str] = {}

        async def one(name: str) -> None:
            try:
                await batch.run(name, lambda: self._load_one(name, None, batch, ()))
            except ServerError as exc:
                errors[name] = exc.message

        await asyncio.gather(*(one(n) for n in names if n not in ensembles))
        await asyncio.gather(*(one(n) for n in names if n in ensembles))
        await self._refresh(batch)
        return errors

    async def _load_one(
        self, name: str, override: LoadOverride | None, batch: _Batch, stack: tuple[str, ...]
    ) -> None:
        """Load one model; an ensemble's composing models first. `stack`: the ensembles
        whose loads led here, which this one must not wait for."""
        config = await asyncio.to_thread(self._read_config, name, override)
        if config is None or not is_ensemble(config):
            self.links.pop(name, None)
        else:
            steps = step_models(config)
            if self.lifecycle.repository.namespacing:
                known = list(self.lifecycle.models)
                steps = await asyncio.to_thread(self._step_keys, name, steps, known)
            self.links[name] = steps
            await self._refuse_circle(name)
            missing = [step for step in steps if not self.lifecycle.is_ready(step)]
            unknown = await asyncio.to_thread(self._not_in_repository, missing)
            if unknown:
                reason = f"ensemble {name} contains models that are not available or ambiguous: "
                await self.lifecycle.refuse(name, reason + ", ".join(unknown))
            await asyncio.gather(*(self._ensure(step, batch, (*stack, name)) for step in steps))
            # A model loaded just now may be an ensemble that closes a circle.
            await self._refuse_circle(name)
        await self.lifecycle.load(name, override)
        batch.loaded.append(name)

    async def _ensure(self, name: str, batch: _Batch, stack: tuple[str, ...]) -> None:
        """Load a composing model unless it serves already (or this load is inside its own:
        a circle, which the ensemble's check reports)."""
        if name in stack or self.lifecycle.is_ready(name):
            return
        if name not in batch.running:
            record = self.lifecycle.models.get(name)
            if record is None or not record.wanted:
                self.implicit.add(name)
        # On failure, the ensemble's own check says why it cannot use the model.
        with contextlib.suppress(ServerError):
            await batch.run(name, lambda: self._load_one(name, None, batch, stack))

    async def _refresh(self, batch: _Batch) -> None:
        """Reload the ensembles built on what loaded, and on those in turn (not those this
        batch just loaded or tried: they saw the models as they are now)."""
        refreshed = set(batch.running)
        index = 0
        while index < len(batch.loaded):
            name = batch.loaded[index]
            index += 1
            for ensemble in self._dependents(name):
                if ensemble in refreshed:
                    continue
                refreshed.add(ensemble)
                try:
                    await self._load_one(ensemble, None, batch, ())
                except ServerError as exc:
                    log.error(
                        "ensemble '%s' cannot use '%s' as loaded now: %s", ensemble, name, exc
                    )
                    # Serving on would run steps the ensemble was not checked against.
                    if self.lifecycle.is_ready(ensemble):
                        await self.lifecycle.unload(ensemble, reason=exc.message)
                        await self._take_down_dependents(ensemble)

    # --- unloading -----------------------------------------------------------------------

    async def unload(self, name: str, dependents: bool = False, forget: bool = False) -> None:
        """Unload a model and take down the ensembles built on it; with `dependents`, also
        unload the models that were loaded along with it (an ensemble's) and serve nothing
        else."""
        await self.lifecycle.unload(name, forget=forget)
        steps = self.links.pop(name, ())
        self.implicit.discard(name)
        await self._take_down_dependents(name)
        if not dependents:
            return
        for step in steps:
            if step in self.implicit and not self._dependents(step):
                try:
                    await self.unload(step, dependents=True, forget=forget)
                except ServerError as exc:
                    log.error("unloading '%s' along with '%s' failed: %s", step, name, exc)

    async def withdraw(self, name: str) -> None:
        """Stop serving a model the repository cannot give (lifecycle.withdraw), and the
        ensembles built on it."""
        await self.lifecycle.withdraw(name)
        self.links.pop(name, None)
        self.implicit.discard(name)
        await self._take_down_dependents(name)

    async def _take_down_dependents(self, name: str) -> None:
        for ensemble in self._dependents(name):
            if not self.lifecycle.is_ready(ensemble):
                continue
            reason = f"ensemble '{ensemble}' depends on '{name}' which has no loaded version."
            log.warning("%s It is unloaded until '%s' loads again.", reason, name)
            await self.lifecycle.unload(ensemble, reason=reason)
            await self._take_down_dependents(ensemble)

    # --- the dependency graph ------------------------------------------------------------

    def _dependents(self, name: str) -> list[str]:
        """The ensembles whose steps name `name`."""
        return sorted(ensemble for ensemble, steps in self.links.items() if name in steps)

    async def _refuse_circle(self, name: str) -> None:
        circle = self._circle(name)
        if circle:
            reason = "circular dependency between ensembles: " + " -> ".join(circle)
            await self.lifecycle.refuse(name, reason)

    def _circle(self, start: str) -> list[str]:
        """A path of ensembles from `start` back to itself through their steps, or []."""
        path = [start]
        seen = {start}

        def walk(node: str) -> bool:
            for step in self.links.get(node, ()):
                if step == start:
                    path.append(start)
                    return True
                if step not in seen:
                    seen.add(step)
                    path.append(step)
                    if walk(step):
                        return True
                    path.pop()
            return False

        return path if walk(start) else []

    def _read_config(
        self, name: str, override: LoadOverride | None
    ) -> model_config_pb2.ModelConfig | None:
        """Blocking: the config a load of `name` would use; None where it cannot be read
        (the load itself then says why)."""
        try:
            if override is not None and override.folder is not None:
                source: ModelSource | None = ModelSource(name, override.folder)
            else:
                source = self.lifecycle.repository.scan().get(name)
            if source is None:
                return None
            return read_config(source, override=override.config if override else None)
        except Exception:
            return None

    def _step_keys(
        self, ensemble: str, steps: tuple[str, ...], known: list[str]
    ) -> tuple[str, ...]:
        """Blocking: the keys of the models the steps mean (namespaces.py); a step that
        means no single model keeps its name, which no key matches."""
        with contextlib.suppress(ServerError):
            known = [*known, *self.lifecycle.repository.scan()]
        return tuple(step_key(ensemble, step, known) or step for step in steps)

    def _not_in_repository(self, names: list[str]) -> list[str]:
        """Blocking: those of `names` the repository does not have."""
        if not names:
            return []
        try:
            present = self.lifecycle.repository.scan()
        except ServerError:
            return []
        return [name for name in names if name not in present]
