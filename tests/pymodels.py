"""Triton Python-backend models for tests, written into a repository folder.

Each does what one of python_backend's examples does (add_sub, auto_complete, decoupled
repeat and square, bls, bls_decoupled, custom_metrics), written here from the documented
behaviour, plus models that fail on purpose. `write(repo, *names)` puts them in place.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import httpx

_TENSORS_ADD_SUB = """
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

ADD_SUB = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )
        self.batching = config["max_batch_size"] > 0

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ]
            if self.batching:
                # How many requests this execute() got: the batch the server formed.
                rows = a.shape[0]
                outputs.append(
                    pb_utils.Tensor("REQUESTS", np.full((rows, 1), len(requests), np.int32))
                )
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def finalize(self):
        print("add_sub finalized")
"""

# Echoes what the model is told: the initialize args and each request's own facts.
INTROSPECT = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            facts = {
                "args": self.args,
                "pid": os.getpid(),
                "request_id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "requested": request.requested_output_names(),
                "cancelled": request.is_cancelled(),
                "writable": pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                .flags.writeable,
            }
            text = np.array([json.dumps(facts).encode()], dtype=object)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("FACTS", text)])
            )
        return responses
"""

# IN 1: execute raises (the whole batch fails); IN 2: that response carries an error;
# IN 3: the worker dies mid-execute; IN 4: execute returns the wrong number of
# responses. Anything else is echoed back.
FAILING = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value == 1:
                raise pb_utils.TritonModelException("the model refused this batch")
            if value == 2:
                error = pb_utils.TritonError("no such thing", pb_utils.TritonError.NOT_FOUND)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if value == 3:
                os._exit(7)
            if value == 4:
                return []
            given = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", given)]))
        return responses
"""

# Sleeps IN seconds, then answers with its process id. A request parameter "started"
# names a file it creates as it starts, so a test knows it is executing.
SLEEPER = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            started = json.loads(request.parameters()).get("started")
            if started:
                open(started, "w").close()
            time.sleep(float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]))
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))
            responses.append(pb_utils.InferenceResponse([pid]))
        return responses
"""

# Never returns from execute (for IN 1): a model that hangs. A "started" parameter names
# a file it creates first.
HANGER = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        started = json.loads(requests[0].parameters()).get("started")
        if started:
            open(started, "w").close()
        value = int(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
        while value == 1:
            time.sleep(0.01)
        out = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)])]
"""

# Decoupled: for each element of IN a response (OUT = that element, IDX = its index),
# DELAY[i] ms apart, from a thread of its own; execute returns after WAIT ms.
REPEAT = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("repeat must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().copy()
            thread = threading.Thread(
                target=self.answer, args=(request.get_response_sender(), values, delays)
            )
            thread.start()
            self.threads.append(thread)
        wait = pb_utils.get_input_tensor_by_name(requests[0], "WAIT").as_numpy()[0]
        time.sleep(wait / 1000)
        return None

    def answer(self, sender, values, delays):
        for index, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(delay / 1000)
            sender.send(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], np.int32)),
                        pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

# Decoupled: IN responses, each OUT = IN, then the final flag on its own (none for 0).
SQUARE = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.answer, args=(sender, value), daemon=True).start()
        return None

    def answer(self, sender, value):
        for _ in range(value):
            out = pb_utils.Tensor("OUT", np.array([value], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Decoupled, one response that carries the final flag itself.
ONCE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", given * 2)])
            sender = request.get_response_sender()
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Default mode, but answering through the response sender (execute returns None), from
# a thread that may outlive execute; a second response is refused.
SENDER = """
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.answer, args=(request,)).start()
        return None

    def answer(self, request):
        given = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", given + 1)]))
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", given)]))
        except pb_utils.TritonModelException as exc:
            pb_utils.Logger.log_info("refused: " + str(exc))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Asks the server which models are ready, and tries to load one (OUT: ready add_sub,
# ready no_such_model, the load refused).
READY_PROBE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        try:
            pb_utils.load_model(model_name="no_such_model")
            refused = False
        except pb_utils.TritonModelException:
            refused = True
        found = [
            pb_utils.is_model_ready(model_name="add_sub"),
            pb_utils.is_model_ready("no_such_model", "1"),
            refused,
        ]
        out = pb_utils.Tensor("OUT", np.array(found, np.int32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

# OUT is IN, whatever its size; TEXT is IN's BYTES twin (each element as text).
ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            text = np.array([str(v).encode() for v in given[:1000]], dtype=object)
            outputs = [pb_utils.Tensor("OUT", given.copy()), pb_utils.Tensor("TEXT", text)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

# BLS: passes INPUT0/INPUT1 to the model MODEL_NAME names and answers with its outputs.
BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            call = pb_utils.InferenceRequest(
                model_name=name,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
"""

# Async BLS: OUTPUT0 from one add_sub, OUTPUT1 from the other, both calls in flight.
BLS_ASYNC = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs
                ).async_exec()
                for name in ("add_sub", "add_sub_copy")
            ]
            first, second = await asyncio.gather(*calls)
            for answer in (first, second):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            outputs = [
                pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(second, "OUTPUT1"),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

# BLS on a decoupled model: SUM of every OUT the square model sends for IN (TIMES calls).
BLS_DECOUPLED = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

TIMES = {times}


def total(responses, into):
    for response in responses:
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        if response.output_tensors():
            into += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()


class TritonPythonModel:
    {kind}def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "IN")
            calls = [
                pb_utils.InferenceRequest(
                    model_name="square", inputs=[given], requested_output_names=["OUT"]
                )
                for _ in range(TIMES)
            ]
            found = np.zeros(1, np.int32)
            {gather}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", found)]))
        return responses
"""

# Custom metrics: a counter of requests, a gauge of the last input sum, a histogram.
METRICS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        counter = pb_utils.MetricFamily(
            name="pbtest_requests_total_count",
            description="Requests this model answered",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        gauge = pb_utils.MetricFamily(
            name="pbtest_last_sum", description="The last sum", kind=pb_utils.MetricFamily.GAUGE
        )
        histogram = pb_utils.MetricFamily(
            name="pbtest_sum", description="Sums seen", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.counter = counter.Metric(labels=labels)
        self.gauge = gauge.Metric(labels=labels)
        self.histogram = histogram.Metric(labels=labels, buckets=[1.0, 10.0])
        # As in Triton, a MetricFamily must outlive its Metrics.
        self.families = (counter, gauge, histogram)
        pb_utils.Logger.log_info("metrics ready in " + args["model_instance_name"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            self.counter.increment(1)
            self.gauge.set(float((a + b).sum()))
            self.histogram.observe(float((a + b).sum()))
            count = self.counter.value()
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)],
                    parameters={{"count": int(count)}},
                )
            )
        return responses
"""

# No config.pbtxt at all: auto_complete_config says everything.
AUTO_COMPLETE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config
        known = [i["name"] for i in config.as_dict()["input"]]
        for name in ("INPUT0", "INPUT1"):
            if name not in known:
                config.add_input({{"name": name, "data_type": "TYPE_FP32", "dims": [4]}})
        for name in ("OUTPUT0", "OUTPUT1"):
            config.add_output({{"name": name, "data_type": "TYPE_FP32", "dims": [4]}})
        config.set_max_batch_size({max_batch_size})
        {more}
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
                )
            )
        return responses
"""

# Imports a module only its execution environment has.
ENV_MODEL = """
import numpy as np
import pbtest_env_only
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        word = np.array([pbtest_env_only.WORD.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", word)]) for _ in requests]
"""


# Decoupled, as the mock LLM of Triton's generate-endpoint tests: TEXT = PROMPT, sent
# REPETITION times (a request parameter, default 1), DELAY seconds apart, then the final
# flag, or with FAIL_LAST an error response in its place; with STREAM false, one
# response that carries the final flag. It stops early once the client has gone away,
# and says so in the log. With GATE, a path, it sends response i > 0 only once the file
# GATE + str(i) exists: a client that creates it after the event before has shown that
# the event reached it while the model was still running.
LLM = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            stream = pb_utils.get_input_tensor_by_name(request, "STREAM").as_numpy()
            sender = request.get_response_sender()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", prompt)])
            if not stream.flatten()[0]:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for index in range(params.get("REPETITION", 1)):
                if "DELAY" in params:
                    time.sleep(params["DELAY"])
                if index and "GATE" in params:
                    deadline = time.monotonic() + 20
                    while not os.path.exists(params["GATE"] + str(index)):
                        if time.monotonic() > deadline:
                            raise pb_utils.TritonModelException("the gate stayed closed")
                        time.sleep(0.01)
                if sender.is_cancelled():
                    pb_utils.Logger.log_info("llm: the request was cancelled")
                    break
                sender.send(response)
            last = None
            if params.get("FAIL_LAST", False):
                last = pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred"))
            sender.send(last, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


# Decoupled: IN responses with OUT = their index, of which the second is an error sent
# without the final flag; then the flag on its own.
STUMBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(count):
                if index == 1:
                    error = pb_utils.TritonError(f"response {index} failed")
                    sender.send(pb_utils.InferenceResponse(error=error))
                else:
                    out = pb_utils.Tensor("OUT", np.array([index], np.int32))
                    sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Calls "stumble" through BLS and answers what its iterator gave: each response's OUT,
# -1 for an error response.
BLS_STUMBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "IN")
            call = pb_utils.InferenceRequest(
                model_name="stumble", inputs=[given], requested_output_names=["OUT"]
            )
            seen = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    seen.append(-1)
                elif response.output_tensors():
                    out = pb_utils.get_output_tensor_by_name(response, "OUT")
                    seen.append(int(out.as_numpy()[0]))
            out = pb_utils.Tensor("OUT", np.array(seen, np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


# Kills its own worker in initialize, as qa's init_exit does.
INIT_KILL = """
import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, requests):
        return []
"""

# Spread over files, as qa's multi_file: a module beside it imported by name, and one by a
# relative import (Triton imports model.py as `<version>.model`, in its version package).
MULTI_FILE = """
import numpy as np
import triton_python_backend_utils as pb_utils

import by_name
from . import relative
from .relative import OFFSET


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = value * by_name.FACTOR + relative.OFFSET + OFFSET + len(__name__)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

# A Python-based backend, as python_backend's example: auto-completes its tensors, and
# reads the model's own settings from the model's version folder (get_model_dir()).
BASED_BACKEND = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as file:
            self.step = json.load(file)["step"]

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", (value + self.step).astype(np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def write_multi_file(repo: Path, name: str) -> Path:
    """MULTI_FILE and the two modules beside it: OUT = IN * 10 + 2 + len("1.model")."""
    folder = write_model(repo, name, MULTI_FILE, _config(name, _INT_IN_OUT))
    (folder / "1" / "by_name.py").write_text("FACTOR = 10\n")
    (folder / "1" / "relative.py").write_text("OFFSET = 1\n")
    return folder


def write_python_based(backends: Path, backend: str, repo: Path, name: str, step: int) -> Path:
    """BASED_BACKEND as `<backends>/<backend>/model.py`, and a model of it in `repo` whose
    version folder holds its settings (model.json) and no model.py."""
    (backends / backend).mkdir(parents=True, exist_ok=True)
    (backends / backend / "model.py").write_text(textwrap.dedent(BASED_BACKEND).lstrip())
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.json").write_text(f'{{"step": {step}}}')
    (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "{backend}"\n')
    return folder


def _config(name: str, body: str, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "python"\n{textwrap.dedent(body)}\n{extra}\n'


_INT_IN_OUT = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

MODELS: dict[str, tuple[str, str]] = {
    "add_sub": (ADD_SUB, _TENSORS_ADD_SUB + "instance_group [{ kind: KIND_CPU }]"),
    "add_sub_copy": (ADD_SUB, _TENSORS_ADD_SUB),
    "add_sub_batch": (
        ADD_SUB,
        "max_batch_size: 8\n"
        + _TENSORS_ADD_SUB.replace(
            "output [", 'output [\n  { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] },'
        )
        + "dynamic_batching { max_queue_delay_microseconds: 2000000 }",
    ),
    # Batching allowed, but no dynamic_batching: Triton runs each request alone.
    "add_sub_unbatched": (
        ADD_SUB,
        "max_batch_size: 8\n"
        + _TENSORS_ADD_SUB.replace(
            "output [", 'output [\n  { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] },'
        ),
    ),
    "introspect": (
        INTROSPECT,
        """
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "FACTS" data_type: TYPE_STRING dims: [ 1 ] } ]
        instance_group [{ name: "probe" kind: KIND_CPU count: 2 }]
        parameters { key: "custom_key" value { string_value: "custom_value" } }
        """,
    ),
    "failing": (FAILING, _INT_IN_OUT),
    "hanger": (HANGER, _INT_IN_OUT),
    "broken_import": ("import no_such_module_anywhere\n", _INT_IN_OUT),
    "init_kill": (INIT_KILL, _INT_IN_OUT),
    "sleeper": (
        SLEEPER,
        """
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
        """,
    ),
    "repeat": (
        REPEAT,
        """
        model_transaction_policy { decoupled: true }
        input [
          { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
          { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
          { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
        ]
        output [
          { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
          { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
        ]
        """,
    ),
    "echo": (
        ECHO,
        """
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [
          { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
          { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }
        ]
        """,
    ),
    "sender": (SENDER, _INT_IN_OUT),
    "ready_probe": (
        READY_PROBE,
        """
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 3 ] } ]
        """,
    ),
    "once": (ONCE, "model_transaction_policy { decoupled: true }\n" + _INT_IN_OUT),
    "stumble": (STUMBLE, "model_transaction_policy { decoupled: true }\n" + _INT_IN_OUT),
    "bls_stumble": (
        BLS_STUMBLE,
        """
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
        """,
    ),
    "square": (SQUARE, "model_transaction_policy { decoupled: true }\n" + _INT_IN_OUT),
    "bls": (
        BLS,
        """
        input [
          { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
          { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
        ]
        output [
          { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
        ]
        """,
    ),
    # As "bls", but the call names the request it is made for, so it is traced as its child.
    "bls_traced": (
        BLS.replace("model_name=name,", "model_name=name,\n                trace=request.trace(),"),
        _TENSORS_ADD_SUB.replace(
            "input [", 'input [\n  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },'
        ),
    ),
    "bls_async": (BLS_ASYNC, _TENSORS_ADD_SUB),
    "bls_decoupled": (
        BLS_DECOUPLED.format(
            times=1,
            kind="",
            gather="for call in calls:\n                total(call.exec(decoupled=True), found)",
        ),
        """
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """,
    ),
    "bls_decoupled_async": (
        BLS_DECOUPLED.format(
            times=2,
            kind="async ",
            gather="for answers in await asyncio.gather("
            "*(c.async_exec(decoupled=True) for c in calls)):\n"
            "                total(answers, found)",
        ),
        """
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """,
    ),
    "llm": (
        LLM,
        """
        model_transaction_policy { decoupled: true }
        input [
          { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
          { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] },
          { name: "input_ids" data_type: TYPE_INT32 dims: [ 1, -1 ] optional: true }
        ]
        output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1, -1 ] } ]
        """,
    ),
    "metrics": (
        METRICS.replace("{{", "{").replace("}}", "}"),
        _TENSORS_ADD_SUB + "instance_group [{ kind: KIND_CPU count: 2 }]",
    ),
}


def write(repo: Path, *names: str) -> Path:
    """Write the named models (keys of MODELS) into `repo`; returns `repo`."""
    for name in names:
        source, config = MODELS[name]
        write_model(repo, name, source, _config(name, config))
    return repo


def write_model(repo: Path, name: str, source: str, config: str | None) -> Path:
    """One Python model: `config.pbtxt` (none when `config` is None) and `1/model.py`."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(source).lstrip())
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    return folder


def write_auto_complete(repo: Path, name: str, max_batch_size: int, more: str = "") -> Path:
    """A model with no config.pbtxt; `more` is one more line of auto_complete_config."""
    source = AUTO_COMPLETE.format(max_batch_size=max_batch_size, more=more or "pass")
    return write_model(repo, name, source, None)


def write_env_model(repo: Path, name: str, env_value: str) -> Path:
    config = _config(
        name,
        """
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{env_value}" }} }}',
    )
    return write_model(repo, name, ENV_MODEL, config)


def write_models(repo: Path, models: Mapping[str, tuple[str, str]]) -> None:
    """Each (source, config body) of `models` as the Python model of its name."""
    for name, (source, config) in models.items():
        write_model(repo, name, source, f'name: "{name}"\nbackend: "python"\n{config}')


def infer_in(base_url: str, model: str, value: int, timeout: float = 30) -> httpx.Response:
    """One JSON request to a model with the INT32 [1] input IN (MODELS["failing"]'s)."""
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [value]}]}
    return httpx.post(f"{base_url}/v2/models/{model}/infer", json=body, timeout=timeout)
