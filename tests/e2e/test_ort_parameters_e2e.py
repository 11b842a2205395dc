"""onnxruntime model parameters Triton's onnxruntime backend checks (qa/L0_onnx_optimization):
a bad value fails that model's load with Triton's reason while the other models serve, and
valid ones are applied, with Triton's verbose lines."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from ge_helpers import EXAMPLES, SIMPLE_IO, params
from modelgen import write_model
from serverproc import ServerProcess, running_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SIMPLE = (EXAMPLES / "simple" / "1" / "model.onnx").read_bytes()
BODY = 'backend: "onnxruntime"\nmax_batch_size: 8\n' + SIMPLE_IO
ACCELERATOR = (
    "optimization { execution_accelerators { "
    'cpu_execution_accelerator [ { name: "unknown_cpu" } ] } }'
)

# model name -> (its config beyond BODY, Triton's reason)
REFUSED = {
    "execution_mode_2": (
        params(execution_mode="2"),
        "Invalid configuration value provided. Expected values for  execution_mode are 0 or 1 "
        "but got 2 .",
    ),
    "mem_arena_abc": (params(enable_mem_arena="abc"), "failed to convert 'abc' to boolean"),
    "inter_op_abc": (
        params(inter_op_thread_count="abc"),
        "failed to convert 'abc' to integral number",
    ),
    "unknown_cpu": (ACCELERATOR, "unknown Execution Accelerator 'unknown_cpu' is requested"),
}
TUNED = "optimization { graph { level: 1 } }\n" + params(
    execution_mode="1",
    inter_op_thread_count="2",
    intra_op_thread_count="1",
    enable_mem_arena="1",
    enable_mem_pattern="0",
    session__dot__use_device_allocator_for_initializers="1",
    memory__dot__enable_memory_arena_shrinkage="cpu:0",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ort_parameters")
    for name, (extra, _) in REFUSED.items():
        write_model(repo, name, SIMPLE, f'name: "{name}"\n{BODY}{extra}')
    write_model(repo, "tuned", SIMPLE, f'name: "tuned"\n{BODY}{TUNED}')
    flags = ["--exit-on-error=false", "--log-verbose=1"]
    with running_server([repo], flags, wait_ready=False) as proc:
        wait_for(proc, "/v2/health/live", 60)
        wait_for(proc, "/v2/models/tuned/ready", 60)
        yield proc


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_bad_parameter_fails_the_load_with_tritons_reason(
    server: ServerProcess, name: str
) -> None:
    rows = httpx.post(server.base_url + "/v2/repository/index", timeout=10).json()
    (row,) = [row for row in rows if row["name"] == name]
    reason = REFUSED[name][1]
    assert row["state"] == "UNAVAILABLE" and reason in row.get("reason", ""), row
    assert reason in server.log()


def test_valid_parameters_are_applied_and_the_model_serves(server: ServerProcess) -> None:
    inputs = [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
    response = httpx.post(
        server.base_url + "/v2/models/tuned/infer", json={"inputs": inputs}, timeout=30
    )
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == [2 * i for i in range(16)]
    log = server.log()
    for line in (
        "Configuring enable_mem_arena to 1",
        "Configuring enable_mem_pattern to 0",
        "Configuring 'session.use_device_allocator_for_initializers' to '1' for 'tuned'",
        "Configuring memory.enable_memory_arena_shrinkage to cpu:0",
    ):
        assert line in log, line
    # The graph level is applied, so not reported as ignored.
    assert "model 'tuned': config field 'optimization'" not in log
