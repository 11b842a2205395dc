"""Repository agents a config names run at load (server/models/repoagents.py): the built-in
`checksum` agent fails a model whose file does not hash to the digest its config gives,
an agent ge-serve does not have fails the model, and the other models keep serving, as in
Triton's qa/L0_repoagent_checksum and the core's repo agent lookup."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import pytest
from modelgen import identity_model, write_model
from onnx import TensorProto
from serverproc import running_server, start_server

MODEL = identity_model(TensorProto.FLOAT, ("batch", 3)).SerializeToString()
DIGEST = hashlib.md5(MODEL, usedforsecurity=False).hexdigest()


def _config(name: str, agents: str = "") -> str:
    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'
        f"model_repository_agents {{ agents [ {agents} ] }}\n"
        if agents
        else f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'
    )


def _checksum(path: str, digest: str) -> str:
    return f'{{ name: "checksum" parameters {{ key: "MD5:{path}" value: "{digest}" }} }}'


def _write(repo: Path, name: str, agents: str = "") -> Path:
    return write_model(repo, name, MODEL, _config(name, agents))


def _infer(base_url: str, name: str) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    return httpx.post(f"{base_url}/v2/models/{name}/infer", json=body, timeout=30)


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_checksum_and_unknown_agents_decide_the_load(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(MODEL)
    _write(repo, "plain")
    _write(repo, "good", _checksum("1/model.onnx", DIGEST))
    _write(repo, "bad", _checksum("1/model.onnx", "invalid_checksum"))
    _write(repo, "unknown", '{ name: "decrypt" }')
    _write(repo, "climbs", _checksum("../good/1/model.onnx", DIGEST))
    linked = _write(repo, "linked", _checksum("1/other.onnx", DIGEST))
    os.symlink(outside, linked / "1" / "other.onnx")
    extra = ["--model-control-mode=explicit", "--load-model=plain", "--load-model=good"]
    with running_server([repo], extra) as server:
        url = f"{server.base_url}/v2/repository/models"
        # A matching digest loads and serves.
        assert _infer(server.base_url, "good").json()["outputs"][0]["data"] == [1, 2, 3]
        expected = {
            "bad": (
                "failed to load 'bad': Mismatched MD5 hash for file 1/model.onnx, "
                f"expect: invalid_checksum, got: {DIGEST}"
            ),
            "unknown": (
                "failed to load 'unknown': unable to find 'libtritonrepoagent_decrypt.so' "
                "for repo agent 'decrypt', searched: ge-serve's built-in agents (checksum)"
            ),
            "climbs": (
                "failed to load 'climbs': checksum agent parameter 'MD5:../good/1/model.onnx' "
                "must name a file inside the model folder ('..' leads out of the folder)"
            ),
            "linked": (
                "failed to load 'linked': checksum agent parameter 'MD5:1/other.onnx' must name "
                "a file inside the model folder (a symbolic link in it leads out of the folder)"
            ),
        }
        for name, error in expected.items():
            response = httpx.post(f"{url}/{name}/load", timeout=30)
            assert response.status_code == 400, response.text
            assert response.json()["error"].startswith(error), response.text
            assert _infer(server.base_url, name).status_code != 200
        index = httpx.post(f"{server.base_url}/v2/repository/index", timeout=30).json()
        states = {entry["name"]: (entry.get("state"), entry.get("reason", "")) for entry in index}
        for name, error in expected.items():
            state, reason = states[name]
            assert state == "UNAVAILABLE" and error.split(": ", 1)[1] in reason, states
        assert states["plain"][0] == states["good"][0] == "READY", states
        # The failures leave the other models serving.
        for name in ("plain", "good"):
            assert _infer(server.base_url, name).status_code == 200
        log = server.log()
    assert "'bad': Mismatched MD5 hash for file 1/model.onnx" in log


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_mismatched_checksum_stops_startup(tmp_path: Path) -> None:
    # qa/L0_repoagent_checksum: with the default --exit-on-error the server does not start.
    repo = tmp_path / "repo"
    _write(repo, "plain")
    _write(repo, "identity_int32", _checksum("1/model.onnx", "invalid_checksum"))
    server = start_server([repo], wait_ready=False)
    try:
        code = server.process.wait(90)
    finally:
        server.stop()
    assert code != 0
    assert "'identity_int32': Mismatched MD5 hash for file 1/model.onnx" in server.log()
