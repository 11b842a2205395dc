"""`file:` overrides are written only inside their private folder, whatever the names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ge_serve.server.errors import ServerError
from ge_serve.server.models.repository import (
    check_model_name,
    fingerprint,
    override_target,
    write_overrides,
)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    "name",
    [
        "../escape.onnx",
        "1/../../escape.onnx",
        "/../etc/passwd",
        "1//model.onnx",
        "./1/model.onnx",
        "1/./model.onnx",
        "1\\..\\model.onnx",
        "",
        "1/model.onnx/",
        "1/\x00model.onnx",
    ],
)
def test_escaping_names_are_refused_and_nothing_is_written(tmp_path: Path, name: str) -> None:
    root = tmp_path / "private"
    root.mkdir()
    files = {"1/model.onnx": b"ok", name: b"evil"}
    with pytest.raises(ServerError, match="must be a relative path inside the model folder"):
        write_overrides(root, files)
    # Every name is checked before the first byte is written.
    assert tree(tmp_path) == ["private"]


def test_a_leading_slash_is_the_model_folder_as_in_triton(tmp_path: Path) -> None:
    root = tmp_path / "private"
    root.mkdir()
    write_overrides(root, {"/1/model.py": b"a", "/etc/passwd": b"b"})
    assert tree(tmp_path) == ["private", "private/1", "private/1/model.py", "private/etc",
                              "private/etc/passwd"]  # fmt: skip


def test_a_symlink_inside_the_folder_cannot_redirect_a_write(tmp_path: Path) -> None:
    root = tmp_path / "private"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "1")
    os.symlink(outside / "target", root / "model.onnx")
    with pytest.raises(ServerError, match="escapes the folder"):
        write_overrides(root, {"1/model.onnx": b"evil"})
    with pytest.raises(ServerError, match="could not be written"):
        write_overrides(root, {"model.onnx": b"evil"})
    assert list(outside.iterdir()) == []


def test_overrides_are_written_where_named(tmp_path: Path) -> None:
    write_overrides(tmp_path, {"1/model.onnx": b"one", "2/sub/w.bin": b"two", "labels.txt": b"a"})
    assert (tmp_path / "1" / "model.onnx").read_bytes() == b"one"
    assert (tmp_path / "2" / "sub" / "w.bin").read_bytes() == b"two"
    assert (tmp_path / "labels.txt").read_bytes() == b"a"
    assert override_target(tmp_path, "1/model.onnx") == tmp_path / "1" / "model.onnx"


def test_a_path_too_deep_to_write_or_remove_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    deep = "a/" * 2000 + "x"
    with pytest.raises(ServerError) as caught:
        write_overrides(tmp_path, {"1/model.onnx": b"ok", deep: b"x"})
    assert caught.value.message == (
        f"file override 'file:{deep}' has 2001 path components; at most 64 are allowed"
    )
    assert tree(tmp_path) == []
    write_overrides(tmp_path, {"a/" * 63 + "x": b"x"})  # 64 components is fine
    assert (tmp_path.joinpath(*["a"] * 63) / "x").read_bytes() == b"x"


def test_a_name_used_as_file_and_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="could not be written"):
        write_overrides(tmp_path, {"1": b"x", "1/model.onnx": b"y"})


@pytest.mark.parametrize("name", ["..", ".", " . ", "a/b", "a\\b", "a\x00"])
def test_model_names_that_are_not_one_folder_are_refused(name: str) -> None:
    with pytest.raises(ServerError) as caught:
        check_model_name(name)
    assert caught.value.message == (
        f"invalid model name '{name}', model name must not contain path traversal characters"
    )


@pytest.mark.parametrize("name", ["", " ", "\t\n\v\f\r"])
def test_an_empty_model_name_is_refused(name: str) -> None:
    with pytest.raises(ServerError) as caught:
        check_model_name(name)
    assert caught.value.message == (
        "Model name cannot be empty. Please enter a valid name to deploy."
    )


def test_fingerprint_sees_content_edits_and_new_versions(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"v1")
    config = tmp_path / "config.pbtxt"
    config.write_text("max_batch_size: 1\n")
    first = fingerprint(tmp_path)
    assert fingerprint(tmp_path) == first
    stat = config.stat()
    config.write_text("max_batch_size: 2\n")  # same size
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    second = fingerprint(tmp_path)
    assert second != first
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "model.onnx").write_bytes(b"v2")
    assert fingerprint(tmp_path) != second
    (tmp_path / ".hidden-temp").write_bytes(b"ignored")
    third = fingerprint(tmp_path)
    (tmp_path / ".hidden-temp").write_bytes(b"still ignored")
    assert fingerprint(tmp_path) == third
