"""Conversion accuracy at load: does the compiled model still compute what its ONNX does?

For every GE model compiled from ONNX, the load runs a few inputs through the compiled
model (one slot, as the scheduler would) and through onnxruntime on the host CPU, and
reports, per output, the largest absolute error and the largest relative error
(|device - reference| / max(|reference|, 1e-6)). The inputs are the model's warm-up
samples when it has any (values its owner chose), else two generated ones: standard
normal floats, integers 0 and 1 (valid indices and token ids of any table), random
booleans, at the model's first gear or bucket, or a mid-size shape inside its ranges.

Parameters (model `parameters` or `--backend-config=npu_ge,<key>=<value>`):
- `accuracy_check`: "false" (or "0", "off") skips the check;
- `accuracy_tolerance`: "1e-3" (the largest absolute error allowed) or
  "abs=1e-3,rel=1e-2"; an output past it fails the load, naming the output and errors.

The report goes to the log, into the model's config as the parameter
`conversion_accuracy.<version>` (a JSON string; `GET /v2/models/<m>/config` over HTTP, or the gRPC
ModelConfig, show it to any Triton client, where the statistics and metadata schemas have
no field for it), and to the metrics as `ge_serve_conversion_max_abs_error` and
`ge_serve_conversion_max_rel_error`, labelled by model, version and output.

A TensorFlow `.pb` or a prebuilt OM has no ONNX to run on onnxruntime: the log says the
check did not run, and why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ge_serve.backends.base import Array, Executor, ModelSpec, gear_for, pad_batch

from .acl import TensorPlan
from .shapes import DESCRIBED, ShapePlan

log = logging.getLogger(__name__)

CONFIG_KEY = "conversion_accuracy"
_OFF = ("0", "false", "off", "no")
# A generated input's size along a dim that varies without a bound, or inside a range.
_FREE_DIM = 16


@dataclass(frozen=True, slots=True)
class OutputError:
    name: str
    max_abs: float
    max_rel: float


@dataclass(frozen=True, slots=True)
class Tolerance:
    abs: float | None = None
    rel: float | None = None

    def exceeded(self, error: OutputError) -> bool:
        return (self.abs is not None and error.max_abs > self.abs) or (
            self.rel is not None and error.max_rel > self.rel
        )

    def text(self) -> str:
        parts = [f"abs {self.abs:g}" if self.abs is not None else ""]
        parts.append(f"rel {self.rel:g}" if self.rel is not None else "")
        return ", ".join(p for p in parts if p)


def parse_tolerance(text: str) -> Tolerance | None:
    """`accuracy_tolerance`: "" (none), a number (absolute), or abs=...,rel=..."""
    text = text.strip()
    if not text:
        return None
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, number = part.strip().partition("=")
        if not sep:
            key, number = "abs", key
        key = key.strip()
        if key not in ("abs", "rel"):
            raise ValueError(
                f"parameter accuracy_tolerance '{text}': '{part}' is not abs=<x> or rel=<x>"
            )
        try:
            values[key] = float(number)
        except ValueError:
            raise ValueError(
                f"parameter accuracy_tolerance '{text}': '{number}' is not a number"
            ) from None
        if values[key] < 0:
            raise ValueError(f"parameter accuracy_tolerance '{text}': {key} must be >= 0")
    return Tolerance(values.get("abs"), values.get("rel"))


def enabled(params: Mapping[str, str]) -> bool:
    return params.get("accuracy_check", "").strip().lower() not in _OFF


@dataclass(frozen=True, slots=True)
class Probe:
    """What the check runs: the model's slot, its inputs as the config has them, and how
    its dims vary."""

    batching: bool
    gears: tuple[int, ...]
    inputs: tuple[TensorPlan, ...]
    shapes: ShapePlan
    # A shape-gear model's first bucket: each varying input's full shape.
    bucket: Mapping[str, tuple[int, ...]]


def check(
    spec: ModelSpec,
    executor: Executor,
    probe: Probe,
    params: Mapping[str, str],
    warm: Sequence[tuple[Mapping[str, Array], Mapping[str, Array]]] = (),
) -> list[OutputError] | None:
    """Run the check (see the module docstring); None when it did not run. `warm`: the
    warm-up samples' inputs and the outputs the slot gave them, compared as they are
    (no second run). Raises ValueError when an output is past `accuracy_tolerance`."""
    tolerance = parse_tolerance(params.get("accuracy_tolerance", ""))
    if not enabled(params):
        log.info("model '%s': conversion accuracy check skipped (accuracy_check)", spec.name)
        return None
    if spec.model_path.suffix.lower() != ".onnx":
        log.warning(
            "model '%s': conversion accuracy not checked: '%s' has no ONNX source to run on "
            "onnxruntime",
            spec.name,
            spec.model_path.name,
        )
        return None
    source = "warm-up" if warm else "generated"
    samples: list[tuple[Mapping[str, Array], Mapping[str, Array] | None]] = list(warm)
    if not samples:
        samples = [(_generated(probe, seed), None) for seed in (0, 1)]
    session = _reference(spec.model_path)
    errors: dict[str, OutputError] = {}
    for feeds, outputs in samples:
        try:
            expected = dict(zip(_names(session), session.run(None, dict(feeds)), strict=True))
            got = outputs if outputs is not None else executor.execute(_to_gear(feeds, probe))
        except Exception as exc:
            log.warning(
                "model '%s': conversion accuracy not checked: a %s input failed (%s)",
                spec.name,
                source,
                exc,
            )
            return None
        for name, reference in expected.items():
            if name in got:
                found = _error(name, got[name], np.asarray(reference))
                errors[name] = _worse(errors.get(name), found)
    report = [errors[name] for name in sorted(errors)]
    _publish(spec, report, source, len(samples), tolerance)
    failed = [e for e in report if tolerance is not None and tolerance.exceeded(e)]
    if failed and tolerance is not None:
        raise ValueError(
            f"conversion accuracy: {_describe(failed)} past accuracy_tolerance "
            f"({tolerance.text()}) against onnxruntime on {len(samples)} {source} input(s)"
        )
    return report


def _reference(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _names(session: ort.InferenceSession) -> list[str]:
    return [output.name for output in session.get_outputs()]


def _generated(probe: Probe, seed: int) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, Array] = {}
    ranges = {s.name: s.ranges for s in probe.shapes.inputs}
    # A shape gear fixes the batch: every input takes the first bucket's.
    lead = next((s[0] for s in probe.bucket.values() if s), 1) if probe.batching else 1
    for plan in probe.inputs:
        shape = probe.bucket.get(plan.name)
        if shape is None and plan.name in ranges and probe.shapes.kind in DESCRIBED:
            shape = tuple(_inside(low, high) for low, high in ranges[plan.name])
            shape = (1, *shape[1:]) if probe.batching else shape
        if shape is None:
            dims = tuple(_inside(1, -1) if d < 0 else d for d in plan.dims)
            shape = (lead, *dims) if probe.batching else dims
        feeds[plan.name] = _values(rng, plan.dtype, shape)
    return feeds


def _inside(low: int, high: int) -> int:
    return max(low, _FREE_DIM if high < 0 else min(high, _FREE_DIM))


def _values(rng: np.random.Generator, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Array:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.integers(0, 2, size=shape).astype(dtype)


def _to_gear(feeds: Mapping[str, Array], probe: Probe) -> dict[str, Array]:
    """Pad a batch up to a gear of the slot, as the scheduler does."""
    if not (probe.batching and probe.gears):
        return dict(feeds)
    batch = int(next(iter(feeds.values())).shape[0])
    gear = gear_for(batch, probe.gears)
    return {name: pad_batch(np.asarray(array), gear) for name, array in feeds.items()}


def _error(name: str, got: Array, reference: Array) -> OutputError:
    got = np.asarray(got)[: reference.shape[0]] if reference.ndim else np.asarray(got)
    if got.shape != reference.shape:
        return OutputError(name, float("inf"), float("inf"))
    if reference.dtype.kind not in "fiub":
        return OutputError(name, 0.0 if np.array_equal(got, reference) else float("inf"), 0.0)
    ref = reference.astype(np.float64)
    diff = np.abs(got.astype(np.float64) - ref)
    if diff.size == 0:
        return OutputError(name, 0.0, 0.0)
    rel = diff / np.maximum(np.abs(ref), 1e-6)
    return OutputError(name, float(diff.max()), float(rel.max()))


def _worse(old: OutputError | None, new: OutputError) -> OutputError:
    if old is None:
        return new
    return OutputError(new.name, max(old.max_abs, new.max_abs), max(old.max_rel, new.max_rel))


def _describe(errors: Sequence[OutputError]) -> str:
    return "; ".join(f"{e.name} max abs {e.max_abs:.3g}, max rel {e.max_rel:.3g}" for e in errors)


def _publish(
    spec: ModelSpec,
    report: Sequence[OutputError],
    source: str,
    count: int,
    tolerance: Tolerance | None,
) -> None:
    log.info(
        "model '%s' version %d: conversion accuracy against onnxruntime on %d %s input(s): %s",
        spec.name,
        spec.version,
        count,
        source,
        _describe(report) or "no outputs compared",
    )
    entry = {
        "inputs": source,
        "samples": count,
        "tolerance": tolerance.text() if tolerance is not None else "",
        "outputs": {
            e.name: {"max_abs_error": e.max_abs, "max_rel_error": e.max_rel} for e in report
        },
    }
    spec.config.parameters[config_key(spec.version)].string_value = json.dumps(
        entry, sort_keys=True
    )


def config_key(version: int) -> str:
    """The config parameter holding one version's report (versions share a config)."""
    return f"{CONFIG_KEY}.{version}"


def metric_rows(extra: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """(output, max abs, max rel) of a loaded model's report, for the metrics."""
    report = extra.get(CONFIG_KEY)
    if not isinstance(report, list):
        return []
    return [(e.name, e.max_abs, e.max_rel) for e in report if isinstance(e, OutputError)]
