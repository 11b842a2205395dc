"""The `llm` backend: loads a generative model version for the generation engine.

A version is its settings (settings.py), its tokenizer, and its step runner with the KV
block pool. It has no executors: the scheduler built for it (scheduler/generation.py)
runs the iteration loop itself, so the model is found in `LoadedModel.extra[MODEL_KEY]`.
The config must be decoupled (answers stream) and not batched by Triton (the engine
batches), and must declare `text_input`; anything else fails the load with the reason.
It may declare `input_ids` (TensorRT-LLM's name; INT32 or INT64 [-1]), a prompt given as
token ids, and then `text_input` must be optional: a request carries one of the two.
A config that lists no interface gets Triton's vLLM backend's (complete_interface), and
`input_ids` beside it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ge_serve.protos import model_config_pb2

from ..base import Backend, LoadedModel, ModelSpec, TextGeneration
from .ge_runner import GeStepRunner, StepGears
from .runner import GraphShape, Runner, StepRunner, check_positions
from .settings import EngineSettings, parse_settings
from .text import Tokenizer

log = logging.getLogger(__name__)

MODEL_KEY = "llm"
TEXT_INPUT = "text_input"
# The prompt as token ids (TensorRT-LLM's name), instead of `text_input`.
IDS_INPUT = "input_ids"
_ID_TYPES = (model_config_pb2.TYPE_INT32, model_config_pb2.TYPE_INT64)
# Triton's vLLM backend's flags: `return_<output>` asks for that output.
RETURN_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_prompt_logprobs",
    # ge-serve's, after the vLLM backend's rule: the generated ids (`output_ids`).
    "return_output_ids",
    # ... and the prompt tokens found in the prefix cache (`num_cached_tokens`).
    "return_num_cached_tokens",
    "return_num_input_tokens",
    "return_num_output_tokens",
)
OPTIONAL_INPUTS = (
    "stream",
    "sampling_parameters",
    "exclude_input_in_output",
    "max_tokens",
    *RETURN_FLAGS,
)
OUTPUTS = (
    "text_output",
    "finish_reason",
    "num_input_tokens",
    "num_output_tokens",
    "num_cached_tokens",
    "output_ids",
    "cumulative_logprob",
    "logprobs",
    "prompt_logprobs",
)
_STRING, _BOOL = model_config_pb2.TYPE_STRING, model_config_pb2.TYPE_BOOL
# What Triton's vLLM backend's auto-complete declares (its model.py), all dims [1] inputs,
# and ge-serve's `return_prompt_logprobs` / `prompt_logprobs` beside its logprobs', and
# `return_output_ids` / `output_ids` and `return_num_cached_tokens` / `num_cached_tokens`.
INTERFACE_INPUTS = (
    (TEXT_INPUT, _STRING),
    ("stream", _BOOL),
    ("sampling_parameters", _STRING),
    ("exclude_input_in_output", _BOOL),
    *((flag, _BOOL) for flag in RETURN_FLAGS),
)
INTERFACE_OUTPUTS = (
    ("text_output", _STRING, -1),
    ("finish_reason", _STRING, -1),
    ("cumulative_logprob", model_config_pb2.TYPE_FP32, -1),
    ("logprobs", _STRING, -1),
    # ge-serve's: the prompt's log probabilities (vLLM's `prompt_logprobs`), as JSON.
    ("prompt_logprobs", _STRING, -1),
    # ge-serve's: the generated token ids (TensorRT-LLM's name), for /v1's token ids.
    ("output_ids", model_config_pb2.TYPE_INT32, -1),
    ("num_input_tokens", model_config_pb2.TYPE_UINT32, 1),
    ("num_output_tokens", model_config_pb2.TYPE_UINT32, -1),
    # ge-serve's: the prompt tokens found in the prefix cache (vLLM's num_cached_tokens).
    ("num_cached_tokens", model_config_pb2.TYPE_UINT32, 1),
)


@dataclass(slots=True)
class LlmModel:
    """Everything the engine drives for one loaded version."""

    name: str
    settings: EngineSettings
    tokenizer: Tokenizer
    runner: Runner
    # Tokens that end a sequence: the `eos_token`'s id and the config's `eos_token_ids`.
    eos_ids: frozenset[int]
    # Which optional outputs the config declares (only those are sent).
    outputs: tuple[str, ...]
    # The outputs whose `return_*` flag the config declares: sent only when a request
    # sets the flag true (Triton's vLLM backend's rule); the others are always sent.
    opt_in: frozenset[str] = frozenset()
    # Whether the config declares `input_ids` (a prompt may come as token ids).
    takes_ids: bool = False
    # The primary EOS (vLLM's tokenizer EOS): an answer ending on it has no `stop_reason`;
    # one ending on another of `eos_ids` has that id, as vLLM turns a generation
    # config's other EOS ids into stop token ids.
    eos_id: int | None = None

    def close(self) -> None:
        """Release the step graph (device memory, on an NPU). Once, after the engine
        has stopped."""
        self.runner.close()


class LlmBackend:
    """`ge`: the GE backend, for models placed on the NPU (`placement: npu`)."""

    name = "llm"

    def __init__(self, ge: Backend | None = None) -> None:
        self._ge = ge

    def default_model_filename(self) -> str:
        return "model.onnx"

    def autocomplete(self, config: model_config_pb2.ModelConfig, model_path: Path) -> None:
        """A config that states no interface gets Triton's vLLM backend's
        (`auto_complete_config`), so its minimal configs load as they are."""
        complete_interface(config)

    def load(self, spec: ModelSpec) -> LoadedModel:
        config = spec.config
        _check_config(config)
        settings = parse_settings(config, spec.model_dir, spec.version)
        tokenizer = Tokenizer(settings.tokenizer)
        runner = self._runner(spec.name, settings)
        try:  # a model that fails from here on lets its step model go (the NPU's memory)
            return self._loaded(spec, settings, tokenizer, runner)
        except BaseException:
            runner.close()
            raise

    def _loaded(
        self, spec: ModelSpec, settings: EngineSettings, tokenizer: Tokenizer, runner: Runner
    ) -> LoadedModel:
        config = spec.config
        primary = eos_primary(settings, tokenizer)
        eos = set(settings.eos_token_ids) | ({primary} if primary is not None else set())
        _check_fits(runner.shape, settings, tokenizer, eos)
        template = None
        if settings.chat_template is not None:
            template = settings.chat_template.read_text(encoding="utf-8")
        declared = {o.name for o in config.output}
        model = LlmModel(
            name=spec.name,
            settings=settings,
            tokenizer=tokenizer,
            runner=runner,
            eos_ids=frozenset(eos),
            outputs=tuple(o for o in OUTPUTS if o in declared),
            opt_in=frozenset(
                i.name.removeprefix("return_") for i in config.input if i.name in RETURN_FLAGS
            ),
            takes_ids=any(i.name == IDS_INPUT for i in config.input),
            eos_id=primary,
        )
        log.info(
            "model '%s' on %s: %d layers, %d KV blocks of %d tokens (%.1f MiB), %s batching, "
            "up to %d sequences",
            spec.name,
            getattr(runner, "device", "cpu"),
            runner.shape.layers,
            settings.kv_cache_blocks,
            settings.kv_block_size,
            runner.pool.nbytes / 2**20,
            settings.batching,
            settings.max_num_seqs,
        )
        return LoadedModel(
            executors=[],
            memory_bytes=runner.pool.nbytes,
            extra={MODEL_KEY: model},
            text_generation=TextGeneration(
                chat_template=template,
                bos_token=settings.bos_token,
                eos_token=settings.eos_token,
                max_model_len=settings.max_model_len,
                tokenizer=tokenizer,
                structured_after=True,
                priority=True,
                kept_special=True,
                thinking_budget=True,
                adds_special_tokens=bool(tokenizer.encode("", True)),
            ),
        )

    def _runner(self, name: str, settings: EngineSettings) -> Runner:
        if settings.placement == "cpu":
            return StepRunner(
                settings.step_model,
                settings.kv_cache_blocks,
                settings.kv_block_size,
                settings.intra_op_threads,
                settings.allow_spinning,
            )
        if self._ge is None:
            raise ValueError("parameter placement: npu needs the GE backend, which is not running")
        gears = StepGears(
            settings.npu_batch_gears, settings.npu_chunk_gears, settings.npu_block_gears
        )
        return GeStepRunner(
            self._ge,
            name,
            settings.step_model,
            settings.kv_cache_blocks,
            settings.kv_block_size,
            gears,
            settings.max_model_len,
        )


def _check_fits(
    shape: GraphShape, settings: EngineSettings, tokenizer: Tokenizer, eos: set[int]
) -> None:
    """The tokenizer, the eos ids and max_model_len within what the step graph computes."""
    if tokenizer.vocab_size > shape.vocab:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, more than the step "
            f"model's {shape.vocab} logits"
        )
    if any(i >= shape.vocab for i in eos):
        raise ValueError(f"parameter eos_token_ids: {sorted(eos)} outside the vocabulary")
    check_positions(shape, settings.max_model_len)


def complete_interface(config: model_config_pb2.ModelConfig) -> None:
    """Triton's vLLM backend's interface and policy, for a config that lists no inputs and no
    outputs: every flag is declared, so every output but `text_output` is opt-in, as there.
    Unlike the vLLM backend, a config that lists its interface is left as it is: adding the
    flags to one written before them would make its always-sent outputs opt-in. The vLLM
    backend's `image` and `embedding_request` are left out; the engine takes neither.
    Unlike it, `input_ids` (INT32 [-1]) is declared and `text_input` is optional, so a
    prompt may come as token ids out of the box (/v1/completions' token prompts), and
    `output_ids` (opt-in, `return_output_ids`) so that /v1 can give the generated ids
    (`return_token_ids`) and count thought tokens, and `num_cached_tokens` (opt-in,
    `return_num_cached_tokens`) for /v1's cached prompt tokens."""
    if not config.input and not config.output:
        for name, data_type in INTERFACE_INPUTS:
            added = config.input.add(name=name, data_type=data_type, dims=[1])
            added.optional = True
        config.input.add(
            name=IDS_INPUT, data_type=model_config_pb2.TYPE_INT32, dims=[-1], optional=True
        )
        for name, data_type, dims in INTERFACE_OUTPUTS:
            config.output.add(name=name, data_type=data_type, dims=[dims])
    if not config.HasField("model_transaction_policy"):
        config.model_transaction_policy.decoupled = True


def _check_config(config: model_config_pb2.ModelConfig) -> None:
    if not config.model_transaction_policy.decoupled:
        raise ValueError(
            "the llm backend streams its answers: set model_transaction_policy { decoupled: true }"
        )
    if config.max_batch_size != 0:
        raise ValueError("the llm backend batches by itself: set max_batch_size: 0")
    if config.HasField("dynamic_batching") or config.HasField("sequence_batching"):
        raise ValueError(
            "the llm backend schedules itself: remove dynamic_batching / sequence_batching"
        )
    names = {i.name for i in config.input}
    if TEXT_INPUT not in names:
        raise ValueError("the config must declare input 'text_input' (TYPE_STRING, dims [1])")
    unknown = sorted(names - {TEXT_INPUT, IDS_INPUT, *OPTIONAL_INPUTS})
    if unknown:
        raise ValueError(f"the llm backend does not know input(s) {unknown}")
    outputs = {o.name for o in config.output}
    if "text_output" not in outputs:
        raise ValueError("the config must declare output 'text_output' (TYPE_STRING, dims [-1])")
    extra = sorted(outputs - set(OUTPUTS))
    if extra:
        raise ValueError(f"the llm backend does not produce output(s) {extra}; it has {OUTPUTS}")
    flags = [i for i in config.input if i.name in RETURN_FLAGS]
    for flag in flags:
        if flag.data_type != model_config_pb2.TYPE_BOOL:
            raise ValueError(f"input '{flag.name}' must be TYPE_BOOL")
    _check_ids_input(config)


def _check_ids_input(config: model_config_pb2.ModelConfig) -> None:
    """`input_ids`, where declared: integer ids in one dimension, and `text_input` optional,
    since a request carries exactly one of the two."""
    found = {i.name: i for i in config.input}
    ids = found.get(IDS_INPUT)
    if ids is None:
        return
    if ids.data_type not in _ID_TYPES or list(ids.dims) != [-1]:
        raise ValueError(f"input '{IDS_INPUT}' must be TYPE_INT32 or TYPE_INT64 with dims [-1]")
    if not found[TEXT_INPUT].optional:
        raise ValueError(
            f"input '{TEXT_INPUT}' must be optional where the config declares "
            f"'{IDS_INPUT}': a request carries one of the two, so a required "
            f"'{TEXT_INPUT}' would leave no request able to send token ids alone"
        )


def eos_primary(settings: EngineSettings, tokenizer: Tokenizer) -> int | None:
    """The primary EOS: the `eos_token`'s id (vLLM's tokenizer EOS), else the first of
    `eos_token_ids` (so a config that lists only ids keeps `stop_reason` null on its
    first, as before); None where neither names one."""
    if settings.eos_token:
        found = tokenizer.token_id(settings.eos_token)
        if found is not None:
            return found
    return settings.eos_token_ids[0] if settings.eos_token_ids else None
