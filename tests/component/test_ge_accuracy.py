"""Conversion accuracy at load: every GE model compiled from ONNX runs a few inputs on the
device and on onnxruntime, and the load reports each output's largest errors (log, the
config's `conversion_accuracy.<version>` parameter, the model's extra for the metrics). A
tolerance fails the load; the perturbing simulated NPU (--sim-perturb) shows it can."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest
from dynamic_models import dynamic_encoder_folder, encoder_folder, rec_folder
from ge_helpers import EXAMPLES, SIMPLE_IO, ge_runtime, make_model, params, spec_for

from ge_serve.backends.ge.accuracy import OutputError, metric_rows, parse_tolerance
from ge_serve.backends.ge.acl import AclRuntime
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend

pytestmark = pytest.mark.timeout(120)
CLASSIFIER = EXAMPLES / "image_classifier" / "1" / "model.onnx"
CLASSIFIER_IO = """max_batch_size: 4
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""


@pytest.fixture(params=["sim", "fake-acl"])
def runtime(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AclRuntime]:
    yield from ge_runtime(request.param, tmp_path, monkeypatch)


class OutputErrors(TypedDict):
    max_abs_error: float
    max_rel_error: float


class Report(TypedDict):
    """A version's report, the JSON the backend writes into its config parameter."""

    inputs: str
    samples: int
    tolerance: str
    outputs: dict[str, OutputErrors]


def report(folder: Path, runtime: AclRuntime) -> Report:
    spec = spec_for(folder)
    loaded = GeBackend(runtime, cores=1).load(spec)
    try:
        rows = metric_rows(loaded.extra)
        assert rows and all(isinstance(r[1], float) for r in rows)
        found: Report = json.loads(spec.config.parameters["conversion_accuracy.1"].string_value)
        return found
    finally:
        loaded.close()


def test_every_kind_of_ge_model_reports_its_errors_at_load(
    runtime: AclRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folders = [
        make_model(tmp_path, "classifier", CLASSIFIER_IO, CLASSIFIER),  # batch gears
        encoder_folder(tmp_path),  # ND gears
        rec_folder(tmp_path),  # shape ranges
        dynamic_encoder_folder(tmp_path),  # GE dynamic shape
    ]
    with caplog.at_level(logging.INFO, logger="ge_serve.backends.ge.accuracy"):
        reports = {folder.name: report(folder, runtime) for folder in folders}
    assert set(reports["classifier"]["outputs"]) == {"probabilities"}
    assert set(reports["encoder"]["outputs"]) == {"LAST_HIDDEN", "EMBEDDING"}
    for found in reports.values():
        assert found["inputs"] == "generated" and found["samples"] == 2
        for errors in found["outputs"].values():
            # The simulated NPU and the fake run onnxruntime too: the same results.
            assert errors["max_abs_error"] <= 1e-6 and errors["max_rel_error"] <= 1e-4
    for name in reports:
        assert (
            f"model '{name}' version 1: conversion accuracy against onnxruntime on 2" in caplog.text
        )


def test_the_perturbing_sim_fails_a_load_with_a_tolerance(tmp_path: Path) -> None:
    runtime = SimRuntime(perturb=0.01)
    loose = make_model(tmp_path, "loose", CLASSIFIER_IO, CLASSIFIER)
    found = report(loose, runtime)
    errors = found["outputs"]["probabilities"]
    # x (1 + 0.01) + 0.01: at least 1% off everywhere, far more on tiny probabilities.
    assert errors["max_rel_error"] >= 0.01 and errors["max_abs_error"] > 0.01
    strict = make_model(
        tmp_path,
        "strict",
        CLASSIFIER_IO + params(accuracy_tolerance="abs=1e-3,rel=1e-3"),
        CLASSIFIER,
    )
    with pytest.raises(ValueError, match=r"probabilities max abs .* past accuracy_tolerance"):
        GeBackend(runtime, cores=1).load(spec_for(strict))
    # The failed load released everything it held.
    assert runtime.devices[0].used == 0


def test_warm_up_samples_are_checked_without_running_again(tmp_path: Path) -> None:
    warmup = """model_warmup [ {
  name: "zeros" batch_size: 3
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
} ]
"""
    folder = make_model(
        tmp_path,
        "simple",
        "max_batch_size: 8\n" + SIMPLE_IO + warmup,
        EXAMPLES / "simple" / "1" / "model.onnx",
    )
    spec = spec_for(folder)
    loaded = GeBackend(SimRuntime(), cores=1).load(spec)
    try:
        assert loaded.executors[0].pool_stats()["executions"] == 1  # type: ignore[attr-defined]
        found = json.loads(spec.config.parameters["conversion_accuracy.1"].string_value)
        assert found["inputs"] == "warm-up" and found["samples"] == 1
        assert found["outputs"]["OUTPUT0"] == {"max_abs_error": 0.0, "max_rel_error": 0.0}
    finally:
        loaded.close()


def test_the_check_can_be_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = make_model(tmp_path, "c", CLASSIFIER_IO + params(accuracy_check="false"), CLASSIFIER)
    spec = spec_for(folder)
    with caplog.at_level(logging.INFO, logger="ge_serve.backends.ge.accuracy"):
        loaded = GeBackend(SimRuntime(), cores=1).load(spec)
    try:
        assert loaded.executors[0].pool_stats()["executions"] == 0  # type: ignore[attr-defined]
        assert "conversion_accuracy.1" not in spec.config.parameters
        assert "conversion accuracy check skipped (accuracy_check)" in caplog.text
        assert metric_rows(loaded.extra) == []
    finally:
        loaded.close()


def test_tolerances_parse_and_judge() -> None:
    assert parse_tolerance("") is None
    tol = parse_tolerance("1e-3")
    assert tol is not None and tol.abs == 1e-3 and tol.rel is None
    tol = parse_tolerance("abs=0.1, rel=0.01")
    assert tol is not None and tol.exceeded(OutputError("y", 0.05, 0.02))
    assert not tol.exceeded(OutputError("y", 0.05, 0.005))
    for bad in ("abs=x", "max=1", "rel=-1"):
        with pytest.raises(ValueError, match="accuracy_tolerance"):
            parse_tolerance(bad)
