"""Structured outputs (vLLM's `structured_outputs` sampling key, served as its "guidance"
backend serves it) in the generation engine. The tiny model's weights are random, so
only the constraint shapes what it writes: each answer must be what the grammar allows.
Driven in process, as tests/component/test_generation_min_tokens.py."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.backends.llm.structured import Grammars, Structured
from ge_serve.backends.llm.text import Tokenizer
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(120)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
}


def load(tmp_path: Path, **parameters: str) -> GenerationScheduler:
    folder = llmrepo.write_tiny_llm(tmp_path, "m", parameters=parameters)
    return llmrepo.engine_of(folder)


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[GenerationScheduler]:
    built = load(tmp_path)
    yield built
    await built.close(1)


async def generate(
    scheduler: GenerationScheduler, structured: Any, stream: bool = False, **sampling: Any
) -> tuple[str, list[int], str]:
    """The answer's text (the deltas joined when streamed), its tokens, its finish reason."""
    sink = RecordingSink()
    inputs = {
        "text_input": np.array([b"Answer:"], dtype=object),
        "exclude_input_in_output": np.array([True]),
        "stream": np.array([stream]),
        "sampling_parameters": np.array(
            [json.dumps({"structured_outputs": structured, "max_tokens": 120, **sampling})],
            dtype=object,
        ),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final(20)
    assert not sink.errors, sink.errors
    text = "".join(r["text_output"][0].decode() for r in sink.responses)
    ids = [int(i) for r in sink.responses for i in r["output_ids"]]
    return text, ids, sink.responses[-1]["finish_reason"][0].decode()


async def refused(scheduler: GenerationScheduler, structured: Any) -> str:
    with pytest.raises(ServerError) as caught:
        await generate(scheduler, structured)
    assert caught.value.code is ErrorCode.INVALID_ARG
    return caught.value.message


async def test_choice_answers_one_of_the_choices(scheduler: GenerationScheduler) -> None:
    choices = ["yes", "no", "maybe not"]
    for seed in range(4):
        text, _, reason = await generate(scheduler, {"choice": choices}, seed=seed)
        assert (text in choices, reason) == (True, "stop"), text


async def test_regex_answer_matches(scheduler: GenerationScheduler) -> None:
    pattern = r"[a-c]{2,5}-\d{3}"
    for seed in range(4):
        text, _, reason = await generate(scheduler, {"regex": pattern}, seed=seed)
        assert re.fullmatch(pattern, text) and reason == "stop", text


async def test_json_schema_answer_parses_and_validates(scheduler: GenerationScheduler) -> None:
    for seed in range(3):
        text, _, reason = await generate(
            scheduler,
            {"json": SCHEMA, "disable_any_whitespace": True, "disable_additional_properties": True},
            seed=seed,
        )
        doc = json.loads(text)
        assert reason == "stop"
        assert isinstance(doc["name"], str) and len(doc["name"]) <= 6
        assert isinstance(doc["age"], int) and 0 <= doc["age"] <= 120
        assert isinstance(doc["ok"], bool)


# One optional property: the random model, free to write others, opens a key of its own
# at once and seldom ends it (tests/unit/test_structured_strict.py shows the grammar).
OPTIONAL = {"type": "object", "properties": {"a": {"type": "boolean"}}}


async def test_a_schema_allows_only_the_properties_it_declares(
    scheduler: GenerationScheduler,
) -> None:
    """vLLM's default backend (xgrammar, strict_mode) refuses undeclared properties where
    the schema does not say `additionalProperties`; Triton's frontend sends
    `disable_additional_properties: false`, which changes nothing."""
    for structured in (
        {"json": OPTIONAL},
        {"json": OPTIONAL, "disable_additional_properties": False},
    ):
        for seed in range(6):
            text, _, reason = await generate(scheduler, structured, seed=seed, max_tokens=80)
            assert reason == "stop" and set(json.loads(text)) <= {"a"}, (seed, text)
    # A schema that allows others keeps its word: this seed writes a key of its own.
    text, _, reason = await generate(
        scheduler, {"json": {**OPTIONAL, "additionalProperties": True}}, seed=6, max_tokens=80
    )
    assert reason == "stop" and set(json.loads(text)) - {"a"}, text


async def test_json_object_answer_is_an_object(scheduler: GenerationScheduler) -> None:
    # The random model's strings seldom end (a quote is one of hundreds of tokens the
    # grammar allows there): seeds whose answer ends within the limit, one with a key.
    for seed in (5, 6):
        text, _, reason = await generate(
            scheduler, {"json_object": True}, seed=seed, max_tokens=150
        )
        assert reason == "stop" and isinstance(json.loads(text), dict), text


async def test_triton_style_json_text_and_streaming(scheduler: GenerationScheduler) -> None:
    # Triton's OpenAI frontend sends json.dumps(asdict(StructuredOutputsParams(...))):
    # a JSON text with every field, the unused ones null, and vLLM's private ones.
    sent = {
        "json": None, "regex": r"(ab|cd){3}", "choice": None, "grammar": None,
        "json_object": None, "disable_any_whitespace": False,
        "disable_additional_properties": False, "whitespace_pattern": None,
        "structural_tag": None, "_backend": None, "_backend_was_auto": False,
    }  # fmt: skip
    text, ids, reason = await generate(scheduler, json.dumps(sent), stream=True, seed=3)
    assert re.fullmatch(r"(ab|cd){3}", text) and reason == "stop", text
    assert len(ids) == 7 and ids[-1] == llmrepo.tiny_model().eos_id


async def test_grammar(scheduler: GenerationScheduler) -> None:
    grammar = 'start: "(" num ("+" num)* ")"\nnum: /[0-9]{1,2}/'
    text, _, reason = await generate(scheduler, {"grammar": grammar}, seed=1)
    assert re.fullmatch(r"\(\d{1,2}(\+\d{1,2})*\)", text) and reason == "stop", text


async def test_xgrammars_structural_tag(scheduler: GenerationScheduler) -> None:
    # A thought of at most 12 characters, then the answer's fixed words and an integer.
    fmt = {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<t>", "content": {"type": "any_text", "max_chars": 12},
         "end": "</t>"},
        {"type": "const_string", "value": " = "},
        {"type": "json_schema", "json_schema": {"type": "integer"}},
    ]}  # fmt: skip
    tag = {"type": "structural_tag", "format": fmt}
    for seed in (1, 2, 3):
        text, _, reason = await generate(scheduler, {"structural_tag": tag}, seed=seed)
        assert re.fullmatch(r"<t>(?s:.){0,12}</t> = -?\d+", text) and reason == "stop", text
    # A token string is the model's: checked once the engine has its tokenizer.
    unknown = {"type": "structural_tag", "format": {"type": "token", "token": "<none>"}}
    assert 'Token string "<none>" not found' in await refused(
        scheduler, {"structural_tag": unknown}
    )


async def test_bad_constraints_are_invalid_arg(scheduler: GenerationScheduler) -> None:
    assert "regex" in (await refused(scheduler, {"regex": "(["})).lower()
    assert "Invalid type: foo" in await refused(scheduler, {"json": {"type": "foo"}})
    assert await refused(scheduler, {"json": "{bad"}) == "Invalid JSON grammar specification."
    assert (await refused(scheduler, {"regex": "a", "choice": ["a"]})).startswith(
        "You can only use one kind of structured outputs constraint"
    )
    assert (await refused(scheduler, {"disable_any_whitespace": True})).startswith(
        "You must use one kind of structured outputs constraint"
    )
    assert await refused(scheduler, {"choice": []}) == "Choice '[]' cannot be an empty list"
    assert "unknown key" in await refused(scheduler, {"regex": "a", "jsn": {}})
    assert "triggers must be a list" in await refused(scheduler, {"structural_tag": "{}"})
    assert "not valid JSON" in await refused(scheduler, "{")
    # The engine still serves.
    assert (await generate(scheduler, {"choice": ["z"]}))[0] == "z"


async def test_finished_grammar_against_min_tokens_and_ignore_eos(
    scheduler: GenerationScheduler,
) -> None:
    eos, ab_ids = llmrepo.tiny_model().eos_id, llmrepo.prompt_ids("ab")
    # The grammar is complete after "ab": only the EOS may follow, which min_tokens
    # bans: nothing is left, and the answer ends there.
    assert await generate(scheduler, {"choice": ["ab"]}, min_tokens=5) == (
        "ab", ab_ids, "stop",
    )  # fmt: skip
    # With ignore_eos the EOS does not end it: EOS follows EOS to the limit, as in vLLM.
    assert await generate(scheduler, {"choice": ["ab"]}, ignore_eos=True, max_tokens=5) == (
        "ab", [*ab_ids, eos, eos, eos], "length",
    )  # fmt: skip


async def test_grammars_survive_preemption(tmp_path: Path) -> None:
    # Eight answers of 41 tokens and their prompts need 48 blocks of 8; there are 16, so
    # sequences are preempted and prefilled again, their grammar state kept as it was.
    scheduler = load(tmp_path, kv_cache_blocks="16", max_model_len="128")
    try:
        pattern = r"[a-z]{40}"
        answers = await asyncio.gather(
            *(generate(scheduler, {"regex": pattern}, seed=seed) for seed in range(8))
        )
        assert scheduler.generation_stats.preemptions > 0
        for text, _, reason in answers:
            assert re.fullmatch(pattern, text) and reason == "stop", text
    finally:
        await scheduler.close(1)


# A schema whose optional properties outgrow llguidance's parser (its 2,000 items a row)
# once the answer opens a key: it compiles, and fails only as the answer is written.
WIDE = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(520)}}


async def test_a_grammar_that_outgrows_the_parser_fails_its_request_briefly(
    scheduler: GenerationScheduler,
) -> None:
    """The request's own grammar, not the server: INVALID_ARG with llguidance's first
    line, not its parser state and the whole grammar; other requests go on."""
    sink = RecordingSink()
    inputs = {
        "text_input": np.array([b"Answer:"], dtype=object),
        "exclude_input_in_output": np.array([True]),
        "sampling_parameters": np.array(
            [json.dumps({"structured_outputs": {"json": WIDE}, "max_tokens": 60, "seed": 3})],
            dtype=object,
        ),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final(20)
    (error,) = sink.errors
    assert error.code == ErrorCode.INVALID_ARG.value, error
    assert "max is 2000" in error.message and len(error.message) < 400, error.message
    text, _, reason = await generate(scheduler, {"choice": ["yes", "no"]})
    assert (text in ("yes", "no"), reason) == (True, "stop")


async def test_a_schema_is_compiled_once_for_requests_that_repeat_it(
    scheduler: GenerationScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application sends its schema with every request (and n choices n times): the
    compiled grammar is kept, each request gets its own state from it."""
    compiled = []
    original = Grammars._compiled_matcher

    def counting(self: Grammars, structured: Structured) -> Any:
        compiled.append(structured.kind)
        return original(self, structured)

    monkeypatch.setattr(Grammars, "_compiled_matcher", counting)
    compact = {
        "json": SCHEMA,
        "disable_any_whitespace": True,
        "disable_additional_properties": True,
    }
    answers = [await generate(scheduler, compact, seed=seed) for seed in range(3)]
    assert compiled == ["json"]
    for text, _, reason in answers:
        assert reason == "stop" and set(json.loads(text)) == {"name", "age", "ok"}, text


async def test_a_slow_compile_leaves_other_requests_work_alone(
    scheduler: GenerationScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grammars compile on a thread of their own: while one compiles (held here), the
    event loop's default executor, where other requests' long prompts are tokenized and
    large bodies read, stays free (given one worker here, as a busy server's would be)."""
    release = threading.Event()
    original = Grammars._compiled_matcher

    def held(self: Grammars, structured: Structured) -> Any:
        release.wait(30)
        return original(self, structured)

    monkeypatch.setattr(Grammars, "_compiled_matcher", held)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    try:
        slow = asyncio.create_task(generate(scheduler, {"regex": "[ab]{3}"}))
        await asyncio.sleep(0.2)  # its compile holds a thread
        free = await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), 20)
        assert free == "free" and not slow.done()
    finally:
        release.set()
    text, _, reason = await slow
    assert re.fullmatch("[ab]{3}", text) and reason == "stop", text


async def test_a_schema_nested_past_the_bound_is_refused(scheduler: GenerationScheduler) -> None:
    """Copying and walking a schema 600 levels deep would recurse past Python's limit: a
    clear INVALID_ARG, not a RecursionError's 500."""
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(600):
        deep = {"type": "array", "items": deep}
    message = await refused(scheduler, {"json": deep, "disable_additional_properties": True})
    assert "nested more than 128 levels" in message


async def test_the_first_grammar_build_leaves_the_event_loop_free(
    scheduler: GenerationScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the model's grammar tokenizer is being built (held here for 2 s), a second
    constrained request (n choices send several at once) waits off the loop: the loop
    goes on turning."""
    original = Tokenizer.to_json

    def slow(self: Tokenizer) -> str:
        time.sleep(2)
        return original(self)

    monkeypatch.setattr(Tokenizer, "to_json", slow)
    first = asyncio.create_task(generate(scheduler, {"regex": "[ab]{3}"}))
    await asyncio.sleep(0.3)  # the build has begun
    second = asyncio.create_task(generate(scheduler, {"regex": "[ab]{3}"}))
    started = time.monotonic()
    await asyncio.sleep(0.05)
    assert time.monotonic() - started < 1.0
    for text, _, reason in await asyncio.gather(first, second):
        assert re.fullmatch("[ab]{3}", text) and reason == "stop", text
