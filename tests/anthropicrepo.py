"""The models of the Messages API's component tests (test_anthropic_*.py): `echo`, a
Python model that answers its user's last message as written (the whole prompt where
that is "?prompt"), three characters a piece, so that tags come split across pieces;
its ChatML template; and a tool to call."""

from __future__ import annotations

import json
from pathlib import Path

import llmrepo
from pymodels import write_model

ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input")
            prompt = prompt.as_numpy().reshape(-1)[0].decode("utf-8")
            stream = pb_utils.get_input_tensor_by_name(request, "stream")
            stream = stream is not None and bool(stream.as_numpy().reshape(-1)[0])
            said = prompt.rsplit("<|im_start|>user\\n", 1)[-1].split("<|im_end|>", 1)[0]
            if said == "?prompt":
                said = prompt
            pieces = [said[at : at + 3] for at in range(0, len(said), 3)] or [""]
            sender = request.get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if not stream:
                pieces = ["".join(pieces)]
            for index, piece in enumerate(pieces):
                last = index == len(pieces) - 1
                sender.send(self.response(piece, "stop" if last else "None"),
                            flags=final if last else 0)
        return None

    def response(self, text, reason):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([7], np.int32)),
                pb_utils.Tensor("num_output_tokens", np.array([1], np.int32)),
            ]
        )
"""

# ChatML; an assistant's calls as `[call name {arguments}]`, its thoughts as `[thought
# ...]`, a tool message's call id in brackets (tags the parsers would read, not echoed).
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['tool_call_id'] %}[{{ m['tool_call_id'] }}] {% endif %}"
    "{% if m['reasoning'] %}[thought {{ m['reasoning'] }}]{% endif %}"
    "{% for c in m['tool_calls'] or [] %}[call {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}]{% endfor %}"
    "{{ m['content'] or '' }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}"
)

CONFIG = f"""
name: "echo"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
parameters {{ key: "chat_template_source" value {{ string_value: {json.dumps(TEMPLATE)} }} }}
"""

WEATHER = {
    "name": "weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


def write_models(folder: Path) -> None:
    """`echo` and the llm backend's tiny model (tests/llmrepo.py) in `folder`."""
    write_model(folder, "echo", ECHO, CONFIG)
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
