"""The built-in checksum agent's parameter forms and failures, with Triton's checksum
agent's words (server/models/repoagents.py; tests/e2e/test_repo_agents_e2e.py loads
models through a server)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from google.protobuf import text_format

from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.models.repoagents import run_agents

DATA = b"weights"
DIGEST = hashlib.md5(DATA, usedforsecurity=False).hexdigest()


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "w.bin").write_bytes(DATA)
    return tmp_path


def _config(parameters: dict[str, str], name: str = "checksum") -> model_config_pb2.ModelConfig:
    entries = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in parameters.items())
    text = f'name: "m" model_repository_agents {{ agents [ {{ name: "{name}" {entries} }} ] }}'
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _refusal(tmp_path: Path, parameters: dict[str, str]) -> ServerError:
    with pytest.raises(ServerError) as raised:
        run_agents(_config(parameters), _folder(tmp_path))
    return raised.value


def test_matching_digests_pass_with_the_algorithm_in_any_case(tmp_path: Path) -> None:
    run_agents(_config({"MD5:1/w.bin": DIGEST, "md5:./1/w.bin": DIGEST}), _folder(tmp_path))
    run_agents(_config({}), tmp_path / "empty")


def test_a_mismatch_names_the_file_and_both_digests(tmp_path: Path) -> None:
    error = _refusal(tmp_path, {"MD5:1/w.bin": DIGEST.upper()})
    assert error.code is ErrorCode.INVALID_ARG
    assert error.message == (
        f"Mismatched MD5 hash for file 1/w.bin, expect: {DIGEST.upper()}, got: {DIGEST}"
    )


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"1/w.bin": DIGEST}, "failed to parse key: 1/w.bin"),
        ({"SHA1:1/w.bin": DIGEST}, "Unsupported checksum algorithm: SHA1"),
        (
            {"MD5:1/none.bin": DIGEST},
            "failed to open text file for read 1/none.bin: No such file or directory",
        ),
        ({"MD5:1": DIGEST}, "failed to open text file for read 1: Is a directory"),
        (
            {"MD5:/etc/hostname": DIGEST},
            "checksum agent parameter 'MD5:/etc/hostname' must name a file inside the model "
            "folder (absolute paths are not allowed)",
        ),
    ],
)
def test_what_the_agent_refuses(tmp_path: Path, parameters: dict[str, str], message: str) -> None:
    assert _refusal(tmp_path, parameters).message == message


def test_an_agent_ge_serve_does_not_have_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ServerError) as raised:
        run_agents(_config({}, name="relocation"), _folder(tmp_path))
    assert raised.value.message.startswith(
        "unable to find 'libtritonrepoagent_relocation.so' for repo agent 'relocation', "
        "searched: ge-serve's built-in agents (checksum)"
    )
