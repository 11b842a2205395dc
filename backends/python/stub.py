"""The worker process: one model instance's `model.py`, run as Triton's stub runs it.

`python -m ge_serve.backends.python.stub <socket fd>` is started by the server (worker.py)
with the other end of a Unix socket. Two threads matter:

- the reader (a daemon thread) reads every message from the server: work goes to the
  model thread's queue; answers to the model's own calls (BLS, metric values) go to the
  caller waiting for them, so a model blocked in a BLS call still gets its answer;
- the model thread (the main thread) runs `initialize`, each `execute` and `finalize`,
  one at a time, as Triton calls them. An `async def execute` runs on an event loop of
  this thread; for a decoupled model on a loop of its own, so that execute returns and
  the next batch can start while the last one is still waiting.

The worker ends when the server says so (finalize), or when the server's end of the
socket closes, which is also how it learns that the server itself is gone: the reader
then ends the whole process, whatever the model's threads are doing. (PR_SET_PDEATHSIG
would not do: it fires when the *thread* that started the worker ends.)
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import queue
import socket
import sys
import threading
import traceback
from collections.abc import Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any

from .channel import Channel, ChannelClosed, Message
from .pb_config import ModelConfig
from .pb_request import InferenceRequest, InferenceResponse
from .pb_tensor import Tensor
from .pb_types import TRITONSERVER_RESPONSE_COMPLETE_FINAL, TritonError
from .runtime import Runtime, install
from .shm import Arena, PeerSegments
from .tensors import read_tensor

_TRACE_FRAMES = 10
# Our own frames (this stub calling the model) are not the model's story.
_OWN_FOLDER = os.path.dirname(os.path.abspath(__file__)) + os.sep


def describe(exc: BaseException) -> str:
    """An exception as Triton shows a model's: its type and message, then where it was
    raised, innermost frame first."""
    lines = [f"{type(exc).__name__}: {exc}", "", "At:"]
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(_OWN_FOLDER)
    ]
    for frame in reversed(frames[-_TRACE_FRAMES:]):
        lines.append(f"  {frame.filename}({frame.lineno}): {frame.name}")
    return "\n".join(lines) + "\n"


def load_module(model_path: Path) -> ModuleType:
    """Import `model.py` (its folder first on sys.path, for the modules beside it)."""
    folder = str(model_path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("model", model_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{model_path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


def model_class(module: ModuleType, model_path: Path) -> Any:
    found = getattr(module, "TritonPythonModel", None)
    if found is None:
        raise AttributeError(f"'{model_path}' defines no class TritonPythonModel")
    return found


class Stub:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.peers = PeerSegments()
        self.arena = Arena(self._announce, f"ge-serve-pb-{os.getpid()}")
        self.runtime = Runtime(channel, self.arena, self.peers)
        self.work: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self.model: Any = None
        self.decoupled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: asyncio.AbstractEventLoop | None = None

    def _announce(self, seg: int, fd: int, size: int) -> None:
        self.channel.send(("segment", seg, size), fds=[fd])

    # --- the reader thread -----------------------------------------------------------------

    def read(self) -> None:
        try:
            while True:
                for message in self.channel.receive():
                    self._dispatch(message)
                self.runtime.flush_releases()
        except ChannelClosed:
            pass
        except BaseException:
            traceback.print_exc()
        # The server is gone, or closed its end on purpose: nothing more will be asked.
        self.runtime.fail_all("the server closed the connection")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _dispatch(self, message: Message) -> None:
        kind = message[0]
        if kind == "segment":
            self.peers.add(message[1], self.channel.take_fd(), message[2])
        elif kind == "release":
            for region in message[1]:
                self.arena.free(tuple(region))
        elif kind == "bls_response":
            _kind, number, encoded, final = message
            value = self.runtime.decode(encoded) if encoded is not None else None
            self.runtime.answer(number, value, final)
        elif kind == "reply":
            _kind, number, status, value = message
            self.runtime.answer(number, (status, value), True)
        else:
            self.work.put(message)

    # --- the model thread ------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            message = self.work.get()
            if message is None:
                return
            kind, number = message[0], message[1]
            try:
                if kind == "init":
                    self._initialize(message[2])
                    self._reply(number, None)
                elif kind == "execute":
                    self._execute(number, message[2])
                elif kind == "autocomplete":
                    self._reply(number, self._autocomplete(Path(message[2]), message[3]))
                elif kind == "finalize":
                    self._finalize(number)
                    return
            except BaseException as exc:
                self._reply(number, None, str(exc) if isinstance(exc, _Failed) else describe(exc))

    def _reply(self, number: int, value: Any, error: str | None = None) -> None:
        self.runtime.send(("done", number, value, error))

    def _initialize(self, payload: dict[str, Any]) -> None:
        runtime = self.runtime
        runtime.model_name = payload["model_name"]
        runtime.instance_name = payload["instance_name"]
        runtime.decoupled = self.decoupled = bool(payload["decoupled"])
        model_path = Path(payload["model_path"])
        try:
            self.model = model_class(load_module(model_path), model_path)()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                result = initialize(dict(payload["args"]))
                if inspect.isawaitable(result):
                    self._run(result)
        except BaseException as exc:
            raise _Failed(f"Failed to initialize Python stub: {describe(exc)}") from exc

    def _autocomplete(self, model_path: Path, config_json: str) -> str:
        cls = model_class(load_module(model_path), model_path)
        method = getattr(cls, "auto_complete_config", None)
        if method is None:
            return config_json
        config = method(ModelConfig(config_json))
        if not isinstance(config, ModelConfig):
            raise TypeError("auto_complete_config must return the pb_utils.ModelConfig it got")
        return json.dumps(config.as_dict())

    def _execute(self, number: int, batch: list[tuple[Any, ...]]) -> None:
        runtime = self.runtime
        requests = []
        for key, request_id, descs, requested, parameters in batch:
            inputs = [Tensor(d[0], read_tensor(self.peers, d, copy=False)) for d in descs]
            requests.append(
                InferenceRequest.received(
                    key, runtime, inputs, request_id, requested, parameters, self.decoupled
                )
            )
        try:
            result = self.model.execute(requests)
            if inspect.isawaitable(result):
                if self.decoupled:
                    self._in_background(result, requests)
                    result = None
                else:
                    result = self._run(result)
        except BaseException as exc:
            message = self._failure(exc)
            if self.decoupled:
                self._close_with_error(requests, message)
                self._reply(number, ("none",))
            else:
                self._reply(number, None, message)
            return
        if self.decoupled or result is None:
            self._reply(number, ("none",))
            return
        self._reply(number, *self._encode_list(result, len(requests)))

    def _encode_list(self, result: Any, count: int) -> tuple[Any, str | None]:
        if not isinstance(result, list | tuple):
            return None, (f"Expected a list in the execute return, got '{type(result).__name__}'")
        if len(result) != count:
            return None, (
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{count}, and "
                f"InferenceResponse(s) size is:{len(result)}"
            )
        encoded = []
        for response in result:
            if not isinstance(response, InferenceResponse):
                return None, (
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response).__name__}'."
                )
            encoded.append(response.encode(self.runtime))
        return ("responses", encoded), None

    def _failure(self, exc: BaseException) -> str:
        return (
            f"Failed to process the request(s) for model instance "
            f"'{self.runtime.instance_name}', message: {describe(exc)}"
        )

    def _close_with_error(self, requests: list[InferenceRequest], message: str) -> None:
        for request in requests:
            sender = request.sender
            if sender is not None and not sender.closed:
                try:
                    sender.send(
                        InferenceResponse(error=TritonError(message)),
                        TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                except Exception:
                    traceback.print_exc()

    def _run(self, awaitable: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(awaitable)

    def _in_background(self, awaitable: Any, requests: list[InferenceRequest]) -> None:
        if self._background is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="async-execute", daemon=True).start()
            self._background = loop

        async def run() -> None:
            try:
                await awaitable
            except BaseException as exc:
                self._close_with_error(requests, self._failure(exc))

        coroutine: Coroutine[Any, Any, None] = run()
        asyncio.run_coroutine_threadsafe(coroutine, self._background)

    def _finalize(self, number: int) -> None:
        error = None
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                result = finalize()
                if inspect.isawaitable(result):
                    self._run(result)
            except BaseException as exc:
                error = describe(exc)
        self._reply(number, None, error)


class _Failed(Exception):
    """A failure whose message is already what the server should show."""

    def __str__(self) -> str:
        return str(self.args[0])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    channel = Channel(sock)
    stub = Stub(channel)
    install(stub.runtime)
    reader = threading.Thread(target=stub.read, name="pb-reader", daemon=True)
    reader.start()
    stub.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
