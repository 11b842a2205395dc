"""An in-process core for ensemble tests, and how those tests read what it reports."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from modelgen import make_lifecycle

from ge_serve.scheduler.work import Array
from ge_serve.server.control import model_control
from ge_serve.server.control.model_control import ControlMode, ControlSettings, ModelControl
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.reports import ModelStatistics, RepositoryEntry
from ge_serve.server.inference.types import DataType, InferRequest, Tensor


@contextlib.asynccontextmanager
async def explicit_core(repo: Path) -> AsyncIterator[InferenceServer]:
    """A core in explicit mode over `repo` (tests write models into it), closed after."""
    life = make_lifecycle(repo)
    control = ModelControl(life, life.repository, ControlSettings(ControlMode.EXPLICIT))
    try:
        yield InferenceServer(life, control=control)
    finally:
        await life.close()


def without_heap_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave out the full collection that the control runs after each change of the
    repository (startup/gcheap.py's settle_heap). In a test process it walks every object
    of pytest and of each imported module, 0.1-0.2 s of CPU per load or unload, most of
    what an ensemble test costs; the ensembles do not depend on it, and
    tests/component/test_lifecycle_swap.py checks that the control settles the heap."""
    monkeypatch.setattr(model_control, "settle_heap", lambda: None)


def request(model: str, data: Array, name: str = "IN") -> InferRequest:
    datatype = DataType.from_numpy(data.dtype)
    return InferRequest(model_name=model, inputs=[Tensor(name, datatype, data.shape, data)])


async def outputs(core: InferenceServer, model: str, data: Array) -> dict[str, Array]:
    response = await core.infer(request(model, data))
    return {t.name: t.data for t in response.outputs}


def ones(batch: int = 1) -> Array:
    return np.ones((batch, 4), np.float32)


def row(core: InferenceServer, name: str) -> RepositoryEntry:
    (found,) = [r for r in core.lifecycle.index() if r.name == name]
    return found


def stats(core: InferenceServer, name: str) -> ModelStatistics:
    (found,) = core.statistics(name)
    return found
