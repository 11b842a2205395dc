"""Model control: Triton's `none`, `poll` and `explicit` modes and the load/unload API.

`none` loads everything at startup and refuses the API; `poll` also rescans the
repository every `--repository-poll-secs` and loads, reloads or unloads what changed;
`explicit` loads only `--load-model` at startup and then follows the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError
from ..models.ensembles import EnsembleLoader
from ..models.lifecycle import LoadOverride, ModelLifecycle
from ..models.namespaces import model_name
from ..models.repository import (
    ModelRepository,
    check_model_name,
    fingerprint,
    not_unique,
    override_target,
    write_overrides,
)
from ..startup.gcheap import settle_heap
from ..startup.malloc import release_freed_memory
from .config_json_input import as_strict, load_object

log = logging.getLogger(__name__)

# Triton's wording, also for `none` mode (Triton keeps one message for both).
CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"

# Triton's words (model_repository_manager.cc), for `--load-model=*` beside other names.
WILDCARD_NOT_ALONE = "Wildcard model name '*' must be the ONLY startup model if specified at all."

FILE_PREFIX = "file:"


class ControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


@dataclass(frozen=True, slots=True)
class ControlSettings:
    mode: ControlMode = ControlMode.NONE
    load_models: tuple[str, ...] = ()
    poll_secs: float = 15.0


class ModelControl:
    """Owns which models are loaded when: startup, the poll task and the API."""

    def __init__(
        self, lifecycle: ModelLifecycle, repository: ModelRepository, settings: ControlSettings
    ) -> None:
        self.lifecycle = lifecycle
        self.repository = repository
        self.settings = settings
        # Loads and unloads go through it, so ensembles and their models stay in step.
        self.ensembles = EnsembleLoader(lifecycle)
        self._fingerprints: dict[str, str] = {}
        # Names in more than one repository at the last scan: withdrawn, not served.
        self._duplicates: frozenset[str] = frozenset()
        self._poller: asyncio.Task[None] | None = None
        # Loads and unloads run as tasks the caller awaits through a shield, so a client
        # that goes away mid-load cannot abandon a half-installed model.
        self._tasks: set[asyncio.Task[Any]] = set()
        # Loads and unloads under way; the heap settles when the last one ends.
        self._changing = 0

    @property
    def api_enabled(self) -> bool:
        return self.settings.mode is ControlMode.EXPLICIT

    # --- startup and shutdown ------------------------------------------------------------

    def startup_models(self) -> list[str]:
        if self.settings.mode is ControlMode.EXPLICIT:
            wanted = self.settings.load_models
            if "*" in wanted and len(set(wanted)) > 1:
                # Triton's core refuses it as it creates the server, so nothing loads and
                # the server exits (a repeated '*' is one name there too).
                raise ServerError(ErrorCode.INVALID_ARG, WILDCARD_NOT_ALONE)
            if "*" in wanted:
                return sorted(self.repository.scan())
            return list(dict.fromkeys(key for name in wanted for key in self._keys(name)))
        return sorted(self.repository.scan())  # --load-model needs explicit (cli.py)

    async def start(self) -> dict[str, str]:
        """Load the startup models (and start polling); returns {name: error}."""
        if self.settings.mode is ControlMode.POLL:
            if self.settings.poll_secs <= 0:
                raise ServerError(
                    ErrorCode.INVALID_ARG,
                    "--repository-poll-secs must be greater than 0 in poll mode",
                )
            # Taken before loading, so an edit made while loading is seen by the next poll.
            scanned = await asyncio.to_thread(self._scan_fingerprints)
            self._fingerprints, self._duplicates = scanned
        names = self.startup_models()
        errors = await self.ensembles.load_many(names)
        if self.settings.mode is not ControlMode.EXPLICIT or "*" in self.settings.load_models:
            # As in Triton, a name in two repositories is not served, and counts as a model
            # that failed to load (so --exit-on-error decides), while the rest load.
            duplicates = (await asyncio.to_thread(self.repository.scan_all)).duplicates
            for name in sorted(duplicates):
                await self.ensembles.withdraw(name)
                errors[name] = not_unique(name)
        if self.settings.mode is ControlMode.POLL:
            self._poller = asyncio.create_task(self._poll_forever(), name="repository-poll")
        return errors

    async def stop(self, deadline: float | None = None) -> None:
        """Stop polling and wait for the loads and unloads under way; with `deadline` (a
        `time.monotonic()` instant), no longer than that: a load whose model never
        finishes initializing must not hold the server's exit (its workers are ended
        when the backends close)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if not self._tasks:
            return
        if deadline is None:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            return
        await asyncio.wait(list(self._tasks), timeout=max(0.0, deadline - time.monotonic()))

    # --- the repository API --------------------------------------------------------------

    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load or reload `name`, optionally with a JSON config and `file:` overrides.

        `files` maps `<version>/<name>` (a leading `file:` is accepted too) to the file
        content. With files the model is loaded from those files only, and `config_json`
        is required, as in Triton.
        """
        self._require_api()
        check_model_name(name)
        config = parse_config_json(name, config_json) if config_json is not None else None
        folder: Path | None = None
        if files:
            if config is None:
                raise ServerError(
                    ErrorCode.INVALID_ARG,
                    f"failed to load '{name}': the 'config' parameter is required when "
                    "'file:' overrides are given",
                )
            relative = {_strip_prefix(key): content for key, content in files.items()}
            try:
                folder = await asyncio.to_thread(_make_override_folder, name, relative)
            except ServerError as exc:
                raise ServerError(exc.code, f"failed to load '{name}': {exc.message}") from None
        override = LoadOverride(config=config, folder=folder)
        # Overrides from files make a model of no namespace, as in Triton.
        keys = [name] if folder is not None else await asyncio.to_thread(self._keys, name)
        for key in keys:
            await self._run(self.ensembles.load(key, override))

    async def unload(
        self, name: str, unload_dependents: bool = False, forget: bool = False
    ) -> None:
        """Unload `name`, taking down the ensembles built on it; `unload_dependents` also
        unloads the models loaded along with it (an ensemble's composing models) that
        nothing else uses. `forget`: drop them from the index too (their repository goes)."""
        self._require_api()
        check_model_name(name)
        keys = [key for key in self.lifecycle.models if model_name(key) == name] or [name]
        for key in keys if self.repository.namespacing else [name]:
            await self._run(self.ensembles.unload(key, dependents=unload_dependents, forget=forget))

    def _keys(self, name: str) -> list[str]:
        """Blocking: every model `name` names; with namespacing, one per namespace holding
        it (a load acts on all of them, as in Triton), else `name` itself."""
        if not self.repository.namespacing:
            return [name]
        try:
            scanned = self.repository.scan()
        except ServerError:
            return [name]
        return sorted(key for key in scanned if model_name(key) == name) or [name]

    def _require_api(self) -> None:
        if not self.api_enabled:
            raise ServerError(ErrorCode.UNAVAILABLE, CONTROL_DISABLED)

    async def _run(self, work: Coroutine[Any, Any, None]) -> None:
        """A load or unload, run to its end even when its caller goes (a client's
        deadline)."""
        task = asyncio.create_task(self._change(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.shield(task)

    async def _change(self, work: Coroutine[Any, Any, None]) -> None:
        self._changing += 1
        try:
            await work
        finally:
            self._changing -= 1
            if not self._changing:
                # Once the last of concurrent changes ends: the collector's standing heap
                # follows the repository (startup/gcheap.py; one full collection), and
                # what the changes freed goes back to the system (malloc.py).
                settle_heap()
                await asyncio.to_thread(release_freed_memory)

    # --- poll mode -----------------------------------------------------------------------

    def _scan_fingerprints(self) -> tuple[dict[str, str], frozenset[str]]:
        """Blocking: every model folder's fingerprint, and the names in more than one
        repository (which have none: they are not served)."""
        prints: dict[str, str] = {}
        scan = self.repository.scan_all()
        for name, source in scan.models.items():
            try:
                prints[name] = fingerprint(source.path)
            except OSError as exc:
                log.warning("cannot read model folder '%s': %s", source.path, exc)
        return prints, scan.duplicates

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        """Load added models, reload changed ones, unload removed ones."""
        try:
            current, duplicates = await asyncio.to_thread(self._scan_fingerprints)
        except ServerError as exc:
            log.error("polling the model repository failed: %s", exc.message)
            return
        known, was_duplicate = self._fingerprints, self._duplicates
        self._fingerprints, self._duplicates = current, duplicates
        added = sorted(current.keys() - known.keys())
        # A name now in two repositories is withdrawn, with Triton's reason in the index;
        # one that is in none any more is forgotten, as a removed model is.
        withdrawn = sorted(duplicates - was_duplicate)
        removed = sorted((known.keys() | was_duplicate) - current.keys() - duplicates)
        changed = sorted(n for n in current.keys() & known.keys() if current[n] != known[n])
        if not (added or removed or changed or withdrawn):
            return
        log.info(
            "model repository changed: added %s, changed %s, removed %s, in several "
            "repositories %s",
            added,
            changed,
            removed,
            withdrawn,
        )
        jobs: list[Awaitable[None]] = [self._poll_load(added + changed)]
        jobs += [self._poll_unload(n) for n in removed]
        jobs += [self._run(self.ensembles.withdraw(n)) for n in withdrawn]
        await asyncio.gather(*jobs)

    async def _poll_load(self, names: list[str]) -> None:
        errors: dict[str, str] = {}

        async def load() -> None:
            errors.update(await self.ensembles.load_many(names))

        if names:
            await self._run(load())
        for message in errors.values():
            log.error("%s", message)

    async def _poll_unload(self, name: str) -> None:
        try:
            await self._run(self.ensembles.unload(name, forget=True))
        except ServerError as exc:
            log.error("unloading '%s' failed: %s", name, exc.message)


def parse_config_json(name: str, text: str) -> model_config_pb2.ModelConfig:
    """The load API's `config`: a JSON ModelConfig (proto or JSON field names), with
    the leniencies of Triton's parser (config_json_input.py)."""
    if not text.lstrip(" \t\n\r").startswith("{"):
        # json_format reads `[]` and `""` as an empty ModelConfig, which would replace the
        # model's whole config; Triton's JsonStringToMessage wants an object.
        raise _bad_config(name, "it must be a JSON object")
    config = model_config_pb2.ModelConfig()
    try:
        data = as_strict(load_object(text), config)
        json_format.ParseDict(data, config)
    except (ValueError, TypeError, json_format.ParseError) as exc:
        raise _bad_config(name, str(exc)) from None
    except RecursionError:
        # json.loads recurses once per nested array or object and stops cleanly at the
        # interpreter's recursion limit; json_format stops nested messages at 100 levels.
        raise _bad_config(name, "JSON nesting depth exceeds maximum allowed limit") from None
    return config


def _bad_config(name: str, why: str) -> ServerError:
    return ServerError(
        ErrorCode.INVALID_ARG,
        f"failed to load '{name}': the 'config' parameter is not a valid JSON ModelConfig: {why}",
    )


def _strip_prefix(key: str) -> str:
    return key[len(FILE_PREFIX) :] if key.startswith(FILE_PREFIX) else key


def _make_override_folder(name: str, files: dict[str, bytes]) -> Path:
    """Blocking: a fresh private folder (mode 0700) holding the override files.

    Every name is checked before the folder is even created.
    """
    for relative in files:
        override_target(Path("."), relative)
    folder = Path(tempfile.mkdtemp(prefix=f"ge-serve-{name}-"))
    try:
        write_overrides(folder, files)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder
