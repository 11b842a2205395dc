"""A request of another shape closes the pending batch, end to end over HTTP and gRPC.

Triton's qa/L0_batcher `test_multi_batch_different_shape` setup: a model with a
variable-size input, `preferred_batch_size: [2, 6]` and a long queue delay (a minute
here, far beyond any bound the test waits). A lone request waits for the delay; a
request of another shape arriving behind it cannot join its batch, so under Triton's
rules the pending batch goes at once. The probe model answers each request with the
size of the batch it ran in.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import batch_probe_model
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROTOCOLS = ("http", "grpc")
WIDE, NARROW = 16, 8
# An answer the rule sends comes well within this; the delay is a minute.
ANSWER_S = 20.0

# Each protocol gets its own copy of each model, so that neither sees the other's queue.
MODELS = [
    ("shapes", "", False),
    ("shapes_priority", "priority_levels: 2 default_priority_level: 2", False),
    ("shapes_adaptive", "", True),
]


def config(name: str, batching: str, adaptive: bool) -> str:
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "BATCH" data_type: TYPE_FP32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{
  preferred_batch_size: [ 2, 6 ]
  max_queue_delay_microseconds: 60000000
  {batching}
}}
parameters {{ key: "adaptive_batching" value {{ string_value: "{str(adaptive).lower()}" }} }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("shapes-repo")
    models = [
        (f"{base}_{protocol}", batching, adaptive)
        for base, batching, adaptive in MODELS
        for protocol in PROTOCOLS
    ]
    for name, batching, adaptive in models:
        (repo / name / "1").mkdir(parents=True)
        onnx.save(batch_probe_model("W"), str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(config(name, batching, adaptive))
    with running_server([repo]) as proc:
        yield proc


def infer(
    server: ServerProcess, protocol: str, model: str, rows: int, width: int, priority: int = 0
) -> float:
    """One request on its own client; returns the size of the batch it ran in."""
    module = httpclient if protocol == "http" else grpcclient
    data = np.full((rows, width), float(width), dtype=np.float32)
    tensor = module.InferInput("INPUT0", [rows, width], "FP32")
    tensor.set_data_from_numpy(data)
    if protocol == "http":
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        try:
            result = client.infer(model, [tensor], priority=priority)
        finally:
            client.close()
    else:
        channel = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            result = channel.infer(model, [tensor], priority=priority, client_timeout=120)
        finally:
            channel.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    return float(result.as_numpy("BATCH")[0, 0])


def queued(server: ServerProcess, model: str, count: int) -> None:
    def depth() -> bool:
        found = scrape(server.metrics_url).find("ge_serve_queue_depth", model=model)
        return sum(value for _, value in found) == count

    poll(depth, 30, f"{count} requests queued for {model}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_of_another_shape_sends_the_pending_batch_at_once(
    server: ServerProcess, protocol: str
) -> None:
    model = f"shapes_{protocol}"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(infer, server, protocol, model, 1, WIDE)
        queued(server, model, 1)  # held: 1 is no preferred size and the delay is long
        second = pool.submit(infer, server, protocol, model, 1, NARROW)
        assert first.result(timeout=ANSWER_S) == 1
        assert not second.done()  # it waits for the delay in its own batch
        # With a third of its shape, 1 + 5 rows make a preferred size: both go.
        third = pool.submit(infer, server, protocol, model, 5, NARROW)
        assert second.result(timeout=ANSWER_S) == 6
        assert third.result(timeout=ANSWER_S) == 6


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_priority_levels_form_the_batch_that_closes_in_priority_order(
    server: ServerProcess, protocol: str
) -> None:
    model = f"shapes_priority_{protocol}"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        # A newcomer of a lower level closes the batch of the one ahead, as without levels.
        first = pool.submit(infer, server, protocol, model, 1, WIDE, priority=1)
        queued(server, model, 1)
        second = pool.submit(infer, server, protocol, model, 1, NARROW, priority=2)
        assert first.result(timeout=ANSWER_S) == 1
        assert not second.done()
        # A newcomer of a higher level heads the batch: the narrow one waiting at level 2
        # cannot join it, so it goes alone at once, and the narrow one keeps waiting.
        third = pool.submit(infer, server, protocol, model, 1, WIDE, priority=1)
        assert third.result(timeout=ANSWER_S) == 1
        assert not second.done()
        # A second narrow one at level 2 makes the preferred size 2.
        fourth = pool.submit(infer, server, protocol, model, 1, NARROW, priority=2)
        assert second.result(timeout=ANSWER_S) == 2
        assert fourth.result(timeout=ANSWER_S) == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_adaptive_batching_waits_for_neither_shape(server: ServerProcess, protocol: str) -> None:
    # The adaptive controller sends a request that finds the server empty at once: it
    # never held the wide request, so the narrow one has no batch to close.
    model = f"shapes_adaptive_{protocol}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, server, protocol, model, 1, WIDE)
        assert first.result(timeout=ANSWER_S) == 1
        second = pool.submit(infer, server, protocol, model, 1, NARROW)
        assert second.result(timeout=ANSWER_S) == 1
