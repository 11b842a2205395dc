"""`intra_op_thread_count` is bounded on every backend that runs onnxruntime sessions:
onnxruntime starts the threads when the session is made, and thousands of them hang the
load when the process runs out of threads."""

from __future__ import annotations

from pathlib import Path

import pytest
from ge_helpers import EXAMPLES, SIMPLE_IO, make_model, params, spec_for

from ge_serve.backends.base import LoadedModel
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.onnx_io import max_intra_op_threads
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend

SIMPLE = EXAMPLES / "simple" / "1" / "model.onnx"
pytestmark = pytest.mark.timeout(120)


def load(tmp_path: Path, backend: str, threads: str) -> LoadedModel:
    body = "max_batch_size: 8\n" + SIMPLE_IO + params(intra_op_thread_count=threads)
    folder = make_model(tmp_path, f"simple_{threads}", body, SIMPLE)
    if backend == "onnxruntime":
        return OnnxRuntimeBackend().load(spec_for(folder))
    return GeBackend(SimRuntime(), {"accuracy_check": "false"}, cores=1).load(spec_for(folder))


@pytest.mark.parametrize("backend", ["onnxruntime", "ge"])
def test_a_thread_count_past_the_bound_fails_the_load_naming_it(
    tmp_path: Path, backend: str
) -> None:
    bound = max_intra_op_threads()
    # Just past the bound (not thousands): without the check this load would succeed.
    with pytest.raises(ValueError, match=rf"intra_op_thread_count {bound + 1} .*at most {bound}"):
        load(tmp_path, backend, str(bound + 1))
    # The onnxruntime backend says it in Triton's words (ParseIntValue).
    refusal = {
        "onnxruntime": "failed to convert 'many' to integral number",
        "ge": "intra_op_thread_count must be a whole number",
    }[backend]
    with pytest.raises(ValueError, match=refusal):
        load(tmp_path, backend, "many")
    load(tmp_path, backend, "2").close()
