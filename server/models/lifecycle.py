"""Model lifecycle: states, loading off the loop, atomic swap, unload with drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ge_serve.backends.base import Backend, LoadedModel
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.ensemble_stream import StepRoutes, ensemble_scheduler

from ..errors import (
    ErrorCode,
    ServerError,
    internal,
    model_not_ready,
    unknown_model,
    unknown_version,
)
from ..inference.model import ModelVersion, tensor_specs
from ..inference.reports import ModelState, RepositoryEntry
from . import autocomplete, ensemble_config
from .loadpool import LoadPool
from .namespaces import model_name, qualify_steps, resolve
from .preparing import PreparedLoad, prepare_load, strict_poll_fails, version_failures
from .repository import (
    DUPLICATE_REASON,
    ModelRepository,
    ModelSource,
    OverrideFolderText,
    not_unique,
    parse_version,
)
from .version_health import not_ready

log = logging.getLogger(__name__)

# How long past the exit deadline the unloads at exit may still take (a scheduler's close
# runs until the deadline, then ends its executors).
_CLOSE_MARGIN_S = 1.0

SchedulerFactory = Callable[[model_config_pb2.ModelConfig, LoadedModel], Scheduler]


@dataclass(slots=True)
class VersionRecord:
    version: int
    state: ModelState
    reason: str = ""
    model: ModelVersion | None = None


@dataclass(slots=True)
class ModelRecord:
    name: str
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    # Set when the whole model failed before any version could be tried.
    reason: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The private `file:` override folder the current versions were loaded from; deleted
    # once they are retired.
    owned: Path | None = None
    # False once unloaded on purpose: strict readiness then no longer waits for it.
    wanted: bool = True


@dataclass(frozen=True, slots=True)
class LoadOverride:
    """What a load API call replaces: the config, and/or the whole model folder."""

    config: model_config_pb2.ModelConfig | None = None
    # A private folder named after the model, holding the `file:` overrides. The model
    # loads from it instead of the repository; the lifecycle owns and deletes it.
    folder: Path | None = None


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    autocomplete: bool = True
    default_backend: str = "onnxruntime"
    unload_timeout_s: float = 30.0
    load_threads: int = 4
    load_retries: int = 0


class ModelLifecycle:
    def __init__(
        self,
        repository: ModelRepository,
        backends: dict[str, Backend],
        scheduler_factory: SchedulerFactory,
        settings: LifecycleSettings,
    ) -> None:
        self.repository = repository
        self.backends = backends
        self.scheduler_factory = scheduler_factory
        self.settings = settings
        self._loads = LoadPool(settings.load_threads, settings.load_retries)
        # Set by `close`: when the server's one exit timeout ends (time.monotonic()).
        self._deadline: float | None = None
        self.models: dict[str, ModelRecord] = {}
        # Observers called after each successful load: (model, load seconds).
        self.on_loaded: list[Callable[[ModelVersion, float], None]] = []
        # Observers called once a version is retired and its executors are closed.
        self.on_retired: list[Callable[[ModelVersion], None]] = []
        # How ensemble steps reach their models; the core serving this lifecycle sets them.
        self.steps = StepRoutes()

    # --- queries -------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The model version a request goes to: the highest READY one when none is named."""
        record = self.models.get(self.resolve(name))
        if record is None:
            raise unknown_model(name)
        if version:
            number = parse_version(version)
            entry = None if number is None else record.versions.get(number)
            if entry is None:
                raise unknown_version(name, version)
            if entry.state is not ModelState.READY or entry.model is None:
                raise model_not_ready(name, version)
            return entry.model
        versions = record.versions
        if len(versions) == 1:  # the usual case, without building a list
            (only,) = versions.values()
            if only.state is ModelState.READY and only.model is not None:
                return only.model
        ready = [v for v in versions.values() if v.state is ModelState.READY and v.model]
        if not ready:
            raise not_ready(name, record.versions.values())
        best = max(ready, key=lambda v: v.version).model
        assert best is not None
        return best

    def resolve(self, name: str) -> str:
        """The key of the model a client's name means (namespaces.py)."""
        return resolve(name, self.models) if self.repository.namespacing else name

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except ServerError:
            return False
        return True

    def all_ready(self) -> bool:
        """Every model meant to be loaded has a READY version (strict readiness)."""
        return all(
            any(v.state is ModelState.READY for v in record.versions.values())
            for record in self.models.values()
            if record.wanted
        )

    def ready_models(self) -> list[ModelVersion]:
        return [
            v.model
            for record in self.models.values()
            for v in record.versions.values()
            if v.state is ModelState.READY and v.model is not None
        ]

    def index(
        self, ready_only: bool = False, scanned: Iterable[str] | None = None
    ) -> list[RepositoryEntry]:
        """Every model loaded or in the repository; `scanned` is a repository scan the
        caller already made (off the event loop), else the scan happens here."""
        rows: list[RepositoryEntry] = []
        names = set(self.models)
        if not ready_only:
            if scanned is None:
                with contextlib.suppress(ServerError):
                    scanned = self.repository.scan()
            names |= set(scanned or ())
        for key in sorted(names, key=lambda k: (model_name(k), k)):
            record, name = self.models.get(key), model_name(key)
            if record is None or (not record.versions and not record.reason):
                if not ready_only:
                    rows.append(RepositoryEntry(name))
                continue
            if not record.versions:
                if not ready_only:
                    rows.append(RepositoryEntry(name, None, ModelState.UNAVAILABLE, record.reason))
                continue
            for version in sorted(record.versions):
                entry = record.versions[version]
                if ready_only and entry.state is not ModelState.READY:
                    continue
                rows.append(RepositoryEntry(name, version, entry.state, entry.reason))
        return rows

    # --- loading -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, name: str, create: bool = True) -> AsyncIterator[ModelRecord | None]:
        """Hold the model's lock (one load or unload at a time), re-checked after the wait."""
        while True:
            record = self.models.get(name)
            if record is None:
                if not create:
                    yield None
                    return
                record = self.models.setdefault(name, ModelRecord(name))
            await record.lock.acquire()
            if self.models.get(name) is record:
                break
            record.lock.release()
        try:
            yield record
        finally:
            record.lock.release()

    def _drop_if_empty(self, record: ModelRecord) -> None:
        if not record.versions and not record.reason and self.models.get(record.name) is record:
            del self.models[record.name]

    async def load(self, name: str, override: LoadOverride | None = None) -> None:
        """Load (or reload) a model; the old versions serve until the new ones are ready."""
        override = override or LoadOverride()
        async with self._locked(name) as record:
            assert record is not None
            try:
                await self._load_locked(record, override)
            finally:
                # An override folder that did not become the record's own is not needed.
                if override.folder is not None and record.owned != override.folder:
                    await _remove_folder(override.folder)

    async def _load_locked(self, record: ModelRecord, override: LoadOverride) -> None:
        name = record.name
        record.wanted = True
        if override.folder is not None:
            source: ModelSource | None = ModelSource(name, override.folder)
        else:
            scan = await asyncio.to_thread(self.repository.scan_all)
            source = scan.models.get(name)
            if name in scan.duplicates:
                self._fail(record, DUPLICATE_REASON)
                why = not_unique(name)
                raise ServerError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {why}")
        strict = not self.settings.autocomplete and override.config is None
        if source is None or (strict and strict_poll_fails(source)):
            self._drop_if_empty(record)
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"failed to load '{name}', failed to poll from model repository",
            )
        for entry in record.versions.values():
            if entry.state is not ModelState.READY:
                entry.state = ModelState.LOADING
        if not record.versions:
            record.reason = ""
        hide = OverrideFolderText(override.folder)
        try:
            prepared = await self._loads.run(
                self._prepare, source, override.config, failed=PreparedLoad.failed
            )
        except ServerError as exc:
            reason = hide(exc.message)
            self._fail(record, reason)
            raise ServerError(exc.code, f"failed to load '{name}': {reason}") from None
        except Exception as exc:
            reason = hide(str(exc))
            self._fail(record, reason)
            raise ServerError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {reason}") from None
        prepared.failures = {v: hide(reason) for v, reason in prepared.failures.items()}
        try:
            await self._install(record, prepared, override.folder)
        except ServerError as exc:
            reason = hide(exc.message)
            self._fail(record, reason)
            raise ServerError(exc.code, f"failed to load '{name}': {reason}") from None
        failed = dict(prepared.failures)
        if failed and not prepared.loaded:
            reasons = version_failures(failed)
            if any(v.state is ModelState.READY for v in record.versions.values()):
                self._note_failed_reload(record, reasons)
            raise ServerError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {reasons}")

    def _fail(self, record: ModelRecord, reason: str) -> None:
        """A failed (re)load keeps READY versions serving and marks the rest unavailable."""
        if not any(v.state is ModelState.READY for v in record.versions.values()):
            record.reason = reason
            for entry in record.versions.values():
                entry.state = ModelState.UNAVAILABLE
                entry.reason = reason
        else:
            for entry in record.versions.values():
                if entry.state is ModelState.LOADING:
                    entry.state = ModelState.UNAVAILABLE
                    entry.reason = reason
            self._note_failed_reload(record, reason)
        log.error("failed to load '%s': %s", record.name, reason)

    @staticmethod
    def _note_failed_reload(record: ModelRecord, reason: str) -> None:
        for entry in record.versions.values():
            if entry.state is ModelState.READY:
                entry.reason = f"reload failed, this version keeps serving: {reason}"

    def _prepare(
        self, source: ModelSource, override: model_config_pb2.ModelConfig | None
    ) -> PreparedLoad:
        settings = self.settings
        return prepare_load(
            source, override, self.backends, settings.default_backend, settings.autocomplete
        )

    async def _install(
        self, record: ModelRecord, prepared: PreparedLoad, folder: Path | None = None
    ) -> None:
        """Swap the new versions in atomically (nothing awaits between building the new
        table and assigning it: no mix, no gap), then retire the old ones."""
        config = prepared.config
        schedulers = await self._schedulers(record.name, prepared)
        new_versions: dict[int, VersionRecord] = {}
        for version, loaded in prepared.loaded.items():
            scheduler = schedulers[version]
            model = ModelVersion(
                name=config.name,
                version=version,
                config=config,
                backend=prepared.backend.name,
                model_dir=prepared.source.path,
                inputs=tensor_specs(list(config.input)),
                outputs=tensor_specs(list(config.output)),
                loaded=loaded,
                scheduler=scheduler,
                labels=prepared.labels,
                namespace=prepared.source.namespace,
            )
            new_versions[version] = VersionRecord(version, ModelState.READY, "", model)
            if version in prepared.health:  # an ensemble has no backend to report
                prepared.health[version].bind(new_versions[version])
        for version, reason in prepared.failures.items():
            new_versions[version] = VersionRecord(version, ModelState.UNAVAILABLE, reason)
        old = record.versions
        if not prepared.loaded and any(v.state is ModelState.READY for v in old.values()):
            # Nothing new could load: keep serving what we have.
            for version, reason in prepared.failures.items():
                if version not in old or old[version].state is not ModelState.READY:
                    old[version] = VersionRecord(version, ModelState.UNAVAILABLE, reason)
            return
        record.versions = new_versions
        record.reason = ""
        old_folder, record.owned = record.owned, (folder if prepared.loaded else None)
        for entry in new_versions.values():
            if entry.model is not None:
                for callback in self.on_loaded:
                    callback(entry.model, prepared.seconds)
        retired = [v for v in old.values() if v.model is not None]
        await self._retire(retired)
        if old_folder is not None and old_folder != record.owned:
            await _remove_folder(old_folder)

    async def _schedulers(self, key: str, prepared: PreparedLoad) -> dict[int, Scheduler]:
        """One scheduler per loaded version; a factory failure frees all, failing the load."""
        config, loaded, built = prepared.config, prepared.loaded, dict[int, Scheduler]()
        try:
            factory = self.scheduler_factory
            if ensemble_config.is_ensemble(config):
                lookup = ensemble_config.step_lookup(config.name, self.get, self.models)
                steps = qualify_steps(key, config, self.models)
                plan = ensemble_config.build_plan(steps, lookup)
                prepared.labels = ensemble_config.inherited_labels(steps, prepared.labels, self.get)
                # As Triton: a decoupled step makes the ensemble decoupled, and its config
                # as served says so, for clients that choose streaming by it.
                config.model_transaction_policy.decoupled = plan.decoupled
                autocomplete.refuse_cache_when_decoupled(config)
                factory = lambda c, m: ensemble_scheduler(plan, self.steps)  # noqa: E731
            for version, model in loaded.items():
                built[version] = factory(config, model)
        except Exception as exc:
            for scheduler in built.values():
                await scheduler.close(0)
            rest = [model for version, model in loaded.items() if version not in built]
            await asyncio.gather(*(asyncio.to_thread(model.close) for model in rest))
            if isinstance(exc, ServerError):
                raise
            raise internal(exc) from exc
        return built

    async def refuse(self, name: str, reason: str) -> None:
        """Fail a load before it starts, for a reason outside the model's folder."""
        async with self._locked(name) as record:
            assert record is not None
            record.wanted = True
            self._fail(record, reason)
        raise ServerError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {reason}")

    async def withdraw(self, name: str) -> None:
        """Stop serving a model the repository can no longer give one folder for (Triton
        marks it deleted), keeping it in the index as UNAVAILABLE with Triton's reason."""
        async with self._locked(name) as record:
            assert record is not None
            # Not the operator's wish to serve: strict readiness does not wait for it.
            record.wanted = False
            await self._retire([v for v in record.versions.values() if v.model is not None])
            for entry in record.versions.values():
                entry.state = ModelState.UNAVAILABLE
                entry.reason = DUPLICATE_REASON
            record.reason = DUPLICATE_REASON
            folder, record.owned = record.owned, None
            if folder is not None:
                await _remove_folder(folder)
        log.error("%s", not_unique(name))

    async def _retire(self, entries: list[VersionRecord]) -> None:
        for entry in entries:
            entry.state = ModelState.UNLOADING
            if entry.model is not None:
                entry.model.retiring = True
        await asyncio.gather(*(self._close(e) for e in entries))

    async def _close(self, entry: VersionRecord) -> None:
        model = entry.model
        if model is None:
            return
        timeout = self.settings.unload_timeout_s
        if self._deadline is not None:
            timeout = max(0.0, min(timeout, self._deadline - time.monotonic()))
        try:
            await model.scheduler.close(timeout)
        except Exception:
            log.exception("closing '%s' version %d failed", model.name, model.version)
        entry.model = None
        entry.state = ModelState.UNAVAILABLE
        entry.reason = "unloaded"
        log.info("successfully unloaded '%s' version %d", model.name, model.version)
        for callback in self.on_retired:
            callback(model)

    async def unload(self, name: str, forget: bool = False, reason: str = "unloaded") -> None:
        """Stop serving a model: refuse new requests, drain (bounded) and close executors.
        `forget` drops it from the index too; `reason`: what the index says afterwards."""
        async with self._locked(name, create=False) as record:
            if record is None:
                # Never loaded, or unknown altogether: nothing to unload, and no error, as
                # in Triton (LoadUnloadModels finds nothing in its global map to delete).
                return
            record.wanted = False
            live = [v for v in record.versions.values() if v.model is not None]
            for entry in record.versions.values():
                if entry.model is None:
                    entry.state = ModelState.UNAVAILABLE
                    entry.reason = "unloaded"
            await self._retire(live)
            for entry in record.versions.values():
                entry.reason = reason
            folder, record.owned = record.owned, None
            if folder is not None:
                await _remove_folder(folder)
            if forget and self.models.get(name) is record:
                del self.models[name]

    async def load_many(self, names: list[str]) -> dict[str, str]:
        """Load several models concurrently; returns {name: error} for those that failed."""
        errors: dict[str, str] = {}

        async def one(name: str) -> None:
            try:
                await self.load(name)
            except ServerError as exc:
                errors[name] = exc.message

        await asyncio.gather(*(one(n) for n in names))
        return errors

    async def close(self, deadline: float | None = None) -> None:
        """Unload everything; with `deadline` (the server's exit timeout, started when it
        began to stop), what is still running then is cancelled, rather than given a
        whole unload timeout more."""
        self._deadline = deadline
        unloads = [asyncio.create_task(self.unload(name)) for name in list(self.models)]
        if not unloads:
            return
        if deadline is None:
            await asyncio.gather(*unloads)
            return
        # An unload waits for its model's lock, which a load still under way holds (an
        # initialize that never returns): past the deadline it is given up, and the
        # backends' close then ends the workers of such loads.
        wait_s = max(0.0, deadline - time.monotonic()) + _CLOSE_MARGIN_S
        _done, late = await asyncio.wait(unloads, timeout=wait_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        if late:
            log.warning("%d model(s) still loading at exit were not unloaded", len(late))


async def _remove_folder(folder: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, folder, True)
