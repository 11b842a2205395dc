"""The backend interface.

Everything here is synchronous and imports no asyncio, so a backend can be unit-tested
without an event loop. The scheduler owns the threads: it calls each `Executor` from one
dedicated thread, the slot's, and never from two threads at once. An executor that may run
on any thread (`LoadedModel.thread_free`) may instead be called on the event loop's thread
for executions that take microseconds, still never two at once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeGuard, runtime_checkable

import numpy as np
import numpy.typing as npt

from ge_serve.protos import model_config_pb2

Array = npt.NDArray[Any]


class BackendError(RuntimeError):
    """A model failed while executing one batch (a device or runtime error).

    Only that batch's requests fail; the slot keeps serving. Metrics count these under
    the BACKEND failure reason.
    """


class ShapeRejected(BackendError):
    """The batch's shapes are not ones the model can execute (no gear matches, or a dim is
    outside the model's shape range): the request's fault, not the device's, so it is
    answered as invalid input. The message names what the model accepts."""


class DataRejected(BackendError):
    """The model's runtime refused the values of a batch that fits the model's shapes and
    types (an index past a table's end, a string its graph reads as a number that is not
    one): the request's fault, answered as invalid input, and counted, as Triton counts
    it, as the backend's failure. The message says which op refused what (`refusal`)."""

    def __init__(self, refusal: str) -> None:
        super().__init__(f"the model could not run on this request's data: {refusal}")
        self.refusal = refusal

    def __reduce__(self) -> tuple[type[DataRejected], tuple[str], dict[str, object]]:
        # A copy is made from the refusal, not the message, and keeps what was added.
        return type(self), (self.refusal,), self.__dict__


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """Where one executor runs: a device and a stream on it ("cpu" devices have one).

    `serial`: the device runs one execution at a time, whichever slot hands it over (an
    NPU's AI cores): an execution handed over while another slot's runs waits for it.
    The adaptive batcher then forms a slot's batch when the device is about to free
    (docs/adaptive-batching.md)."""

    name: str
    device: str
    device_id: int = 0
    stream: int = 0
    serial: bool = False


class ModelEvents(Protocol):
    """Where a backend reports that a loaded model version stopped or resumed serving on
    its own (a worker process died and is being restarted). Thread-safe: a backend calls
    it from any thread."""

    def unavailable(self, reason: str) -> None: ...

    def available(self) -> None: ...


@dataclass(slots=True)
class ModelSpec:
    """Everything a backend needs to load one version of a model."""

    name: str
    version: int
    config: model_config_pb2.ModelConfig
    model_dir: Path
    # The model file (or folder) inside the version folder; may not exist for some backends.
    model_path: Path
    # Health reports for this version, for backends whose executors can fail and recover.
    events: ModelEvents | None = None


ParamValue = bool | int | float | str


@dataclass(frozen=True, slots=True)
class ModelError:
    """A request's failure as a model reports it: a Triton error code name (INTERNAL,
    INVALID_ARG, NOT_FOUND, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED, UNKNOWN)
    and a message for the client."""

    code: str
    message: str


class ResponseSink(Protocol):
    """Where a decoupled model's responses for one request go, each as it is produced.
    Thread-safe; `final` is Triton's COMPLETE_FINAL flag, after which nothing is sent."""

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: ModelError | None,
        final: bool,
        parameters: Mapping[str, ParamValue] | None = None,
    ) -> None:
        """`parameters`: the response's own (Triton's response parameters)."""
        ...


@dataclass(slots=True)
class RequestContext:
    """What a request-level backend sees of one request beyond its tensors.

    The core fills it in; the backend reads it and sets `error` when the model answered
    this request with an error (the rest of its batch may well have succeeded).
    """

    id: str = ""
    parameters: Mapping[str, ParamValue] = field(default_factory=dict)
    # The outputs the client asked for; empty means every output.
    requested_outputs: tuple[str, ...] = ()
    # Set (from the loop) once the client has gone away.
    cancelled: bool = False
    # A decoupled model's responses go here instead of the execution's result.
    responses: ResponseSink | None = None
    error: ModelError | None = None
    # The parameters the model gave its response (parameters extension).
    response_parameters: Mapping[str, ParamValue] = field(default_factory=dict)
    # The core's trace of this request when it is traced, opaque here: a BLS call the
    # model makes for this request hands it back, so the call's trace is its child.
    trace: object | None = None
    # The request's sequence, as Triton gives it to a backend: its correlation ID (0 or
    # "" when it names none) and its flags (1: START, 2: END), lifted out of `parameters`.
    correlation_id: int | str = 0
    flags: int = 0
    # The request's timeout in microseconds (0: none), as Triton gives it to a backend.
    timeout_us: int = 0


@dataclass(slots=True)
class ModelRequest:
    """One client request as a request-level executor receives it: its own tensors (with
    their own batch dimension when the model batches) and its context."""

    inputs: Mapping[str, Array]
    context: RequestContext


class Executor(Protocol):
    slot: SlotInfo

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch; returns every model output by name. Called from the slot thread."""
        ...

    def close(self) -> None:
        """Release the session and buffers. Called once, from the slot thread or at unload."""
        ...


@runtime_checkable
class RequestExecutor(Executor, Protocol):
    """An executor that takes a batch as its requests, one by one, not as merged tensors
    (Triton's backend API: a Python model's `execute(requests)`). `execute` stays for
    warmup samples, each run as one request."""

    def execute_requests(self, requests: Sequence[ModelRequest]) -> list[dict[str, Array]]:
        """Run the requests as one execution; returns each request's outputs, in order (an
        empty dict for a request whose context got an error or whose responses went to
        its sink). Called from the slot thread."""
        ...


def takes_requests(executor: Executor) -> TypeGuard[RequestExecutor]:
    """Whether `executor` takes a batch as its requests: the one test, which the
    scheduler asks on each execution and `LoadedModel` checks its `per_request` against.
    Decided once per executor class, since a structural isinstance on every execution
    would cost tens of microseconds; `LoadedModel` checks the whole protocol at load."""
    return _takes_requests(type(executor))


@functools.cache
def _takes_requests(cls: type) -> bool:
    return callable(getattr(cls, "execute_requests", None))


@dataclass(frozen=True, slots=True)
class ShapeBucket:
    """One shape combination a model's executors accept, when non-batch dims vary and the
    executor only runs listed shapes (GE ND gears, dynamic image sizes) or the config
    lists buckets to pad to.

    `shapes` maps each varying input to its full executed shape, batch dim first when
    the model batches. A -1 dim accepts any size (not padded): the batch dim of a
    configured bucket, say. The scheduler pads each request (and a batch) up to the
    smallest bucket that holds it and trims the outputs back; executors are only ever
    handed shapes that match a bucket.
    """

    shapes: Mapping[str, tuple[int, ...]]


class TextTokenizer(Protocol):
    """A generative model's tokenizer, as the front ends reach it (vLLM's /tokenize and
    /detokenize): the one the model's prompts are tokenized with."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary spells it (transformers'
        `convert_ids_to_tokens`); ids are in the vocabulary."""
        ...

    def unknown_id(self, ids: list[int]) -> int | None:
        """The largest of `ids` (none negative) the vocabulary lacks, None where it has
        them all; a long list costs set operations, not a call per id."""
        ...


@dataclass(frozen=True, slots=True)
class TextGeneration:
    """What a generative (text in, text out) model tells the front ends that speak text
    rather than tensors (the OpenAI-compatible API): how to turn chat messages into its
    prompt, and how long a prompt plus its answer may be. Set by the backend that loads
    such a model; the front end renders the template, the model only sees text."""

    # A Jinja2 chat template (Hugging Face's convention: `messages`, `bos_token`,
    # `eos_token`, `add_generation_prompt`), or None where the model has none.
    chat_template: str | None
    bos_token: str
    eos_token: str
    # Prompt tokens plus generated tokens, at most.
    max_model_len: int
    # The model's tokenizer, where the backend holds one (the llm backend's); a Python
    # model tokenizes inside itself, out of the front ends' reach.
    tokenizer: TextTokenizer | None = None
    # The model's `sampling_parameters` take the `llm` engine's own key
    # `structured_outputs_after` (a grammar that waits for a thinking model's `</think>`);
    # another model's (vLLM's SamplingParams(**params)) would fail on it.
    structured_after: bool = False
    # Its `sampling_parameters` take the `llm` engine's key `priority` (vLLM's request
    # priority, which vLLM's generate() takes beside its SamplingParams), likewise.
    priority: bool = False
    # Its `sampling_parameters` take the `llm` engine's key `kept_special_tokens` (the
    # special tokens whose text decoding keeps), likewise.
    kept_special: bool = False
    # Its `sampling_parameters` take the `llm` engine's keys `thinking_token_budget`,
    # `reasoning_start_str` and `reasoning_end_str` (vLLM's budget, its markers ge-serve's).
    thinking_budget: bool = False
    # Whether its tokenizer adds special tokens to a text prompt (a BOS) unless its
    # `sampling_parameters` say `add_special_tokens: false` (the `llm` engine's key), as a
    # chat's prompt is sent: its template writes them (vLLM tokenizes a chat so). None:
    # the model takes no such key (a Python model tokenizes inside itself).
    adds_special_tokens: bool | None = None


@dataclass(slots=True)
class LoadedModel:
    """A loaded model version: one executor per slot, plus what the scheduler must honour."""

    executors: list[Executor]
    # Batch sizes the executors accept (e.g. OM dynamic-batch gears), ascending. Empty means
    # any size from 1 to max_batch_size.
    gears: tuple[int, ...] = ()
    # Non-batch shape gears the executors accept, smallest first (see ShapeBucket). Empty
    # means any shape the config allows.
    shape_buckets: tuple[ShapeBucket, ...] = ()
    # Device bytes held by this model (for statistics and metrics).
    memory_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # The executors are RequestExecutors: the core gives each request its context.
    per_request: bool = False
    # The executors hold no per-thread state (no device context bound to the slot
    # thread): the scheduler may run a very short execution on another thread.
    thread_free: bool = False
    # Set for generative text models (see TextGeneration); None for every other model.
    text_generation: TextGeneration | None = None

    def __post_init__(self) -> None:
        # `per_request` is the backend's word, checked here once against what its
        # executors are: the core gives request contexts by it, the scheduler hands
        # requests by `takes_requests`, and the two must never disagree.
        for executor in self.executors:
            if takes_requests(executor) != self.per_request or (
                self.per_request and not isinstance(executor, RequestExecutor)
            ):
                kind = "a RequestExecutor" if self.per_request else "an Executor"
                raise TypeError(
                    f"per_request={self.per_request}, but executor "
                    f"{type(executor).__name__} is not {kind}"
                )

    def close(self) -> None:
        for executor in self.executors:
            executor.close()


class Backend(Protocol):
    name: str

    def default_model_filename(self) -> str: ...

    def autocomplete(self, config: model_config_pb2.ModelConfig, model_path: Path) -> None:
        """Fill in what the config leaves out, from the model file. Must not overwrite."""
        ...

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Load a model version. Blocking; the caller runs it off the event loop."""
        ...


def gear_for(size: int, gears: Sequence[int]) -> int:
    """The smallest supported batch size that holds `size` (the size itself if unrestricted)."""
    for gear in gears:
        if gear >= size:
            return gear
    return size


def pad_batch(array: Array, size: int) -> Array:
    """Pad the leading dimension up to `size` by repeating the last row (valid data)."""
    short = size - array.shape[0]
    if short <= 0:
        return array
    filler = np.repeat(array[-1:], short, axis=0)
    return np.concatenate([array, filler], axis=0)
