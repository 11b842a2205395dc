"""Stand-in models for the OpenAI-compatible API, written as Triton Python models.

`textgen` follows the generative model contract (the one the `llm` backend implements):
decoupled, `text_input` -> `text_output`, `finish_reason`, `num_input_tokens`,
`num_output_tokens`, with the optional inputs `stream`, `sampling_parameters`,
`exclude_input_in_output` and `max_tokens`. Its "tokens" are the prompt's
whitespace-separated words, and its answer repeats them in order (so a chat's answer
shows the prompt the template rendered), one delta per word when streaming:
- it stops at `max_tokens` (finish reason `length`; from `sampling_parameters`, else the
  `max_tokens` input, else 32) or at a word equal to a stop string (`stop`);
- a prompt over its context (MAX_MODEL_LEN words) is refused with INVALID_ARG, as an
  engine refuses it;
- SHOW_PARAMS in the prompt: the answer is one token, the JSON of what it was sent;
- FAIL_MIDSTREAM: one token, then an error response;
- SLOW: 50 ms between tokens, stopping (and logging "textgen: cancelled") once the client
  has gone away; SLOW_START: 2 s before the first streamed token, the same way. A
  non-streamed SLOW answer and SLOW_START log "textgen: started" first.
Its config gives a ChatML chat template (config parameter `chat_template_source`), which
refuses a `tool` message with `raise_exception`. `textgen_plain` is the same model
without a template; `write_templated` writes one with another template.

`embedder` is an embedding model: TEXT BYTES [1] -> VECTOR FP32 [4] (letters, digits,
spaces and the rest counted, L2-normalised) and `num_input_tokens` (its words). A batch
holding the text NO_VECTOR is answered without VECTOR.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from pymodels import write_model

MAX_MODEL_LEN = 64

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ raise_exception('tool messages are not supported') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TEXTGEN = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_MODEL_LEN = {max_model_len}


def scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            self.answer(request, request.get_response_sender())
        return None

    def answer(self, request, sender):
        prompt = scalar(request, "text_input", b"").decode("utf-8")
        stream = bool(scalar(request, "stream", False))
        raw = scalar(request, "sampling_parameters", b"")
        sampling = json.loads(raw) if raw else {{}}
        limit_input = scalar(request, "max_tokens", None)
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        words = prompt.split()
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if ids is not None:
            # A token-id prompt: its "tokens" are its ids, shown after their dtype.
            found = ids.as_numpy()
            words = [f"{{found.dtype}}{{list(found.shape)}}", *(str(i) for i in found.reshape(-1))]
            if prompt:
                error = pb_utils.TritonError("both text_input and input_ids were sent")
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            prompt = " ".join(words)
        prompt_tokens = len(words) if ids is None else len(words) - 1
        if len(words) > MAX_MODEL_LEN:
            message = (
                f"This model's maximum context length is {{MAX_MODEL_LEN}} tokens; "
                f"the prompt has {{len(words)}}"
            )
            error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)
            return
        limit = int(sampling.get("max_tokens") or (limit_input or 32))
        if "SHOW_PARAMS" in prompt:
            shown = {{
                "sampling": sampling,
                "stream": stream,
                "exclude_input_in_output": bool(scalar(request, "exclude_input_in_output", False)),
                "max_tokens": None if limit_input is None else int(limit_input),
            }}
            words = [json.dumps(shown, sort_keys=True)]
        stops = set(sampling.get("stop", []))
        tokens, reason = [], "stop"
        for word in words:
            if word in stops:
                break
            if len(tokens) == limit:
                reason = "length"
                break
            tokens.append((" " if tokens else "") + word)
        slow = "SLOW" in prompt
        if not stream:
            if slow and not self.wait_out(sender, len(tokens)):
                return
            whole = self.response("".join(tokens), reason, prompt_tokens, len(tokens))
            sender.send(whole, flags=final)
            return
        if "SLOW_START" in prompt and not self.wait_out(sender, 40):
            return
        for index, token in enumerate(tokens):
            if slow:
                time.sleep(0.05)
                if sender.is_cancelled():
                    pb_utils.Logger.log_info("textgen: cancelled")
                    sender.send(flags=final)
                    return
            if index == 1 and "FAIL_MIDSTREAM" in prompt:
                error = pb_utils.TritonError("the model failed mid-stream")
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            last = index == len(tokens) - 1
            response = self.response(token, reason if last else "None", prompt_tokens, 1)
            sender.send(response, flags=final if last else 0)
        if not tokens:
            sender.send(self.response("", reason, prompt_tokens, 0), flags=final)

    def wait_out(self, sender, steps):
        # 50 ms a token, as a model that generates them; False once the client left.
        pb_utils.Logger.log_info("textgen: started")
        for _ in range(steps):
            time.sleep(0.05)
            if sender.is_cancelled():
                pb_utils.Logger.log_info("textgen: cancelled")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return False
        return True

    def response(self, text, reason, prompt_tokens, completion_tokens):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([prompt_tokens], np.int32)),
                pb_utils.Tensor("num_output_tokens", np.array([completion_tokens], np.int32)),
            ]
        )
"""

_TEXTGEN_CONFIG = """
name: "{name}"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
{parameters}
"""

EMBEDDER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            vectors, counts = [], []
            for raw in texts:
                text = raw.decode("utf-8")
                counts_of = [
                    sum(c.isalpha() for c in text),
                    sum(c.isdigit() for c in text),
                    sum(c.isspace() for c in text),
                    sum(not (c.isalnum() or c.isspace()) for c in text),
                ]
                vector = np.array(counts_of, np.float32) + 1.0
                vectors.append(vector / np.linalg.norm(vector))
                counts.append([len(text.split())])
            shape = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().shape
            lead = shape[:-1]
            out = np.array(vectors, np.float32).reshape(*lead, 4)
            tokens = np.array(counts, np.int32).reshape(*lead, 1)
            outputs = [pb_utils.Tensor("num_input_tokens", tokens)]
            if b"NO_VECTOR" not in list(texts):
                outputs.insert(0, pb_utils.Tensor("VECTOR", out))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

_EMBEDDER_CONFIG = """
name: "embedder"
backend: "python"
max_batch_size: 8
dynamic_batching {}
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "VECTOR" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""


def embedder_vector(text: str) -> list[float]:
    """What `embedder` answers for `text`, computed here."""
    import numpy as np

    counts = [
        sum(c.isalpha() for c in text),
        sum(c.isdigit() for c in text),
        sum(c.isspace() for c in text),
        sum(not (c.isalnum() or c.isspace()) for c in text),
    ]
    vector = np.array(counts, np.float32) + 1.0
    result: list[float] = (vector / np.linalg.norm(vector)).astype(np.float32).tolist()
    return result


def _parameter(key: str, value: str) -> str:
    # JSON's string escapes are protobuf text format's for these characters.
    return f"parameters {{ key: {json.dumps(key)} value {{ string_value: {json.dumps(value)} }} }}"


def render_chat(messages: Sequence[Mapping[str, object]]) -> str:
    """The prompt `CHAT_TEMPLATE` makes of `messages`, written out by hand."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def write_templated(repo: Path, name: str, chat_template: str) -> Path:
    """A copy of `textgen` named `name`, with `chat_template` as its chat template."""
    parameters = "\n".join(
        [
            _parameter("chat_template_source", chat_template),
            _parameter("max_model_len", str(MAX_MODEL_LEN)),
        ]
    )
    config = _TEXTGEN_CONFIG.format(name=name, parameters=parameters)
    return write_model(repo, name, TEXTGEN.format(max_model_len=MAX_MODEL_LEN), config)


def write_ids(repo: Path, name: str = "textgen_ids") -> Path:
    """A copy of `textgen_plain` that also takes token-id prompts: `input_ids` (INT32,
    dims [-1]) with `text_input` optional. Its answer to ids is their dtype and shape, then
    the ids, one word each (its prompt tokens: the ids)."""
    config = _TEXTGEN_CONFIG.format(name=name, parameters="").replace(
        '{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },',
        '{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true },\n'
        '  { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] optional: true },',
    )
    assert "input_ids" in config
    return write_model(repo, name, TEXTGEN.format(max_model_len=MAX_MODEL_LEN), config)


def write(repo: Path) -> Path:
    """`textgen` (with a chat template), `textgen_plain` (without) and `embedder`."""
    source = TEXTGEN.format(max_model_len=MAX_MODEL_LEN)
    template = "\n".join(
        [
            _parameter("chat_template_source", CHAT_TEMPLATE),
            _parameter("max_model_len", str(MAX_MODEL_LEN)),
            _parameter("eos_token", "<|im_end|>"),
        ]
    )
    config = _TEXTGEN_CONFIG.format(name="textgen", parameters=template)
    write_model(repo, "textgen", source, config)
    write_model(
        repo, "textgen_plain", source, _TEXTGEN_CONFIG.format(name="textgen_plain", parameters="")
    )
    write_model(repo, "embedder", EMBEDDER, _EMBEDDER_CONFIG)
    return repo
