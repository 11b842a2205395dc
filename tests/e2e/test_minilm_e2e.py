"""The sentence-embedding example end to end: examples/minilm/build.py's repository in the
real ge-serve process, driven by tritonclient over HTTP and gRPC.

The repository is built once for the module and served by one server; the reference is
computed in process (tests/minilm.py: tokenizers, onnxruntime on the same encoder graph,
numpy pooling), so what is compared is the serving: the Python tokenizer, the GE backend on
the simulated NPU, the ensemble and batching inside it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from minilm import (
    ODD_SENTENCES,
    PAIRS,
    build_module,
    cosine,
    reference_embeddings,
    require,
)
from protocols import PROTOCOLS, Triton
from serverproc import REPO_ROOT, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLIENT = REPO_ROOT / "examples" / "clients" / "minilm_similarity.py"
# Every sentence costs the encoder 128 tokens, however short: the set is kept small (the
# published similarities are checked in process, tests/unit/test_minilm_build.py).
SENTENCES: tuple[str, ...] = (*(s for triple in PAIRS for s in triple), *ODD_SENTENCES)
MAX_BATCH = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """(repository, reference embedding per sentence), built and computed once."""
    require()
    build = build_module()
    files = build.read_package()
    repo = tmp_path_factory.mktemp("minilm-models")
    build.build_repository(repo, batching=True, files=files)
    encoder = repo / "minilm_encoder" / "1" / "model.onnx"
    expected = reference_embeddings(encoder, files.tokenizer_json, SENTENCES)
    return repo, dict(zip(SENTENCES, expected, strict=True))


@pytest.fixture(scope="module")
def minilm_server(built: tuple[Path, dict[str, np.ndarray]]) -> Iterator[ServerProcess]:
    # Loading a 90 MB graph into the simulated NPU and starting the tokenizer's worker takes
    # a while on a busy two-core machine.
    with running_server([built[0]], timeout=120.0) as server:
        yield server


@pytest.fixture(scope="module")
def reference(built: tuple[Path, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return built[1]


def embed(triton: Triton, sentences: Sequence[str]) -> np.ndarray:
    """EMBEDDING for each sentence, MAX_BATCH rows per request."""
    rows = []
    for start in range(0, len(sentences), MAX_BATCH):
        chunk = sentences[start : start + MAX_BATCH]
        text = np.array([[s.encode("utf-8")] for s in chunk], dtype=np.object_)
        rows.append(triton.infer("minilm", {"TEXT": text}).as_numpy("EMBEDDING"))
    return np.concatenate(rows)


def stats(triton: Triton, model: str) -> dict[str, Any]:
    if triton.protocol == "http":
        found = triton.client.get_inference_statistics(model)
    else:
        found = triton.client.get_inference_statistics(model, as_json=True)
    (entry,) = found["model_stats"]
    return dict(entry)


def test_the_encoder_and_the_pooling_run_on_the_ge_backend(minilm_server: ServerProcess) -> None:
    log = minilm_server.log()
    for model in ("minilm_encoder", "minilm_pool"):
        assert f"model '{model}' version 1 on sim: 1 slot(s) on NPU 0, gears [1, 2, 4, 8]" in log
    assert "model 'minilm_tokenizer' version 1: 1 Python instance(s)" in log
    triton = Triton.connect("http", minilm_server)
    try:
        assert triton.client.get_model_metadata("minilm_encoder")["platform"] == "npu_ge"
        metadata = triton.client.get_model_metadata("minilm")
        assert metadata["platform"] == "ensemble"
        assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
        assert metadata["outputs"] == [
            {"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}
        ]
    finally:
        triton.close()


@pytest.fixture(scope="module", params=PROTOCOLS)
def served(request: pytest.FixtureRequest, minilm_server: ServerProcess) -> dict[str, Any]:
    """Every sentence embedded by the server over one protocol, once for the tests below."""
    triton = Triton.connect(request.param, minilm_server)
    try:
        got = embed(triton, SENTENCES)
    finally:
        triton.close()
    return {"protocol": request.param, "embeddings": got}


def test_embeddings_match_the_in_process_reference(
    served: dict[str, Any], reference: dict[str, np.ndarray]
) -> None:
    got = served["embeddings"]
    assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
    expected = np.stack([reference[s] for s in SENTENCES])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_paraphrase_ranks_above_an_unrelated_sentence(served: dict[str, Any]) -> None:
    by_text = dict(zip(SENTENCES, served["embeddings"], strict=True))
    for anchor, paraphrase, unrelated in PAIRS:
        close = cosine(by_text[anchor], by_text[paraphrase])
        far = cosine(by_text[anchor], by_text[unrelated])
        assert close > far + 0.2, (served["protocol"], anchor, close, far)


def test_concurrent_sentences_are_batched_and_each_gets_its_own_embedding(
    minilm_server: ServerProcess, reference: dict[str, np.ndarray]
) -> None:
    sentences = SENTENCES[:MAX_BATCH]
    triton = Triton.connect("grpc", minilm_server)
    clients = [Triton.connect("grpc", minilm_server) for _ in sentences]
    try:
        before = stats(triton, "minilm_encoder")
        results: dict[int, np.ndarray | BaseException] = {}
        start = threading.Barrier(len(sentences))

        def send(index: int) -> None:
            start.wait(timeout=30)
            try:
                results[index] = embed(clients[index], [sentences[index]])[0]
            except BaseException as exc:  # reported below, in the test's thread
                results[index] = exc

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sentences))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for index, sentence in enumerate(sentences):
            found = results[index]
            assert not isinstance(found, BaseException), found
            np.testing.assert_allclose(found, reference[sentence], atol=1e-4, rtol=0)

        after = stats(triton, "minilm_encoder")
        samples = int(after["inference_count"]) - int(before.get("inference_count", 0))
        executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
        assert samples == len(sentences)
        # The encoder's executions take far longer than a request takes to arrive: the
        # requests that queue meanwhile run together.
        assert executions < samples, (executions, samples)
    finally:
        for client in (triton, *clients):
            client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_text_that_is_not_utf8_fails_only_its_request(
    protocol: str, minilm_server: ServerProcess, reference: dict[str, np.ndarray]
) -> None:
    triton = Triton.connect(protocol, minilm_server)
    try:
        bad = np.array([[b"caf\xe9"]], dtype=np.object_)
        with pytest.raises(InferenceServerException) as caught:
            triton.infer("minilm", {"TEXT": bad})
        triton.expect_error(caught.value, "INVALID_ARGUMENT", "TEXT must be UTF-8")
        (after,) = embed(triton, [SENTENCES[0]])
        np.testing.assert_allclose(after, reference[SENTENCES[0]], atol=1e-4, rtol=0)
    finally:
        triton.close()


def test_the_client_script_over_http(minilm_server: ServerProcess) -> None:
    # Its default sentences: it checks the paraphrases' ranking itself.
    out = run_client("--protocol", "http", "--url", minilm_server.http_url)
    assert "6 embeddings of 384 dims" in out and "PASS: minilm_similarity (http)" in out


def test_the_client_script_over_grpc(minilm_server: ServerProcess) -> None:
    sentences = ("A man is eating food.", "A man is eating a meal.")
    out = run_client("--protocol", "grpc", "--url", minilm_server.grpc_url, *sentences)
    assert "2 embeddings of 384 dims" in out and "PASS: minilm_similarity (grpc)" in out
    assert "[1] A man is eating a meal." in out


def run_client(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(CLIENT), *args], capture_output=True, text=True, timeout=120,
        cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
