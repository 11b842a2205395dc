"""The sentence-embedding example end to end: examples/minilm/build.py's repository in the
real ge-serve process, driven by tritonclient over HTTP and gRPC.

The repository is built once for the session (tests/minilm.py: batched_repository, shared
with test_openai_client.py) and served by one server; the reference is
computed in process (tests/minilm.py: tokenizers with every sentence padded to CONTEXT tokens,
onnxruntime on the same encoder graph, numpy pooling), so what is compared is the serving:
the Python tokenizer padding each request to its own length, the GE backend on the
simulated NPU with its ND gears, the scheduler padding each request up to a length gear
and trimming it back, the ensemble and batching inside it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from minilm import (
    CONTEXT,
    ODD_SENTENCES,
    PAIRS,
    PAST_128,
    TOO_LONG,
    batched_repository,
    build_module,
    cosine,
    package_files,
    reference_embeddings,
    require,
    token_count,
    tokenize,
)
from protocols import PROTOCOLS, Triton
from serverproc import REPO_ROOT, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLIENT = REPO_ROOT / "examples" / "clients" / "minilm_similarity.py"
# Sentences for the 32-, 64- and 128-token gears (27, 49 and 102 tokens).
LONGER = (
    "The committee, after weeks of careful debate, finally agreed on a budget that funds "
    "the new library and repairs the old bridge.",
    "Although the forecast promised sunshine for the whole weekend, a cold front moved in "
    "from the north on Saturday morning, and the hikers who had set out early found "
    "themselves walking through sleet and fog for hours before they reached the shelter.",
    "word " * 100,
)
# A concurrent burst: one sentence each, every one of its own length (2 to 16 tokens), so
# that they batch only padded to a common length gear (16).
BURST = (
    "",
    "Hello.",
    "Where is the station?",
    "Someone is playing an instrument.",
    "A man is playing a guitar.",
    "He repaired the engine of his truck.",
    "A kitten is napping on the couch.",
    "My neighbour grows tomatoes, beans and pumpkins in her small garden.",
)
SENTENCES: tuple[str, ...] = (
    *(s for triple in PAIRS for s in triple),
    *ODD_SENTENCES,
    *LONGER,
    *PAST_128,
)
MAX_BATCH = 8
LENGTH_GEARS = (16, 32, 64, 128, 256)
BATCH_GEARS = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """(repository, reference embedding per sentence), built and computed once."""
    require()
    files = package_files()
    repo = batched_repository(tmp_path_factory)
    encoder = repo / "minilm_encoder" / "1" / "model.onnx"
    every = tuple(dict.fromkeys((*SENTENCES, *BURST)))
    expected = reference_embeddings(encoder, files.tokenizer_json, every)
    return repo, dict(zip(every, expected, strict=True))


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


def logged_gears(log: str, model: str) -> set[tuple[int, int]]:
    """The (batch, tokens) ND gears the log says `model` loaded with on the simulated NPU;
    every input of a gear has the same pair."""
    found = re.search(
        rf"model '{model}' version 1 on sim: 1 slot\(s\) on NPU 0, dims shapes \((.*?)\),", log
    )
    assert found, f"no ND-gear load line for {model}"
    gears: set[tuple[int, int]] = set()
    for gear in found.group(1).split("; "):
        pairs = {(int(b), int(t)) for b, t in re.findall(r"\[(\d+), (\d+)(?:, 384)?\]", gear)}
        assert len(pairs) == 1, gear
        gears |= pairs
    return gears


def test_the_encoder_and_the_pooling_run_on_the_simulated_npu_with_nd_gears(
    minilm_server: ServerProcess,
) -> None:
    log = minilm_server.log()
    every = {(b, n) for n in LENGTH_GEARS for b in BATCH_GEARS}
    for model in ("minilm_encoder", "minilm_pool"):
        assert logged_gears(log, model) == every
    buckets = "; ".join(f"attention_mask[{n}], input_ids[{n}]" for n in LENGTH_GEARS)
    assert f"model 'minilm_encoder': shape buckets {buckets}" in log
    assert "GE backend: simulated NPU" in log and "host CPU" not in log
    assert "model 'minilm_tokenizer' version 1: 1 Python instance(s)" in log
    triton = Triton.connect("http", minilm_server)
    try:
        encoder = triton.client.get_model_metadata("minilm_encoder")
        assert encoder["platform"] == "npu_ge"
        assert [i["shape"] for i in encoder["inputs"]] == [[-1, -1]] * 2
        assert encoder["outputs"][0]["shape"] == [-1, -1, 384]
        metadata = triton.client.get_model_metadata("minilm")
        assert metadata["platform"] == "ensemble"
        assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
        assert metadata["outputs"] == [
            {"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]},
            {"name": "num_input_tokens", "datatype": "INT32", "shape": [-1, 1]},
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


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_ensemble_answers_each_sentences_token_count(
    protocol: str, minilm_server: ServerProcess
) -> None:
    # Beside the vector: what /v1/embeddings sums into usage.prompt_tokens.
    files = package_files()
    sentences = (PAIRS[0][0], ODD_SENTENCES[0], ODD_SENTENCES[2])
    triton = Triton.connect(protocol, minilm_server)
    try:
        text = np.array([[s.encode()] for s in sentences], dtype=np.object_)
        counts = triton.infer("minilm", {"TEXT": text}).as_numpy("num_input_tokens")
    finally:
        triton.close()
    assert counts.dtype == np.int32 and counts.shape == (3, 1)
    assert counts[:, 0].tolist() == [token_count(files.tokenizer_json, s) for s in sentences]
    assert counts[1:, 0].tolist() == [2, CONTEXT]  # [CLS] [SEP]; the longest served


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_sentence_past_the_context_is_refused_not_truncated(
    protocol: str, minilm_server: ServerProcess, reference: dict[str, np.ndarray]
) -> None:
    # One token past the context is a 400 / INVALID_ARGUMENT naming the context and the
    # count, in vLLM's words, for the whole request it is in; the next request is served.
    limit = (
        f"This model's maximum context length is {CONTEXT} tokens. However, your prompt "
        f"contains {CONTEXT + 1} input tokens, which exceeds this limit even without any "
        "output tokens."
    )
    triton = Triton.connect(protocol, minilm_server)
    try:
        for sentences, where in (([TOO_LONG], ""), ([SENTENCES[0], TOO_LONG], " (TEXT row 1)")):
            text = np.array([[s.encode()] for s in sentences], dtype=np.object_)
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("minilm", {"TEXT": text})
            triton.expect_error(caught.value, "INVALID_ARGUMENT", limit)
            assert caught.value.message().endswith(f"length of the input prompt{where}.")
        (after,) = embed(triton, [SENTENCES[0]])
        np.testing.assert_allclose(after, reference[SENTENCES[0]], atol=1e-4, rtol=0)
    finally:
        triton.close()


def test_text_past_128_tokens_is_embedded_whole(
    served: dict[str, Any], reference: dict[str, np.ndarray]
) -> None:
    # The probe that found the truncation: two texts the same for their first 151 tokens
    # got the same vector. Within the context, each is embedded whole, as the reference
    # (every token, no truncation) embeds it.
    by_text = dict(zip(SENTENCES, served["embeddings"], strict=True))
    first, second = (by_text[text] for text in PAST_128)
    for text in PAST_128:
        np.testing.assert_allclose(by_text[text], reference[text], atol=1e-4, rtol=0)
    assert cosine(first, second) < 0.95


def test_a_paraphrase_ranks_above_an_unrelated_sentence(served: dict[str, Any]) -> None:
    by_text = dict(zip(SENTENCES, served["embeddings"], strict=True))
    for anchor, paraphrase, unrelated in PAIRS:
        close = cosine(by_text[anchor], by_text[paraphrase])
        far = cosine(by_text[anchor], by_text[unrelated])
        assert close > far + 0.2, (served["protocol"], anchor, close, far)


def test_every_length_gear_serves_its_sentences(
    minilm_server: ServerProcess, reference: dict[str, np.ndarray]
) -> None:
    # One request per sentence: 2 to CONTEXT tokens, padded up to each of the gears.
    files = package_files()
    sentences = (ODD_SENTENCES[0], ODD_SENTENCES[1], *LONGER, ODD_SENTENCES[2])
    lengths = [token_count(files.tokenizer_json, s) for s in sentences]
    gears = [min(g for g in LENGTH_GEARS if g >= n) for n in lengths]
    assert gears == [16, 32, 32, 64, 128, 256]
    triton = Triton.connect("grpc", minilm_server)
    try:
        for sentence in sentences:
            (got,) = embed(triton, [sentence])
            np.testing.assert_allclose(got, reference[sentence], atol=1e-4, rtol=0)
    finally:
        triton.close()


def test_the_encoder_answers_at_the_request_length_and_refuses_one_beyond_its_gears(
    built: tuple[Path, dict[str, np.ndarray]], minilm_server: ServerProcess
) -> None:
    files = package_files()
    ids, mask = tokenize(files.tokenizer_json, LONGER[:1], None)  # 27 tokens: the 32 gear
    assert ids.shape == (1, 27)
    encoder = built[0] / "minilm_encoder" / "1" / "model.onnx"
    session = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"])
    wide_ids, wide_mask = tokenize(files.tokenizer_json, LONGER[:1])
    (expected,) = session.run(None, {"input_ids": wide_ids, "attention_mask": wide_mask})
    triton = Triton.connect("http", minilm_server)
    try:
        tensors = {"input_ids": ids, "attention_mask": mask}
        got = triton.infer("minilm_encoder", tensors).as_numpy("last_hidden_state")
        assert got.shape == (1, 27, 384)  # trimmed back from the gear
        np.testing.assert_allclose(got, expected[:, :27], atol=1e-4, rtol=0)

        long = np.ones((1, CONTEXT + 1), np.int64)
        with pytest.raises(InferenceServerException) as caught:
            triton.infer("minilm_encoder", {n: long for n in tensors})
        triton.expect_error(caught.value, "INVALID_ARGUMENT", "fits none of its shape buckets")
        assert f"input_ids[{CONTEXT}]" in caught.value.message()
    finally:
        triton.close()


def test_a_burst_of_different_lengths_runs_together_on_the_encoder(
    minilm_server: ServerProcess, reference: dict[str, np.ndarray]
) -> None:
    files = package_files()
    lengths = [token_count(files.tokenizer_json, s) for s in BURST]
    assert len(set(lengths)) == len(BURST) and max(lengths) <= 16  # all for the 16 gear
    triton = Triton.connect("grpc", minilm_server)
    clients = [Triton.connect("grpc", minilm_server) for _ in BURST]
    try:
        before = stats(triton, "minilm_encoder")
        results: dict[int, np.ndarray | BaseException] = {}
        start = threading.Barrier(len(BURST))

        def send(index: int) -> None:
            start.wait(timeout=30)
            try:
                results[index] = embed(clients[index], [BURST[index]])[0]
            except BaseException as exc:  # reported below, in the test's thread
                results[index] = exc

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(BURST))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for index, sentence in enumerate(BURST):
            found = results[index]
            assert not isinstance(found, BaseException), found
            np.testing.assert_allclose(found, reference[sentence], atol=1e-4, rtol=0)

        after = stats(triton, "minilm_encoder")
        samples = int(after["inference_count"]) - int(before.get("inference_count", 0))
        executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
        assert samples == len(BURST)
        # No two requests have the same length, so exact-shape batching would run each on
        # its own: fewer executions than requests means lengths ran together, padded to 16.
        # (The requests that queue while one executes, and the tokenizer's batches, arrive
        # together.)
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


def test_the_fixed_length_pipeline_gives_the_same_embeddings(
    built: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    build = build_module()
    repo = tmp_path / "minilm-128"
    build.build_repository(repo, files=package_files(), fixed_length=128)
    with running_server([repo], timeout=120.0) as server:
        log = server.log()
        for model in ("minilm_encoder", "minilm_pool"):
            loaded = f"model '{model}' version 1 on sim: 1 slot(s) on NPU 0, gears [1, 2, 4, 8]"
            assert loaded in log
        assert "shape buckets" not in log
        triton = Triton.connect("http", server)
        try:
            sentences = (PAIRS[0][0], ODD_SENTENCES[1], LONGER[0])
            got = embed(triton, sentences)
        finally:
            triton.close()
    expected = np.stack([built[1][s] for s in sentences])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
