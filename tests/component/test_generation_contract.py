"""The `llm` backend's responses against Triton's vLLM backend's contract (its
src/utils/request.py and ci/L0_additional_outputs_vllm): per-response token counts, the
`return_*` flags, finish_reason "None" until the last, and the refusal of a stream that
asks for the prompt. The tiny model (tests/llmrepo.py), driven in process."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest
from google.protobuf import text_format
from recording_sink import RecordingSink

from ge_serve.backends.base import ModelSpec, RequestContext
from ge_serve.backends.llm.backend import MODEL_KEY, LlmBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

TOKENS = 6
FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)
GREEDY = json.dumps({"temperature": 0, "ignore_eos": True}).encode()


def config_of(folder: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def engine(tmp_path: Path, flags: tuple[str, ...] = ()) -> GenerationScheduler:
    folder = llmrepo.write_tiny_llm(tmp_path, "m")
    with (folder / "config.pbtxt").open("a") as config:
        for name in flags:
            config.write(
                f'input {{ name: "{name}" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}\n'
            )
    return llmrepo.engine_of(folder)


async def ask(
    scheduler: GenerationScheduler,
    stream: bool,
    flags: Mapping[str, bool] | None = None,
    requested: tuple[str, ...] = (),
) -> RecordingSink:
    sink = RecordingSink()
    inputs: dict[str, Any] = {
        "text_input": np.array([b"Count me"], dtype=object),
        "max_tokens": np.array([TOKENS], np.int32),
        "stream": np.array([stream]),
        "sampling_parameters": np.array([GREEDY], dtype=object),
    }
    for name, value in (flags or {}).items():
        inputs[name] = np.array([value])
    context = RequestContext(responses=sink, requested_outputs=requested)
    await scheduler.submit(WorkItem(inputs, 1, context=context))
    await sink.until_final()
    assert sink.final and not sink.errors, sink.errors
    return sink


def reasons(sink: RecordingSink) -> list[list[bytes]]:
    return [list(r["finish_reason"]) for r in sink.responses]


async def test_each_streamed_response_counts_its_own_tokens(tmp_path: Path) -> None:
    """vLLM's num_output_tokens is len(token_ids) less what earlier responses counted, so
    a stream's counts sum to the answer's (Triton's frontend sums them)."""
    scheduler = engine(tmp_path)
    try:
        sink = await ask(scheduler, stream=True)
        counts = [int(r["num_output_tokens"][0]) for r in sink.responses]
        assert counts == [len(r["output_ids"]) for r in sink.responses]
        assert sum(counts) == TOKENS and len(counts) > 1 and max(counts) < TOKENS
        whole = await ask(scheduler, stream=False)
        assert [int(r["num_output_tokens"][0]) for r in whole.responses] == [TOKENS]
    finally:
        await scheduler.close(1)


async def test_finish_reason_is_none_until_the_last_response(tmp_path: Path) -> None:
    scheduler = engine(tmp_path)
    try:
        sink = await ask(scheduler, stream=True, requested=("finish_reason",))
        assert reasons(sink) == [[b"None"]] * (len(sink.responses) - 1) + [[b"length"]]
        # Not named among the outputs: only the last response has it, as before.
        plain = await ask(scheduler, stream=True)
        assert ["finish_reason" in r for r in plain.responses][-2:] == [False, True]
    finally:
        await scheduler.close(1)


async def test_declared_flags_make_the_outputs_opt_in(tmp_path: Path) -> None:
    extras = ("finish_reason", "num_input_tokens", "num_output_tokens")
    scheduler = engine(tmp_path, FLAGS)
    try:
        for stream in (True, False):
            for given in ({}, {name: False for name in FLAGS}):
                sink = await ask(scheduler, stream=stream, flags=given)
                for response in sink.responses:
                    assert not set(extras) & set(response), (stream, given, response)
        asked = {f"return_{name}": True for name in extras}
        sink = await ask(scheduler, stream=True, flags=asked)
        for response in sink.responses:
            assert set(extras) <= set(response)
            assert int(response["num_input_tokens"][0]) == len(b"Count me")
        assert reasons(sink)[-1] == [b"length"] and reasons(sink)[0] == [b"None"]
        assert sum(int(r["num_output_tokens"][0]) for r in sink.responses) == TOKENS
        only = await ask(scheduler, stream=False, flags={"return_num_output_tokens": True})
        assert [sorted(r) for r in only.responses] == [
            ["num_output_tokens", "output_ids", "text_output"]
        ]
    finally:
        await scheduler.close(1)


async def test_a_stream_given_exclude_input_in_output_false_is_refused(tmp_path: Path) -> None:
    scheduler = engine(tmp_path)
    try:
        with pytest.raises(ServerError) as refused:
            await ask(scheduler, stream=True, flags={"exclude_input_in_output": False})
        assert refused.value.code is ErrorCode.INVALID_ARG
        assert refused.value.message == (
            "Error generating stream: When streaming, `exclude_input_in_output` = False is "
            "not allowed."
        )
        # Left out, or false without streaming: answered, the latter with the prompt.
        assert (await ask(scheduler, stream=True)).responses
        whole = await ask(scheduler, stream=False, flags={"exclude_input_in_output": False})
        assert whole.responses[0]["text_output"][0].startswith(b"Count me")
    finally:
        await scheduler.close(1)


def test_an_unknown_parameter_fails_the_load_but_those_read_elsewhere_load(
    tmp_path: Path,
) -> None:
    taken = {
        "REPORT_CUSTOM_METRICS": "false",
        "ENABLE_VLLM_HEALTH_CHECK": "false",
        "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
    }
    folder = llmrepo.write_tiny_llm(tmp_path / "taken", "m", taken)
    spec = ModelSpec("m", 1, config_of(folder), folder, folder / "1" / "model.onnx")
    LlmBackend().load(spec).extra[MODEL_KEY].close()
    typos = {**taken, "max_num_seq": "4", "kv_cache_block": "9"}
    folder = llmrepo.write_tiny_llm(tmp_path / "typos", "m", typos)
    spec = ModelSpec("m", 1, config_of(folder), folder, folder / "1" / "model.onnx")
    with pytest.raises(ValueError) as refused:
        LlmBackend().load(spec)
    assert "unknown parameter(s) ['kv_cache_block', 'max_num_seq']" in str(refused.value)
    assert "'max_num_seqs'" in str(refused.value)


@pytest.mark.parametrize("switch", ["REPORT_CUSTOM_METRICS", "ENABLE_VLLM_HEALTH_CHECK"])
def test_a_vllm_backend_switch_that_is_not_a_boolean_fails_the_load(
    tmp_path: Path, switch: str
) -> None:
    folder = llmrepo.write_tiny_llm(tmp_path, "m", {switch: "flase"})
    spec = ModelSpec("m", 1, config_of(folder), folder, folder / "1" / "model.onnx")
    with pytest.raises(ValueError) as refused:
        LlmBackend().load(spec)
    assert str(refused.value) == f"parameter {switch}: 'flase' is not true or false"


@pytest.mark.parametrize(
    "unused",
    [
        # Read for other models only: the engine has no batcher, and its own template.
        {"adaptive_batching": "maybe"},
        {"adaptive_latency_budget_us.1": "-5"},
        {"bucket_sizes": "not,numbers"},
        {"chat_template_source": "{{ messages }}"},
    ],
)
def test_parameters_only_other_models_read_fail_the_load(
    tmp_path: Path, unused: dict[str, str]
) -> None:
    folder = llmrepo.write_tiny_llm(tmp_path, "m", unused)
    spec = ModelSpec("m", 1, config_of(folder), folder, folder / "1" / "model.onnx")
    with pytest.raises(ValueError) as refused:
        LlmBackend().load(spec)
    assert f"unknown parameter(s) {sorted(unused)}" in str(refused.value)
