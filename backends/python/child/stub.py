"""The worker process: one model instance's `model.py`, run as Triton's stub runs it.

`python -m ge_serve.backends.python.child.stub <socket fd>` is started by the server
(host/worker.py) with the other end of a Unix socket: the process link's thread driver
(ge_serve.link.thread). It says it is up with the link's `Ready`. Two threads matter:

- the reader (a daemon thread) reads every message from the server: work goes to the
  model thread's queue; answers to the model's own calls (BLS, metric values) go to the
  caller waiting for them, so a model blocked in a BLS call still gets its answer;
- the model thread (the main thread) runs `initialize`, each `execute` and `finalize`,
  one at a time, as Triton calls them. The model's coroutines (`async def execute`) run
  on one event loop, alive for the life of the worker in a thread of its own, as Triton's
  (modelloop.py): a default-mode model's execute is waited for, and tasks it started go on
  after it returned; a decoupled model's is left running, so that the next batch can
  start while the last one is still waiting.

The worker ends when the server says so (finalize), or when the server's end of the
socket closes, which is also how it learns that the server itself is gone: the reader
then ends the whole process, whatever the model's threads are doing. (PR_SET_PDEATHSIG
would not do: it fires when the *thread* that started the worker ends.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.machinery
import importlib.util
import inspect
import json
import os
import queue
import socket
import sys
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from ge_serve.link.child import leave_stop_signals_to_parent
from ge_serve.link.messages import Message, Ready
from ge_serve.link.thread import ThreadLink

from ..messages import (
    TO_WORKER,
    Autocomplete,
    BlsAnswer,
    Done,
    Encoded,
    Execute,
    Finalize,
    Init,
    Log,
    Reply,
    Request,
)
from .modelloop import ModelLoop
from .pb_config import ModelConfig
from .pb_request import InferenceRequest, InferenceResponse
from .pb_tensor import Tensor
from .pb_types import TRITONSERVER_RESPONSE_COMPLETE_FINAL, TritonError, TritonModelException
from .runtime import Runtime, install

_TRACE_FRAMES = 10
_LOG_ERROR = 2  # pb_utils.Logger.ERROR
# Our own frames (this stub calling the model), and those of the event loop that ran a
# coroutine of the model, are not the model's story.
_NOT_THE_MODEL = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (__file__, asyncio.__file__, concurrent.futures.__file__)
)


def describe(exc: BaseException) -> str:
    """An exception as Triton shows a model's: its type and message, then where it was
    raised, innermost frame first."""
    lines = [f"{type(exc).__name__}: {exc}", "", "At:"]
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(_NOT_THE_MODEL)
    ]
    for frame in reversed(frames[-_TRACE_FRAMES:]):
        lines.append(f"  {frame.filename}({frame.lineno}): {frame.name}")
    return "\n".join(lines) + "\n"


def load_module(model_path: Path, backend_file: Path | None = None) -> ModuleType:
    """Import the model's Python file as Triton's stub does (ModelContext::StubSetup).

    A model's own `<model>/<version>/model.py` is the module `<version>.model`, in the
    package that is its version folder, with that folder and the model folder on sys.path:
    `import file1` and `from . import file2` both find the files beside it. A Python-based
    backend's file (`backend_file`: `<backend directory>/<name>/model.py`) is the
    top-level module `model`, with its folder on sys.path. Either is also registered as
    `model`, the name qa models give unittest.main.
    """
    if backend_file is not None:
        _on_path(backend_file.parent)
        return _execute_module(backend_file.stem, backend_file)
    folder = model_path.parent
    _on_path(folder)
    # Triton appends the model folder; after the rest, so that nothing in it (such as a
    # folder named like a library) hides an installed module.
    if str(folder.parent) not in sys.path:
        sys.path.append(str(folder.parent))
    package = _version_package(folder)
    return _execute_module(f"{package}.{model_path.stem}", model_path)


def _on_path(folder: Path) -> None:
    """The model's own folder first on sys.path: its modules win over installed ones."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _version_package(folder: Path) -> str:
    """The version folder as a package, built from that folder itself rather than found on
    sys.path, where another folder of the same name (another `1`) could come first. Its
    `__init__.py`, if it has one, runs as Triton's import would run it."""
    name = folder.name
    init = folder / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )
    else:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
    if spec is None:
        raise ImportError(f"cannot import '{folder}' as a package")
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    if spec.loader is not None:
        spec.loader.exec_module(package)
    return name


def _execute_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


def model_class(module: ModuleType, model_path: Path) -> Any:
    found = getattr(module, "TritonPythonModel", None)
    if found is None:
        raise AttributeError(f"'{model_path}' defines no class TritonPythonModel")
    return found


class Stub:
    def __init__(self, sock: socket.socket) -> None:
        self.link = ThreadLink(sock, TO_WORKER, f"ge-serve-pb-{os.getpid()}", self._dispatch)
        self.runtime = Runtime(self.link)
        self.work: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self.model: Any = None
        self.decoupled = False
        self.loop = ModelLoop()

    # --- the reader thread -----------------------------------------------------------------

    def read(self) -> None:
        try:
            self.link.serve()  # releases owed go after each read
        except BaseException:
            traceback.print_exc()
        # The server is gone, or closed its end on purpose: nothing more will be asked.
        self.runtime.fail_all("the server closed the connection")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, BlsAnswer):
            response = message.response
            value = self.runtime.decode(response) if response is not None else None
            self.runtime.answer(message.number, value, message.final)
        elif isinstance(message, Reply):
            self.runtime.answer(message.number, message, True)
        else:
            self.work.put(message)

    # --- the model thread ------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            message = self.work.get()
            if message is None:
                return
            assert isinstance(message, Init | Execute | Autocomplete | Finalize)
            number = message.number
            try:
                if isinstance(message, Init):
                    self._initialize(message.payload)
                    self._reply(Done(number))
                elif isinstance(message, Execute):
                    self._execute(number, message.batch)
                elif isinstance(message, Autocomplete):
                    text = self._autocomplete(message)
                    self._reply(Done(number, text=text))
                else:
                    self._finalize(number)
                    return
            except BaseException as exc:
                error = str(exc) if isinstance(exc, _Failed) else describe(exc)
                self._reply(Done(number, error))

    def _reply(self, done: Done) -> None:
        self.runtime.send(done)

    def _initialize(self, payload: dict[str, Any]) -> None:
        runtime = self.runtime
        runtime.model_name = payload["model_name"]
        runtime.instance_name = payload["instance_name"]
        runtime.decoupled = self.decoupled = bool(payload["decoupled"])
        model_path = Path(payload["model_path"])
        runtime.model_dir = str(model_path.parent)
        backend_file = _backend_file(payload.get("backend_file", ""))
        try:
            module = load_module(model_path, backend_file)
            self.model = model_class(module, backend_file or model_path)()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                result = initialize(dict(payload["args"]))
                if inspect.isawaitable(result):
                    self.loop.run(result)
        except BaseException as exc:
            raise _Failed(f"Failed to initialize Python stub: {describe(exc)}") from exc
        runtime.bls_allowed = True

    def _autocomplete(self, message: Autocomplete) -> str:
        model_path = Path(message.model_path)
        self.runtime.model_dir = str(model_path.parent)
        backend_file = _backend_file(message.backend_file)
        cls = model_class(load_module(model_path, backend_file), backend_file or model_path)
        method = getattr(cls, "auto_complete_config", None)
        if method is None:
            return message.config_json
        config = method(ModelConfig(message.config_json))
        if not isinstance(config, ModelConfig):
            raise TypeError("auto_complete_config must return the pb_utils.ModelConfig it got")
        return json.dumps(config.as_dict())

    def _execute(self, number: int, batch: list[Request]) -> None:
        runtime = self.runtime
        requests = []
        for one in batch:
            inputs = [Tensor(t.name, runtime.read(t)) for t in one.inputs]
            requests.append(
                InferenceRequest.received(
                    one.key, runtime, inputs, one.id, one.requested, one.parameters,
                    self.decoupled, one.correlation_id, one.flags, one.timeout,
                )
            )  # fmt: skip
        try:
            result = self.model.execute(requests)
            if inspect.isawaitable(result):
                if self.decoupled:
                    self._in_background(result, requests)
                    result = None
                else:
                    result = self.loop.run(result)
        except BaseException as exc:
            message = self._failure(exc)
            if self.decoupled:
                self._close_with_error(requests, message)
                self._reply(Done(number))
            else:
                _settle(requests)
                self._reply(Done(number, message))
            return
        if result is None:
            self._reply(Done(number))
            return
        if self.decoupled:
            # Triton's error for it; like any failed execute of a decoupled model, it ends
            # the requests still open, and not the ones already answered in full.
            message = (
                f"Python model '{self.runtime.instance_name}' is using the decoupled mode and "
                "the execute function must return None."
            )
            self._close_with_error(requests, message)
            self._reply(Done(number))
            return
        self._reply(self._encode_list(number, result, requests))

    def _encode_list(self, number: int, result: Any, requests: list[InferenceRequest]) -> Done:
        """What execute returned: a response for each request, or None for one answered
        through its response sender (as Triton's ProcessReturnedResponses skips it)."""
        try:
            # A response returned for a request the sender answered already fails the
            # batch, as in Triton (that request keeps the response it was sent).
            if isinstance(result, list | tuple) and len(result) == len(requests):
                for request, response in zip(requests, result, strict=True):
                    if isinstance(response, InferenceResponse) and request.sender is not None:
                        request.sender.returned()
            done = self._check_list(number, result, len(requests))
        except TritonModelException as exc:
            done = Done(number, self._failure(exc))
        if done.error is not None:
            _settle(requests)  # the whole batch fails
            return done
        _settle([r for r, response in zip(requests, result, strict=True) if response is not None])
        return done

    def _check_list(self, number: int, result: Any, count: int) -> Done:
        if not isinstance(result, list | tuple):
            kind = type(result).__name__
            return Done(number, f"Expected a list in the execute return, got '{kind}'")
        if len(result) != count:
            return Done(
                number,
                (
                    "Number of InferenceResponse objects do not match the number of "
                    f"InferenceRequest objects. InferenceRequest(s) size is:{count}, and "
                    f"InferenceResponse(s) size is:{len(result)}"
                ),
            )
        encoded: list[Encoded | None] = []
        for response in result:
            if response is None:
                encoded.append(None)
            elif not isinstance(response, InferenceResponse):
                return Done(
                    number,
                    (
                        "Expected an 'InferenceResponse' object in the execute function return "
                        f"list, found type '{type(response).__name__}'."
                    ),
                )
            else:
                encoded.append(response.encode(self.runtime))
        return Done(number, responses=encoded)

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

    def _in_background(self, awaitable: Any, requests: list[InferenceRequest]) -> None:
        def failed(exc: BaseException) -> None:
            # Triton's stub logs it (BackgroundFutureDone: the traceback as Python formats
            # it), even when the requests were answered in full before it was raised.
            self._log_error(exc)
            self._close_with_error(requests, self._failure(exc))

        self.loop.start(awaitable, failed)

    def _log_error(self, exc: BaseException) -> None:
        """An exception of the model, with its traceback, into the server's log."""
        text = "".join(traceback.TracebackException.from_exception(exc).format()).rstrip()
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
        try:
            self.runtime.send(Log(_LOG_ERROR, text, where))
        except Exception:
            traceback.print_exc()

    def _finalize(self, number: int) -> None:
        error = None
        self.runtime.bls_allowed = False
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                result = finalize()
                if inspect.isawaitable(result):
                    self.loop.run(result)
            except BaseException as exc:
                error = describe(exc)
        self.loop.close()
        self._reply(Done(number, error))


def _backend_file(text: str) -> Path | None:
    """A Python-based backend's model.py, which the server names ("" for none)."""
    return Path(text) if text else None


def _settle(requests: list[InferenceRequest]) -> None:
    for request in requests:
        if request.sender is not None:
            request.sender.settled()


class _Failed(Exception):
    """A failure whose message is already what the server should show."""

    def __str__(self) -> str:
        return str(self.args[0])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # The server ends this process itself (its socket closes, or SIGKILL): a SIGTERM or
    # SIGINT sent to the server's whole process group must not kill the worker under it.
    leave_stop_signals_to_parent()
    stub = Stub(socket.socket(fileno=int(args[0])))
    # Triton's stub embeds Python with no arguments, so a model sees sys.argv == [''];
    # qa models call unittest.main("model", exit=False), which reads it for test names.
    sys.argv = [""]
    install(stub.runtime)
    reader = threading.Thread(target=stub.read, name="pb-reader", daemon=True)
    reader.start()
    stub.link.send(Ready())
    stub.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
