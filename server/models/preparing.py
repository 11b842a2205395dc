"""The blocking half of a model load, run on a load thread (loadpool.py): read and
complete the config, check the paths it names, then load every version it names on its
backend. The lifecycle installs what comes back on the event loop."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ge_serve.backends.base import Backend, LoadedModel, ModelSpec
from ge_serve.backends.paths import OutsideFolder
from ge_serve.protos import model_config_pb2

from . import autocomplete, ensemble_config, repoagents
from .config_paths import check_config_paths
from .repository import ModelSource, config_path, read_config, read_labels, select_versions
from .version_health import VersionHealth

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PreparedLoad:
    """The blocking half of a load: a completed config and loaded executors."""

    config: model_config_pb2.ModelConfig
    backend: Backend
    source: ModelSource
    labels: dict[str, list[str]]
    loaded: dict[int, LoadedModel]
    failures: dict[int, str]
    seconds: float
    health: dict[int, VersionHealth] = field(default_factory=dict)

    def failed(self) -> bool:
        return not self.loaded  # every version failed: a retry may fare better


def strict_poll_fails(source: ModelSource) -> bool:
    """Whether the folder fails Triton's poll when configs are used as written: it has no
    config file. Triton reads the file while polling, so such a folder is no model at all
    (not in the index, not waited for by readiness), not a model that failed to load."""
    try:
        path = config_path(source)
    except OutsideFolder:
        return False  # the load names it
    if path.exists():
        return False
    log.error(
        "Poll failed for model directory '%s': failed to open text file for read %s: No such "
        "file or directory",
        source.name,
        path,
    )
    return True


def version_failures(failures: dict[int, str]) -> str:
    """Triton's words for the versions that failed to load (core model_lifecycle.cc)."""
    return "".join(
        f"version {v} is at UNAVAILABLE state: {r};" for v, r in sorted(failures.items())
    )


def prepare_load(
    source: ModelSource,
    override: model_config_pb2.ModelConfig | None,
    backends: dict[str, Backend],
    default_backend: str,
    complete: bool,
) -> PreparedLoad:
    """Blocking: read and complete the config, then load every version it names."""
    started = time.monotonic()
    config = read_config(source, override=override)
    # Before the folder is read at all, as Triton runs its agents when it polls the model.
    repoagents.run_agents(config, source.path)
    versions = select_versions(config, source.path)
    # Before anything the config names is read: autocomplete, labels, backend, warmup.
    check_config_paths(config, source.path, versions)
    if ensemble_config.is_ensemble(config):
        ensemble_config.check_ensemble(config)
        backend: Backend = ensemble_config.ENSEMBLE_BACKEND
        labels = read_labels(config, source.path)
        # per_request: each request keeps its context (ID, parameters), which the
        # scheduler hands its steps, as Triton's ensemble sets them on each step request.
        empty = {version: LoadedModel(executors=[], per_request=True) for version in versions}
        seconds = time.monotonic() - started
        return PreparedLoad(config, backend, source, labels, empty, {}, seconds)
    newest = source.path / str(versions[-1])
    backend = autocomplete.resolve_backend(config, backends, default_backend, newest)
    path = autocomplete.model_file(config, backend, newest)
    autocomplete.complete(config, backend, path, complete)
    autocomplete.check(config)
    labels = read_labels(config, source.path)
    loaded: dict[int, LoadedModel] = {}
    failures: dict[int, str] = {}
    health: dict[int, VersionHealth] = {}
    for version in versions:
        version_dir = source.path / str(version)
        spec = ModelSpec(
            name=config.name,
            version=version,
            config=config,
            model_dir=source.path,
            model_path=autocomplete.model_file(config, backend, version_dir),
            events=health.setdefault(version, VersionHealth()),
        )
        log.debug("loading '%s' v%d on %s", config.name, version, backend.name)
        try:
            loaded[version] = backend.load(spec)
            log.debug("loaded '%s' v%d", config.name, version)
        except Exception as exc:
            log.exception("loading '%s' version %d failed", config.name, version)
            failures[version] = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
    return PreparedLoad(
        config, backend, source, labels, loaded, failures, time.monotonic() - started, health
    )
