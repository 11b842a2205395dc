"""How /v1 hands a request's sampling parameters to a generative model, in process (as
test_openai_inprocess.py): every parameter the client sets reaches the model or is a 400
naming it, whichever of the three interfaces the model has.

- `textgen` (tests/textgen.py) takes vLLM's keys as `sampling_parameters` JSON, as the
  `llm` engine does: its SHOW_PARAMS answer is the JSON it got.
- `bare` is Triton's test model mock_llm: `text_input` and `stream` only, the prompt
  echoed. It takes no sampling parameter, not even `max_tokens`.
- `separate` has the inputs of Triton's tool_parser_models/tool_stream_py (TensorRT-LLM's
  interface: one input per parameter), and `bad_words` and `repetition_penalty` as well:
  its answer is what its inputs held, and it counts tokens only when asked to."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client
from pymodels import write_model

from ge_serve.backends.llm import sampling

pytestmark = pytest.mark.timeout(120)
# The tests on the module's app (`http`) run in its loop.
ON_APP = pytest.mark.asyncio(loop_scope="module")

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]

# Triton's python/openai/tests/test_models/mock_llm, decoupled part, without its options.
BARE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            stream = pb_utils.get_input_tensor_by_name(request, "stream").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)])
            if stream.flatten()[0]:
                sender.send(response)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

BARE_CONFIG = """
name: "bare"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1, 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1, 1 ] },
  { name: "return_logprobs" data_type: TYPE_BOOL dims: [ 1, 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1, -1 ] } ]
"""

SEPARATE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def plain(value):
    return value.decode() if isinstance(value, bytes) else value.item()


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            got = {}
            for tensor in request.inputs():
                if tensor.name() != "text_input":
                    array = tensor.as_numpy()
                    values = [plain(v) for v in array.reshape(-1)]
                    got[tensor.name()] = [str(array.dtype), list(array.shape), values]
            shown = json.dumps(got, sort_keys=True)
            outputs = [pb_utils.Tensor("text_output", np.array([[shown]], object))]
            for name in ("num_input_tokens", "num_output_tokens"):
                if "return_" + name in got:
                    outputs.append(pb_utils.Tensor(name, np.array([[7]], np.int32)))
            request.get_response_sender().send(
                pb_utils.InferenceResponse(outputs),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""

SEPARATE_CONFIG = """
name: "separate"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1, 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1, 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] optional: true },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1, 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1, 1 ] optional: true },
  { name: "stop_words" data_type: TYPE_STRING dims: [ 1, -1 ] optional: true },
  { name: "bad_words" data_type: TYPE_STRING dims: [ 1, -1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1, 1 ] optional: true },
  { name: "top_p" data_type: TYPE_FP32 dims: [ 1, 1 ] optional: true },
  { name: "frequency_penalty" data_type: TYPE_FP32 dims: [ 1, 1 ] optional: true },
  { name: "presence_penalty" data_type: TYPE_FP32 dims: [ 1, 1 ] optional: true },
  { name: "repetition_penalty" data_type: TYPE_FP32 dims: [ 1, 1 ] optional: true },
  { name: "seed" data_type: TYPE_UINT64 dims: [ 1, 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1, -1 ] },
  { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] },
  { name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] }
]
parameters {
  key: "chat_template_source"
  value { string_value: "{% for m in messages %}{{ m['content'] }}{% endfor %}" }
}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = textgen.write(tmp_path_factory.mktemp("openai-sampling"))
    write_model(repo, "bare", BARE, BARE_CONFIG)
    write_model(repo, "separate", SEPARATE, SEPARATE_CONFIG)
    return repo


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    """One app and its Python workers for the module: its tests only send requests (none
    loads or unloads a model, nor reads statistics), and the models keep no state between
    requests."""
    async with openai_client(repo, ["textgen", "bare", "separate"]) as client:
        yield client


def answer(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


# --- a model that takes no sampling parameter -----------------------------------------------


@ON_APP
async def test_a_model_without_sampling_inputs_serves_completions(http: httpx.AsyncClient) -> None:
    # /v1/completions' 16 tokens are a default the client did not set: the model has no
    # place for it, and answers.
    body = {"model": "bare", "prompt": "hello world"}
    done = answer(await http.post(COMPLETIONS, json=body))
    assert done["choices"][0]["text"] == "hello world"
    assert done["choices"][0]["finish_reason"] == "stop"
    streamed = await http.post(COMPLETIONS, json=body | {"stream": True})
    assert streamed.status_code == 200, streamed.text
    chunks = [json.loads(b[6:]) for b in streamed.text.split("\n\n") if b.startswith("data: {")]
    assert [c["choices"][0]["text"] for c in chunks] == ["hello world", ""]
    # A value that changes nothing needs no place either.
    zero = answer(await http.post(COMPLETIONS, json=body | {"presence_penalty": 0}))
    assert zero["choices"][0]["text"] == "hello world"


@ON_APP
@pytest.mark.parametrize(("param", "value"), [("max_tokens", 5), ("temperature", 0.5)])
async def test_a_parameter_the_client_sets_is_refused_where_the_model_takes_none(
    http: httpx.AsyncClient, param: str, value: object
) -> None:
    body = {"model": "bare", "prompt": "hello", param: value}
    refused = error(await http.post(COMPLETIONS, json=body))
    assert (refused["param"], refused["code"]) == (param, "unsupported_parameter")
    assert refused["type"] == "invalid_request_error"
    assert f"'{param}'" in refused["message"] and "'bare'" in refused["message"]


# --- vLLM's sampling extensions, for a model that takes `sampling_parameters` ----------------

HONOURED = {
    "min_tokens": 3,
    "stop_token_ids": [7, 9],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "ignore_eos": True,
    # vLLM's logits processors; `logit_bias` is OpenAI's map, passed as given.
    "repetition_penalty": 1.2,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "min_p": 0.1,
    "logit_bias": {"42": -100.0, "7": 2.5},
    "allowed_token_ids": [7, 42],
    "bad_words": ["no"],
}
# What the `llm` engine does not implement, at the values that change nothing.
NEUTRAL = {
    "length_penalty": 1,
    "use_beam_search": False,
    "spaces_between_special_tokens": True,
}


@ON_APP
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, {"prompt": "SHOW_PARAMS", "max_tokens": 5}),
        (CHAT, {"messages": [{"role": "user", "content": "SHOW_PARAMS"}], "max_tokens": 5}),
    ],
    ids=["completions", "chat"],
)
async def test_the_engines_vllm_extensions_reach_the_model(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    request = {"model": "textgen"} | body | HONOURED | NEUTRAL
    done = answer(await http.post(path, json=request))
    text = done["choices"][0]["text" if path == COMPLETIONS else "message"]
    shown = json.loads(text if path == COMPLETIONS else text["content"])
    assert shown["sampling"] == HONOURED | {"max_tokens": 5}


def test_the_keys_passed_on_are_those_the_llm_engine_implements() -> None:
    from ge_serve.server.http.openai.fields import SAMPLING_KEYS
    from ge_serve.server.http.openai.generation import KEYS

    implemented = sampling.KNOWN_KEYS - set(sampling._NEUTRAL)
    assert {key for key, rule in KEYS.items() if rule.engine} == implemented
    for key, rule in KEYS.items():
        if key in sampling._NEUTRAL:
            assert sampling._NEUTRAL[key] in rule.neutral, key
    # `logprobs`: from chat's `top_logprobs` or completions' `logprobs` (logprob_count).
    # `structured_outputs`: from response_format, structured_outputs, guided_* (structured.py).
    # `prompt_logprobs`: given, or completions' `echo` with `logprobs` (schemas.py).
    # `logprob_token_ids`: given (non-empty), in place of `logprobs` (schemas.py).
    # `structured_outputs_after`: the server's, with --reasoning-parser (reasoning.py).
    # `thinking_token_budget`: given (not -1), with the parser's markers (thinking.py).
    # `kept_special_tokens`: the server's, for the mistral parsers' tags (tools.py).
    expected = {
        "max_tokens",
        "logprobs",
        "logprob_token_ids",
        "prompt_logprobs",
        "structured_outputs",
        "structured_outputs_after",
        "thinking_token_budget",
        "reasoning_start_str",
        "reasoning_end_str",
        "kept_special_tokens",
    }
    assert set(KEYS) == {*expected, *SAMPLING_KEYS}


REFUSED: list[tuple[str, object, str | None]] = [
    # Not implemented by the engine: unsupported, not silently dropped.
    ("length_penalty", 0.5, "unsupported_parameter"),
    ("use_beam_search", True, "unsupported_parameter"),
    ("spaces_between_special_tokens", False, "unsupported_parameter"),
    ("truncate_prompt_tokens", 4, "unsupported_parameter"),
    # Out of vLLM's ranges.
    ("min_tokens", -1, None),
    ("min_tokens", 1.5, None),
    ("stop_token_ids", [-1], None),
    ("stop_token_ids", 5, None),
    ("include_stop_str_in_output", "yes", None),
    ("repetition_penalty", 0, None),
    ("min_p", 1.5, None),
    ("presence_penalty", 2.5, None),
    ("frequency_penalty", -3, None),
    ("allowed_token_ids", [-1], None),
    ("bad_words", [5], None),
    ("logit_bias", {"5": "x"}, None),
    ("truncate_prompt_tokens", 0, None),
]


@ON_APP
async def test_an_extension_the_engine_does_not_honour_is_refused(
    http: httpx.AsyncClient,
) -> None:
    for param, value, code in REFUSED:
        # A bad list element is named by its index, as the schema names every field.
        named = f"{param}[0]" if isinstance(value, list) and code is None else param
        for path, prompt in ((COMPLETIONS, {"prompt": "hi"}), (CHAT, {"messages": HELLO})):
            body = {"model": "textgen", param: value} | prompt
            refused = error(await http.post(path, json=body))
            assert (refused["param"], refused["code"]) == (named, code), (path, param, value)
            assert refused["type"] == "invalid_request_error"
            assert param in refused["message"]


# --- TensorRT-LLM's interface: one input per parameter -----------------------------------


def one(datatype: str, value: object) -> list[object]:
    return [datatype, [1, 1], [value]]


COUNTS_ASKED = {
    "return_num_input_tokens": one("bool", True),
    "return_num_output_tokens": one("bool", True),
}


@ON_APP
async def test_each_parameter_goes_to_the_input_of_its_name(http: httpx.AsyncClient) -> None:
    body = {
        "model": "separate",
        "prompt": "x",
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.25,
        "seed": 7,
        "stop": ["a", "bb"],
        "frequency_penalty": 0.5,
        "presence_penalty": -1.0,
        "repetition_penalty": 1.25,
        "bad_words": ["z"],
    }
    done = answer(await http.post(COMPLETIONS, json=body))
    assert json.loads(done["choices"][0]["text"]) == COUNTS_ASKED | {
        "stream": one("bool", False),
        "max_tokens": one("int32", 9),
        "temperature": one("float32", 0.5),
        "top_p": one("float32", 0.25),
        "seed": one("uint64", 7),
        "stop_words": ["object", [1, 2], ["a", "bb"]],
        "frequency_penalty": one("float32", 0.5),
        "presence_penalty": one("float32", -1.0),
        "repetition_penalty": one("float32", 1.25),
        "bad_words": ["object", [1, 1], ["z"]],
    }
    # Asked for, the model reports its counts.
    assert done["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 7,
        "total_tokens": 14,
        "completion_tokens_details": None,
    }

    # /v1/completions' default limit goes to `max_tokens` too; chat's is the model's own.
    done = answer(await http.post(COMPLETIONS, json={"model": "separate", "prompt": "x"}))
    assert json.loads(done["choices"][0]["text"]) == COUNTS_ASKED | {
        "stream": one("bool", False),
        "max_tokens": one("int32", 16),
    }
    chat = {"model": "separate", "messages": HELLO, "stop": "q", "max_completion_tokens": 3}
    done = answer(await http.post(CHAT, json=chat))
    assert json.loads(done["choices"][0]["message"]["content"]) == COUNTS_ASKED | {
        "stream": one("bool", False),
        "max_tokens": one("int32", 3),
        "stop_words": one("object", "q"),
    }
    streamed = await http.post(
        COMPLETIONS, json={"model": "separate", "prompt": "x", "stream": True}
    )
    assert streamed.status_code == 200, streamed.text
    chunks = [json.loads(b[6:]) for b in streamed.text.split("\n\n") if b.startswith("data: {")]
    shown = json.loads("".join(c["choices"][0]["text"] for c in chunks))
    assert shown["stream"] == one("bool", True)


@ON_APP
@pytest.mark.parametrize(
    ("param", "value", "code"),
    [
        # No input of that name, and no `sampling_parameters`.
        ("top_k", 5, "unsupported_parameter"),
        ("min_tokens", 2, "unsupported_parameter"),
        ("stop_token_ids", [1], "unsupported_parameter"),
        # Past the range of the input's datatype (UINT64, INT32).
        ("seed", -1, None),
        ("max_tokens", 2**31, None),
    ],
)
async def test_a_parameter_with_no_input_or_past_its_datatype_is_400(
    http: httpx.AsyncClient, param: str, value: object, code: str | None
) -> None:
    body = {"model": "separate", "prompt": "x", param: value}
    refused = error(await http.post(COMPLETIONS, json=body))
    assert (refused["param"], refused["code"]) == (param, code)
    assert "'separate'" in refused["message"]


# --- structured outputs: one `structured_outputs` key, vLLM's StructuredOutputsParams --------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
STRUCTURED: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": AS_SCHEMA}, {"json": SCHEMA}),
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
     {"regex": "a+", "disable_any_whitespace": True}),
    # vLLM's: the format overrides its own field of structured_outputs, keeps the others.
    ({"structured_outputs": {"json": {}, "whitespace_pattern": " "},
      "response_format": {"type": "json_object"}},
     {"json": {}, "whitespace_pattern": " ", "json_object": True}),
    # The legacy fields, mapped as vLLM mapped them before it dropped them.
    ({"guided_json": SCHEMA}, {"json": SCHEMA}),
    ({"guided_regex": "[0-9]+"}, {"regex": "[0-9]+"}),
    ({"guided_choice": ["a", "b"]}, {"choice": ["a", "b"]}),
    ({"guided_grammar": "start: x"}, {"grammar": "start: x"}),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": ""},
     {"json": SCHEMA, "whitespace_pattern": ""}),
    # vLLM's legacy structural tag, checked and sent as JSON text (the schema defaulted).
    ({"response_format": {"type": "structural_tag", "triggers": ["<f="],
                          "structures": [{"begin": "<f=x>", "end": "</f>"}]}},
     {"structural_tag": json.dumps({"triggers": ["<f="], "structures": [
         {"begin": "<f=x>", "schema": {}, "end": "</f>"}]})}),
    # xgrammar's form: the format, checked and sent as vLLM sends it.
    ({"response_format": {"type": "structural_tag", "format": {"type": "any_text"}}},
     {"structural_tag": json.dumps({"type": "structural_tag", "format": {"type": "any_text"}})}),
]  # fmt: skip


@ON_APP
@pytest.mark.parametrize(("fields", "sent"), STRUCTURED, ids=[str(f) for f, _ in STRUCTURED])
async def test_structured_outputs_reach_the_model_as_one_key(
    http: httpx.AsyncClient, fields: dict[str, Any], sent: dict[str, Any]
) -> None:
    for path, prompt in (
        (COMPLETIONS, {"prompt": "SHOW_PARAMS"}),
        (CHAT, {"messages": [{"role": "user", "content": "SHOW_PARAMS"}]}),
    ):
        done = answer(await http.post(path, json={"model": "textgen"} | prompt | fields))
        text = done["choices"][0]["text" if path == COMPLETIONS else "message"]
        shown = json.loads(text if path == COMPLETIONS else text["content"])["sampling"]
        # A JSON text, as Triton's OpenAI frontend sends it to its vLLM backend.
        assert json.loads(shown["structured_outputs"]) == sent, path


BAD_STRUCTURED: list[tuple[dict[str, Any], str, str]] = [
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs",
     "You can only use one kind of constraints for structured outputs"),
    ({"structured_outputs": "a+"}, "structured_outputs", "must be an object"),
    ({"guided_json": {}, "guided_regex": "a"}, "guided_json",
     "You can only use one kind of guided decoding"),
    ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "structured_outputs",
     "not both"),
    ({"response_format": {"type": "json_schema"}}, "response_format",
     "When response_format type is 'json_schema', the 'json_schema' field must be provided."),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format", "'name'"),
    ({"response_format": {"type": "yaml"}}, "response_format", "'yaml'"),
    ({"response_format": {"type": "structural_tag"}}, "response_format",
     "Invalid response_format structural_tag specification: structural_tag.triggers"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "any_text"}, {"type": "regex", "pattern": "[.]"}]}}},
     "response_format", "format.elements[0]: free text (any_text) must end its tag or the output"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "yaml"}}},
     "response_format", "format: unknown format type 'yaml'"),
]  # fmt: skip


@ON_APP
@pytest.mark.parametrize(("fields", "param", "words"), BAD_STRUCTURED)
async def test_conflicting_structured_fields_are_a_400(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str, words: str
) -> None:
    body = {"model": "textgen", "messages": HELLO} | fields
    refused = error(await http.post(CHAT, json=body))
    assert refused["param"] == param and words in refused["message"], refused


@ON_APP
async def test_structured_outputs_are_refused_where_the_model_takes_none(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "bare", "prompt": "x", "response_format": {"type": "json_object"}}
    refused = error(await http.post(COMPLETIONS, json=body))
    assert (refused["param"], refused["code"]) == ("structured_outputs", "unsupported_parameter")
