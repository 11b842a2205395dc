"""The model repository on disk: scanning, config.pbtxt, version folders and policy, labels,
and loading through the lifecycle (in process, no network)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from modelgen import add_sub_model, identity_model, write_model
from onnx import TensorProto

from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.reports import ModelState, RepositoryEntry
from ge_serve.server.models.lifecycle import ModelLifecycle
from ge_serve.server.models.repository import (
    ModelRepository,
    ModelSource,
    available_versions,
    read_config,
    read_labels,
    select_versions,
)


def config_of(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


# --- scanning --------------------------------------------------------------------------------


def test_scan_several_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    write_model(first, "m1", None)
    write_model(first, "m2", None)
    write_model(second, "m3", None)
    (first / "README.txt").write_text("not a model")
    (second / ".hidden").mkdir()
    found = ModelRepository([first, second]).scan()
    assert sorted(found) == ["m1", "m2", "m3"]
    assert found["m3"] == ModelSource("m3", second / "m3")
    assert found["m1"].path == first / "m1"


def test_scan_leaves_out_a_name_in_two_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    write_model(first, "dup", None)
    write_model(second, "dup", None)
    write_model(second, "other", None)
    found = ModelRepository([first, second]).scan_all()
    assert sorted(found.models) == ["other"]
    assert found.duplicates == {"dup"}
    namespaced = ModelRepository([first, second], namespacing=True).scan_all()
    assert len(namespaced.models) == 3 and not namespaced.duplicates


def test_scan_refuses_a_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="is not a folder"):
        ModelRepository([tmp_path / "nowhere"]).scan()


# --- config.pbtxt ----------------------------------------------------------------------------


def test_read_config_parses_text_format(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "m", None, 'name: "m"\nmax_batch_size: 3\n')
    config = read_config(ModelSource("m", folder))
    assert config.name == "m"
    assert config.max_batch_size == 3


def test_read_config_fills_a_missing_name_and_a_missing_file(tmp_path: Path) -> None:
    with_config = write_model(tmp_path, "named", None, "max_batch_size: 2\n")
    assert read_config(ModelSource("named", with_config)).name == "named"
    without_config = write_model(tmp_path, "bare", None)
    config = read_config(ModelSource("bare", without_config))
    assert config.name == "bare"
    assert not config.input


def test_read_config_name_must_match_folder(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "folder_name", None, 'name: "other_name"\n')
    with pytest.raises(ServerError) as info:
        read_config(ModelSource("folder_name", folder))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "'other_name'" in info.value.message and "'folder_name'" in info.value.message


def test_read_config_reports_parse_errors(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "bad", None, 'name: "bad"\nmax_batch_size: [oops\n')
    with pytest.raises(ServerError, match=r"failed to parse config\.pbtxt"):
        read_config(ModelSource("bad", folder))


def test_read_config_override_text_wins(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "m", None, 'name: "m"\nmax_batch_size: 3\n')
    config = read_config(ModelSource("m", folder), 'name: "m"\nmax_batch_size: 5\n')
    assert config.max_batch_size == 5


# --- version folders and policy ----------------------------------------------------------------


def test_version_folders_skip_non_numeric_and_zero_prefixed(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "m", None, versions=[1, 2, 10, "0", "03", "v4", "5a"])
    (folder / "7").write_text("a file, not a version folder")
    assert available_versions(folder) == [1, 2, 10]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [10]),
        ("version_policy: { latest: { num_versions: 1 } }", [10]),
        ("version_policy: { latest: { num_versions: 2 } }", [3, 10]),
        ("version_policy: { latest: { num_versions: 9 } }", [1, 3, 10]),
        ("version_policy: { all: {} }", [1, 3, 10]),
        ("version_policy: { specific: { versions: [3, 1] } }", [1, 3]),
    ],
)
def test_version_policy(tmp_path: Path, policy: str, expected: list[int]) -> None:
    folder = write_model(tmp_path, "m", None, versions=[1, 3, 10, "02"])
    assert select_versions(config_of(policy), folder) == expected


def test_specific_policy_skips_a_missing_version_as_triton(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton logs a named version without a folder and serves the others."""
    folder = write_model(tmp_path, "m", None, versions=[1])
    with caplog.at_level(logging.ERROR):
        chosen = select_versions(
            config_of('name: "m" version_policy: { specific: { versions: [1, 4] } }'), folder
        )
    assert chosen == [1]
    assert "version 4 is specified for model 'm', but the version directory is not present" in (
        caplog.text
    )


@pytest.mark.parametrize(
    "policy",
    [
        "version_policy: { specific: { versions: [4, 5] } }",
        "version_policy: { latest: { num_versions: 0 } }",
        "version_policy: { latest: {} }",
    ],
)
def test_a_policy_that_selects_no_version_fails_with_tritons_message(
    tmp_path: Path, policy: str
) -> None:
    folder = write_model(tmp_path, "m", None, versions=[1, 3])
    with pytest.raises(ServerError) as caught:
        select_versions(config_of(f'name: "m" {policy}'), folder)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert str(caught.value).startswith(
        "at least one version must be available under the version policy of model 'm'"
    )
    assert "[1, 3]" in str(caught.value)


def test_no_version_folder_fails(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "m", None, versions=["0", "abc"])
    with pytest.raises(ServerError, match="no version folder"):
        select_versions(config_of(""), folder)


# --- labels ------------------------------------------------------------------------------------

LABELED = """
name: "m"
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
"""


def test_labels_file_is_read_per_output(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "m", None, LABELED)
    (folder / "labels.txt").write_text("cat\ndog\nbird\n", encoding="utf-8")
    assert read_labels(config_of(LABELED), folder) == {"OUT": ["cat", "dog", "bird"]}


def test_missing_labels_file_fails(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "m", None, LABELED)
    with pytest.raises(ServerError, match=r"labels file 'labels\.txt' for output 'OUT'"):
        read_labels(config_of(LABELED), folder)


# --- loading through the lifecycle -----------------------------------------------------------


async def test_default_model_filename(tmp_path: Path, lifecycle: ModelLifecycle) -> None:
    model = identity_model(TensorProto.FLOAT)
    write_model(
        tmp_path, "custom", model, 'name: "custom"\ndefault_model_filename: "net.onnx"\n',
        filename="net.onnx",
    )  # fmt: skip
    write_model(tmp_path, "wrong_name", model, filename="net.onnx")
    await lifecycle.load("custom")
    assert lifecycle.get("custom").loaded.executors
    with pytest.raises(ServerError) as info:
        await lifecycle.load("wrong_name")
    assert "failed to load 'wrong_name'" in info.value.message
    assert "model.onnx" in info.value.message


async def test_versions_load_and_the_highest_serves(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    write_model(
        tmp_path, "m", identity_model(TensorProto.FLOAT), "version_policy: { all: {} }\n",
        versions=[1, 2, "007"],
    )  # fmt: skip
    await lifecycle.load("m")
    assert lifecycle.get("m").version == 2
    assert lifecycle.get("m", "1").version == 1
    assert lifecycle.index() == [
        RepositoryEntry("m", 1, ModelState.READY),
        RepositoryEntry("m", 2, ModelState.READY),
    ]
    with pytest.raises(ServerError) as info:
        lifecycle.get("m", "7")
    assert info.value.code is ErrorCode.NOT_FOUND
    assert info.value.message == "Request for unknown model: 'm' version 7 is not found"
    with pytest.raises(ServerError) as info:
        lifecycle.get("nope")
    assert info.value.message == "Request for unknown model: 'nope' is not found"


async def test_labels_reach_the_loaded_model(tmp_path: Path, lifecycle: ModelLifecycle) -> None:
    config = """
        name: "clf"
        max_batch_size: 2
        output [ { name: "OUTPUT" label_filename: "labels.txt" } ]
    """
    folder = write_model(tmp_path, "clf", identity_model(TensorProto.FLOAT, ("batch", 3)), config)
    (folder / "labels.txt").write_text("a\nb\nc\n")
    await lifecycle.load("clf")
    model = lifecycle.get("clf")
    assert model.labels == {"OUTPUT": ["a", "b", "c"]}
    assert model.outputs["OUTPUT"].label_filename == "labels.txt"


async def test_a_loaded_model_executes(tmp_path: Path, lifecycle: ModelLifecycle) -> None:
    write_model(tmp_path, "addsub", add_sub_model())
    await lifecycle.load("addsub")
    model = lifecycle.get("addsub")
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    outputs = await model.scheduler.submit(WorkItem({"A": a, "B": b}, batch_size=2))
    np.testing.assert_array_equal(outputs["SUM"], a + b)
    np.testing.assert_array_equal(outputs["DIFF"], a - b)


async def test_a_broken_model_is_unavailable_with_its_reason(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    write_model(tmp_path, "garbage", b"this is not an onnx file")
    write_model(tmp_path, "good", identity_model(TensorProto.FLOAT))
    errors = await lifecycle.load_many(["garbage", "good"])
    assert list(errors) == ["garbage"]
    assert "failed to load 'garbage'" in errors["garbage"]
    rows = {r.name: r for r in lifecycle.index()}
    assert (rows["garbage"].version, rows["garbage"].state) == (None, ModelState.UNAVAILABLE)
    assert "failed to parse ONNX file" in rows["garbage"].reason
    assert rows["good"] == RepositoryEntry("good", 1, ModelState.READY)
    assert lifecycle.is_ready("good") and not lifecycle.is_ready("garbage")
