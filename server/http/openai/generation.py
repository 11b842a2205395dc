"""A generative model's request, in the model contract's tensors (its responses are read
back in answers.py).

The request: `text_input` (the prompt; chat renders it first), or `input_ids` for a
completions prompt of token ids (a model that takes them has that input), and, where the model has
them, `stream`, `exclude_input_in_output` (always true: OpenAI's answers never repeat the
prompt) and `return_finish_reason` / `return_num_input_tokens` / `return_num_output_tokens`
(true). The client's
sampling parameters go where the model takes them, as Triton's OpenAI frontend sends
them to its vLLM and TensorRT-LLM backends:

- in `sampling_parameters` (JSON, vLLM's keys), the keys the `llm` engine honours there
  (`KEYS`, from backends/llm/sampling.py); a Python model gets the same JSON;
- in an input of the parameter's own name (TensorRT-LLM's interface: `temperature`,
  `top_p`, `seed`, `max_tokens`..., and `stop_words` for `stop`), whatever its key, as
  one element of the input's datatype, or a list for `stop`, `stop_token_ids`...;
- structured outputs (response_format, `structured_outputs`, a named or "required"
  tool_choice) also in TensorRT-LLM's `guided_decoding_guide_type` and
  `guided_decoding_guide` inputs (guided.py), as Triton's frontend sends a tool's schema;
- vLLM's request `priority` (not 0) in an `llm` model's `sampling_parameters`, whose
  engine orders its queue by it; any other model has no such queue, and it is left out,
  as vLLM's default policy (`fcfs`) ignores it.

A parameter the client set that reaches the model neither way is a 400 naming it, never
silently dropped; only a value that changes nothing (`presence_penalty: 0`,
`min_tokens: 0`...) is left out then. A default the client did not set (the 16 tokens of
/v1/completions) goes where the model takes `max_tokens`, and is never refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ge_serve.backends.llm.sampling import KEPT
from ge_serve.backends.llm.sampling import SPECIAL as ADD_SPECIAL
from ge_serve.backends.llm.thinking import BUDGET, END, START
from ge_serve.server.inference.model import ModelVersion, TensorSpec
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.inference.wire import object_array

from .catalog import TEXT_INPUT
from .errors import OpenAIError, unsupported
from .guided import GUIDE, GUIDE_TYPE, guide
from .logprobs import TOKEN_IDS
from .structured import AFTER
from .structured import KEY as STRUCTURED

Array = npt.NDArray[Any]

STREAM = "stream"
SAMPLING = "sampling_parameters"
SKIP_SPECIAL = "skip_special_tokens"
EXCLUDE_INPUT = "exclude_input_in_output"
MAX_TOKENS = "max_tokens"
# Where a model takes token-id prompts (then its `text_input` is optional).
INPUT_IDS = "input_ids"
# Asked of a model that has them, as Triton's frontend asks: the finish reason and the
# token counts of `usage`.
COUNT_REQUESTS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")
# Asked, with the sampling key `logprobs`, where the client asked for log probabilities.
LOGPROBS = "logprobs"
RETURN_LOGPROBS = "return_logprobs"
PROMPT_LOGPROBS = "prompt_logprobs"
RETURN_PROMPT_LOGPROBS = "return_prompt_logprobs"
# Asked where /v1 reads the generated ids (`return_token_ids`, thought counts).
RETURN_OUTPUT_IDS = "return_output_ids"
# vLLM's request priority (text.add_priority), for the `llm` engine only.
PRIORITY = "priority"
# Asked where /v1 reports the prompt tokens found cached (`prompt_tokens_details`).
RETURN_NUM_CACHED = "return_num_cached_tokens"


def takes_constraints(inputs: Mapping[str, TensorSpec]) -> bool:
    """Whether a model's answer can be constrained (structured outputs): it takes vLLM's
    sampling keys, or TensorRT-LLM's guided decoding inputs."""
    return SAMPLING in inputs or GUIDE_TYPE in inputs


@dataclass(frozen=True, slots=True)
class Key:
    """How one sampling parameter reaches a model."""

    # The `llm` engine honours it in `sampling_parameters`.
    engine: bool
    # The values that change nothing, left out for a model that cannot take them.
    neutral: tuple[Any, ...] = ()
    # TensorRT-LLM's name for its input, where it is not the key itself.
    input: str | None = None


KEYS: dict[str, Key] = {
    MAX_TOKENS: Key(engine=True),
    "temperature": Key(engine=True),
    "top_p": Key(engine=True),
    "top_k": Key(engine=True),
    "seed": Key(engine=True),
    "stop": Key(engine=True, neutral=([],), input="stop_words"),
    "ignore_eos": Key(engine=True, neutral=(False,)),
    "min_tokens": Key(engine=True, neutral=(0,)),
    "stop_token_ids": Key(engine=True, neutral=([],)),
    "include_stop_str_in_output": Key(engine=True, neutral=(False,)),
    SKIP_SPECIAL: Key(engine=True, neutral=(True,)),
    # ge-serve's: a parser's special tokens kept in the text (keep_special_tokens).
    KEPT: Key(engine=True),
    # Chat's `top_logprobs` (with `logprobs`), completions' `logprobs`: vLLM's key.
    LOGPROBS: Key(engine=True),
    # vLLM's, and completions' `echo` with `logprobs`.
    PROMPT_LOGPROBS: Key(engine=True),
    # vLLM's: the `logprobs` entries hold these ids in place of the top N.
    TOKEN_IDS: Key(engine=True),
    # vLLM's logits processors (backends/llm/logits.py); `logit_bias` is OpenAI's map.
    "presence_penalty": Key(engine=True, neutral=(0,)),
    "frequency_penalty": Key(engine=True, neutral=(0,)),
    "repetition_penalty": Key(engine=True, neutral=(1,)),
    "min_p": Key(engine=True, neutral=(0,)),
    "logit_bias": Key(engine=True, neutral=({},)),
    "bad_words": Key(engine=True, neutral=([],)),
    "allowed_token_ids": Key(engine=True),
    # response_format, structured_outputs and guided_* (structured.py): one JSON text.
    STRUCTURED: Key(engine=True),
    # With --reasoning-parser: the grammar waits for the end of the thoughts.
    AFTER: Key(engine=True),
    # vLLM's thinking budget, and the thoughts' markers with it (thinking.py).
    BUDGET: Key(engine=True),
    START: Key(engine=True),
    END: Key(engine=True),
    # Not implemented by the engine (it takes them only at these values).
    "length_penalty": Key(engine=False, neutral=(1,)),
    "use_beam_search": Key(engine=False, neutral=(False,)),
    "spaces_between_special_tokens": Key(engine=False, neutral=(True,)),
    "truncate_prompt_tokens": Key(engine=False),
}


class Tagged(Protocol):
    """A request's parser plan (tools.ToolUse, reasoning.Reasoning) that reads special
    tokens in the answer's text."""

    def kept_special_tokens(self) -> tuple[str, ...]: ...


def keep_special_tokens(
    model: ModelVersion, given: dict[str, Any], *parsers: Tagged | None
) -> None:
    """The special tokens `parsers` read kept in the answer's text: the `llm` engine's
    `kept_special_tokens` (the others still skipped, as vLLM's decoding of
    mistral-common's tokenizer skips them); for another model that takes
    `sampling_parameters` (Triton's vLLM backend's interface), vLLM's own rule for a
    tokenizer other than mistral-common's: `skip_special_tokens` false. A model of its
    own writes its text as it will; no parser that reads any changes nothing."""
    tokens = [t for parser in parsers if parser is not None for t in parser.kept_special_tokens()]
    if not tokens or SAMPLING not in model.inputs:
        return
    generation = model.loaded.text_generation
    if generation is not None and generation.kept_special:
        given[KEPT] = [*dict.fromkeys(tokens)]
    else:
        given[SKIP_SPECIAL] = False


def build_request(
    model: ModelVersion,
    prompt: str | Array,
    stream: bool,
    given: Mapping[str, Any],
    default_max_tokens: int | None = None,
    ids: bool = False,
    cached: bool = False,
    chat: bool = False,
    special: bool | None = None,
) -> tuple[InferRequest, frozenset[str]]:
    """The request for `model`, and the parameters it passes on. `given`: the sampling
    parameters the client set, by vLLM's keys (`Sampling.sampling`); `prompt`, text or
    token ids (`ids_array`'s, for `input_ids`); `ids`: the generated ids are read;
    `cached`: the prompt's cached tokens are; `chat`: the prompt is a chat template's,
    which writes the special tokens the tokenizer would add (its BOS); `special`: the
    client's `add_special_tokens` (None: vLLM's default, false for a chat)."""
    inputs = model.inputs
    if isinstance(prompt, str):
        tensors = [_tensor(model, inputs[TEXT_INPUT], [prompt])]
    else:
        tensors = [_tensor(model, ids_input(model), prompt, "prompt")]
    for name, value in ((STREAM, stream), (EXCLUDE_INPUT, True)):
        if name in inputs:
            tensors.append(_tensor(model, inputs[name], [value]))
    # The log probabilities' field: `logprobs`, or vLLM's ids that stand in its place.
    wanted = next((key for key in (LOGPROBS, TOKEN_IDS) if key in given), None)
    asked = (*COUNT_REQUESTS, RETURN_LOGPROBS) if wanted else COUNT_REQUESTS
    asked = (*asked, RETURN_OUTPUT_IDS) if ids else asked
    asked = (*asked, RETURN_NUM_CACHED) if cached else asked
    if PROMPT_LOGPROBS in given:
        asked = (*asked, RETURN_PROMPT_LOGPROBS)
        if PROMPT_LOGPROBS not in model.outputs:
            raise unsupported(
                PROMPT_LOGPROBS,
                f"The model '{model.name}' gives no prompt log probabilities: it has no "
                f"'{PROMPT_LOGPROBS}' output",
            )
    for name in asked:
        if name in inputs and inputs[name].datatype is DataType.BOOL:
            tensors.append(_tensor(model, inputs[name], [True]))
    if wanted is not None and LOGPROBS not in model.outputs:
        raise unsupported(
            wanted,
            f"The model '{model.name}' gives no log probabilities: it has no '{LOGPROBS}' output",
        )
    document: dict[str, Any] = {}
    sent: set[str] = set()
    values = dict(given)
    _special_tokens(model, chat, special, document)
    if values.pop(PRIORITY, 0) and _ranks(model):
        # Any other model has no queue ordered by it: ignored, as vLLM's `fcfs` ignores it.
        document[PRIORITY] = given[PRIORITY]
        sent.add(PRIORITY)
    defaulted = MAX_TOKENS not in values and default_max_tokens is not None
    if defaulted:
        values[MAX_TOKENS] = default_max_tokens
    for key, value in values.items():
        rule = KEYS[key]
        name = rule.input or key
        placed = False
        if name in inputs and value != []:
            tensors.append(_tensor(model, inputs[name], value, key))
            placed = True
        if key == STRUCTURED and GUIDE_TYPE in inputs:
            tensors += _guided(model, value)
            placed = True
        if SAMPLING in inputs and rule.engine:
            document[key] = value
            placed = True
        if placed:
            sent.add(key)
        elif not (defaulted and key == MAX_TOKENS) and value not in rule.neutral:
            raise _refusal(model, key, rule)
    if document:
        text = json.dumps(document)
        tensors.append(_tensor(model, inputs[SAMPLING], [text]))
    request = InferRequest(model_name=model.name, model_version=model.version_str, inputs=tensors)
    return request, frozenset(sent)


def add_special(special: bool | None, chat: bool) -> bool:
    """vLLM's `add_special_tokens`: the client's, else its route's default (false for a
    chat, whose template writes them; true for a completion)."""
    return not chat if special is None else special


def _special_tokens(
    model: ModelVersion, chat: bool, special: bool | None, document: dict[str, Any]
) -> None:
    """`add_special_tokens` false in the `llm` engine's `sampling_parameters`, where its
    tokenizer adds any and the request (or its route) says false; another model
    tokenizes as it does, so only the default is taken."""
    generation = model.loaded.text_generation
    adds = None if generation is None else generation.adds_special_tokens
    if SAMPLING in model.inputs and adds is not None:
        if adds and not add_special(special, chat):
            document[ADD_SPECIAL] = False
    elif special is not None and special == chat:
        only = json.dumps(not chat)
        raise unsupported(
            ADD_SPECIAL, f"'{ADD_SPECIAL}' is not supported: only {only} (the default)"
        )


def after_thoughts(model: ModelVersion, field: str) -> None:
    """With --reasoning-parser, structured outputs wait for the end of the thoughts, which
    the server tells the model in its `sampling_parameters` (key `AFTER`, the `llm`
    engine's own). Any other model would constrain the thoughts too (TensorRT-LLM's guided
    inputs), or fail on the unknown key (a Python model on Triton's vLLM backend's
    interface builds vLLM's SamplingParams from the JSON): a 400 on `field`."""
    generation = model.loaded.text_generation
    if SAMPLING not in model.inputs or generation is None or not generation.structured_after:
        raise unsupported(
            field,
            f"Structured outputs with --reasoning-parser need a model of the 'llm' backend, "
            f"whose '{SAMPLING}' the server tells to constrain the answer after its thoughts "
            f"('{AFTER}'): the model '{model.name}' is not one",
        )


def _ranks(model: ModelVersion) -> bool:
    """Whether the model's `sampling_parameters` take the `llm` engine's `priority`."""
    generation = model.loaded.text_generation
    return SAMPLING in model.inputs and generation is not None and generation.priority


def ids_array(model: ModelVersion, ids: list[int]) -> Array:
    """A token-id prompt in the dtype of the model's `input_ids`; its ids were checked
    (prompts.form: integers in [0, 2**31)), so no value is outside that dtype."""
    return np.asarray(ids, ids_input(model).datatype.numpy)


def ids_input(model: ModelVersion) -> TensorSpec:
    """The model's `input_ids` (INT32 or INT64, dims [-1]), which takes token-id prompts
    in place of `text_input`."""
    spec = model.inputs.get(INPUT_IDS)
    if spec is None or spec.datatype not in (DataType.INT32, DataType.INT64):
        raise unsupported(
            "prompt",
            f"Token-id prompts need a model with an '{INPUT_IDS}' input (INT32 or INT64): "
            f"the model '{model.name}' has none. Give the prompt as text",
        )
    return spec


def _guided(model: ModelVersion, structured: str) -> list[Tensor]:
    """TensorRT-LLM's guided decoding inputs for the constraint (guided.py)."""
    kind, text = guide(structured, model.name)
    tensors = [_tensor(model, model.inputs[GUIDE_TYPE], [kind])]
    if text is not None:
        if GUIDE not in model.inputs:
            raise unsupported(
                STRUCTURED,
                f"The model '{model.name}' has a '{GUIDE_TYPE}' input but no '{GUIDE}' "
                f"input for the {kind} constraint",
            )
        tensors.append(_tensor(model, model.inputs[GUIDE], [text]))
    return tensors


def _refusal(model: ModelVersion, key: str, rule: Key) -> OpenAIError:
    name = rule.input or key
    if SAMPLING in model.inputs:
        only = f": only {json.dumps(rule.neutral[0])} (the default)" if rule.neutral else ""
        return unsupported(
            key,
            f"'{key}' is not supported{only}. The model '{model.name}' has no '{name}' "
            f"input, and its '{SAMPLING}' take only the keys the llm engine implements",
        )
    return unsupported(
        key,
        f"The model '{model.name}' takes no sampling parameter '{key}': it has neither a "
        f"'{SAMPLING}' input nor a '{name}' input",
    )


def _tensor(model: ModelVersion, spec: TensorSpec, value: Any, param: str | None = None) -> Tensor:
    """`value` (a list: its elements) as `spec` wants it: shaped to its dims (a batch of
    one when the model batches; a list along its variable dimension), in its datatype.
    `param` names the client's parameter the value is, for the errors that are the
    client's (a value past the datatype's range)."""
    items = value if isinstance(value, (list, np.ndarray)) else [value]
    lead = (1,) if model.max_batch_size > 0 else ()
    dims = [1 if d < 0 else d for d in spec.dims]
    variable = [i for i, d in enumerate(spec.dims) if d < 0]
    if len(items) != 1 and variable:
        dims[variable[-1]] = len(items)
    shape = lead + tuple(dims)
    if int(np.prod(shape)) != len(items):
        if len(items) == 1 or param is None:
            raise _not_the_contract(model, spec, f"is not one element (dims {list(spec.dims)})")
        raise OpenAIError(
            f"The model '{model.name}' takes {int(np.prod(shape))} value(s) for '{param}' "
            f"(its input '{spec.name}' has dims {list(spec.dims)}), not {len(items)}",
            param=param,
        )
    array = _array(model, spec, items, param)
    return Tensor(spec.name, spec.datatype, shape, array.reshape(shape))


def _array(model: ModelVersion, spec: TensorSpec, items: Any, param: str | None) -> Any:
    datatype = spec.datatype
    if isinstance(items, np.ndarray):
        return items  # ids_array's: checked, in the input's dtype
    if datatype is DataType.BYTES:
        texts = [item if isinstance(item, str) else json.dumps(item) for item in items]
        return object_array([text.encode("utf-8") for text in texts])
    dtype = datatype.numpy
    if datatype is DataType.BOOL:
        if not all(isinstance(item, bool) for item in items):
            raise _not_the_contract(model, spec, f"is {datatype.value}, not a number")
        return np.array(items, dtype)
    if param is not None and any(isinstance(item, bool) for item in items):
        raise _not_the_contract(model, spec, f"is {datatype.value}, not BOOL")
    if dtype.kind in "iu":
        if not all(isinstance(item, int) for item in items):
            raise _not_the_contract(model, spec, f"is {datatype.value}, not a float")
        bounds = np.iinfo(dtype)
        outside = [item for item in items if not bounds.min <= item <= bounds.max]
        if outside:
            raise OpenAIError(
                f"Invalid value for '{param}': {outside[0]} is outside the range of the model "
                f"'{model.name}' input '{spec.name}' ({datatype.value}: {bounds.min} to "
                f"{bounds.max})",
                param=param,
            )
    return np.array(items).astype(dtype)


def _not_the_contract(model: ModelVersion, spec: TensorSpec, what: str) -> OpenAIError:
    return OpenAIError(
        f"The model '{model.name}' input '{spec.name}' {what}: it does not follow the "
        "generative model contract",
        status=500,
        kind="server_error",
    )
