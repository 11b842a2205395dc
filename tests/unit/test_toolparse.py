"""The tool-call parsers of `--tool-call-parser` (server/http/openai/toolparse.py): the
formats of Triton's OpenAI front end's and vLLM's parsers, whole and streamed."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from ge_serve.server.http.openai import toolstream
from ge_serve.server.http.openai.toolparse import Stream, parse


def _named(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [
        (
            "llama3",
            '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {}}',
            None,
            [("f", {"a": 1}), ("g", {})],
        ),
        ("llama3_json", '{"name": "f", "arguments": {"a": "b"}}', None, [("f", {"a": "b"})]),
        ("llama3", 'Hi {"name": "f"}', 'Hi {"name": "f"}', []),
        # Triton's parse_tool_calls: a call only where the answer begins with one.
        (
            "llama3",
            'Sure. <|python_tag|>{"name": "f", "arguments": {}}',
            'Sure. <|python_tag|>{"name": "f", "arguments": {}}',
            [],
        ),
        ("llama3", ' {"name": "f", "arguments": {}}', ' {"name": "f", "arguments": {}}', []),
        ("llama3", '{"name": "f", "arguments": {', '{"name": "f", "arguments": {', []),
        (
            "mistral",
            'Sure [TOOL_CALLS][{"name": "w", "arguments": {"city": "é"}}]',
            "Sure ",
            [("w", {"city": "é"})],
        ),
        ("mistral", '[{"name": "w", "arguments": {}}]', None, [("w", {})]),
        ("mistral", "[not json", "[not json", []),
        (
            "hermes",
            'ok <tool_call>\n{"name": "w", "arguments": {"c": 1}}\n</tool_call>',
            "ok ",
            [("w", {"c": 1})],
        ),
        ("hermes", "plain text", "plain text", []),
        # vLLM's granite: 3.0's token or 3.1's tag (or none) first, then the array.
        (
            "granite",
            '<|tool_call|>[{"name": "w", "arguments": {"city": "é"}}, {"name": "v", '
            '"arguments": {}}]',
            None,
            [("w", {"city": "é"}), ("v", {})],
        ),
        ("granite", ' <tool_call> [{"name": "w", "arguments": {}}]', None, [("w", {})]),
        ("granite", '[{"name": "w", "arguments": {"n": 1}}]', None, [("w", {"n": 1})]),
        (
            "granite",
            'Sure. <tool_call>[{"name": "w", "arguments": {}}]',
            'Sure. <tool_call>[{"name": "w", "arguments": {}}]',
            [],
        ),
        ("granite", '<tool_call>{"name": "w"}', '<tool_call>{"name": "w"}', []),
        (
            "phi4_mini_json",
            'Let me. functools[{"name": "w", "arguments": {"d": [1, 2]}}, '
            '{"name": "v", "parameters": {}}]',
            "Let me. ",
            [("w", {"d": [1, 2]}), ("v", {})],
        ),
        ("phi4_mini_json", "functools are useful", "functools are useful", []),
        # Python's functools before the call is no call; text after the array is ignored.
        (
            "phi4_mini_json",
            'Use functools.partial. functools[{"name": "w", "arguments": {}}] done',
            "Use functools.partial. ",
            [("w", {})],
        ),
    ],
)
def test_whole_answers(
    parser: str, text: str, content: str | None, calls: list[tuple[str, Any]]
) -> None:
    found_content, found = parse(parser, text)
    assert found_content == content and _named(found) == calls
    assert all(c["type"] == "function" and c["id"] for c in found)


def _streamed(parser: str, text: str, size: int, limit: int = 1 << 17) -> list[dict[str, Any]]:
    stream = Stream(parser, limit)
    deltas = []
    for start in range(0, len(text), size):
        deltas += stream.feed(text[start : start + size])
    return deltas + stream.finish()


def test_a_stream_holds_what_may_begin_a_call() -> None:
    deltas = _streamed("hermes", 'Sure: <tool_call>{"name": "w", "arguments": {}}</tool_call>', 3)
    content = "".join(d.get("content", "") for d in deltas)
    assert content == "Sure: "
    first, *rest = [c for d in deltas for c in d.get("tool_calls", ())]
    assert first["function"] == {"name": "w", "arguments": ""}
    assert "".join(c["function"]["arguments"] for c in rest) == "{}"


def test_a_stream_of_text_is_content() -> None:
    text = "Hello [TOOL_ but not a call"
    deltas = _streamed("mistral", text, 4)
    assert "".join(d["content"] for d in deltas) == text


def test_a_stream_past_its_limit_is_truncated() -> None:
    stream = Stream("mistral", 16)
    assert stream.feed('[TOOL_CALLS][{"name"') == []
    assert stream.truncated and stream.finish() == []


# Answers of each format: calls, text around them, broken calls, and text that only
# looks like the start of a tag.
ANSWERS = {
    "llama3": [
        '<|python_tag|>{"name": "f", "arguments": {"a": 1}}; {"name": "g", "parameters": {}}',
        '{"name": "f", "parameters": {"city": "Zürich", "n": 1e2}}',
        '{"name": "f", "arguments": {}}',
        'Sure. <|python_tag|>{"name": "f", "arguments": {}}',
        "<|python_ta and text",
        '{"a": 1} tail',
    ],
    "mistral": [
        'Sure [TOOL_CALLS][{"name": "w", "arguments": {"c": "é"}}]',
        '[TOOL_CALLS] [ {"name": "w", "arguments": {"c": 1}} , {"name": "v", "arguments": {}}]',
        '\n [TOOL_CALLS][{"name": "w", "arguments": {}}]',
        '[{"name": "w", "arguments": {}}]',
        'x [TOOL_CALLS] [{"name": "w", "arguments": {}}] tail',
        "[TOOL_CALLS] not json",
        "[1, 2] and [TOOL_ but not a call",
        'x [TOOL_CALLS]f[ARGS]{"a": [1, {"b": "}"}]} tail [TOOL_CALLS]g{}',
        "[TOOL_CALLS]f [CALL_ID]abcdefghi[ARGS] {}",
        "[TOOL_CALLS]  toolname_no_args [TOOL_",
    ],
    "hermes": [
        'ok <tool_call>{"name": "w", "arguments": {"c": 1}}</tool_call>',
        ' <tool_call>{"name": "w", "arguments": {}}</tool_call><tool_call>{"name": "v"}',
        '<tool_call>\n{"arguments":{"a":[1.50,"\\u00e9\\n\\ud83d\\ude00"],"b":null},"name":"w"}\n',
        "<tool_call>{broken</tool_call>",
        "<tool and plain text",
    ],
    "granite": [
        '<|tool_call|>[{"name": "w", "arguments": {"c": "é"}}, {"name": "v", "arguments": {}}]',
        ' \n<tool_call> [ {"name": "w", "arguments": {"c": 1}} ]',
        '<|tool_call|><tool_call>[{"arguments":{"a":[1.50,null]},"name":"w"}]',
        '[{"name": "w", "arguments": {}}]',
        "Sure, <tool_call>[] is nothing",
        "<tool_ca and plain text",
        "[1, 2] is a list",
    ],
    "phi4_mini_json": [
        'functools[{"name": "w", "arguments": {"c": "é", "d": [1]}}]',
        'Sure: functools[ {"name": "w", "parameters": {}} , {"name": "v", "arguments": {}} ]',
        'functools.reduce, then functools[{"name": "w", "arguments": {}}]',
        "functools[not json",
        "funct and plain text",
    ],
}


def _splits(text: str) -> list[list[str]]:
    """Every split of `text` into at most three pieces, and into pieces of each size."""
    found = [[text]]
    for i in range(1, len(text)):
        found.append([text[:i], text[i:]])
        found += [[text[:i], text[i:j], text[j:]] for j in range(i + 1, len(text))]
    for size in range(1, 9):
        found.append([text[at : at + size] for at in range(0, len(text), size)])
    return found


@pytest.mark.parametrize(
    ("parser", "text"), [(p, t) for p, texts in ANSWERS.items() for t in texts]
)
def test_streamed_deltas_are_the_whole_answer(parser: str, text: str) -> None:
    content, calls = parse(parser, text)
    for pieces in _splits(text):
        stream = Stream(parser, 1 << 17)
        deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
        streamed = "".join(d.get("content", "") for d in deltas)
        assert streamed == (content or ""), pieces
        assert _joined(deltas) == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls
        ]


def _joined(deltas: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each streamed call's name and its arguments joined, checking that each call's
    first delta names it (index, id, type, name and arguments) and the next ones add to
    its arguments only."""
    calls: list[tuple[str, str]] = []
    for found in (c for d in deltas for c in d.get("tool_calls", ())):
        if "id" in found:
            assert found["index"] == len(calls) and found["type"] == "function"
            assert set(found["function"]) == {"name", "arguments"}
            calls.append((found["function"]["name"], found["function"]["arguments"]))
        else:
            assert set(found) == {"index", "function"} and found["index"] == len(calls) - 1
            assert set(found["function"]) == {"arguments"}
            name, arguments = calls[-1]
            calls[-1] = (name, arguments + found["function"]["arguments"])
    return calls


# Mistral's tokenizer v11+ models (Small 3.2, Magistral, Devstral): vLLM's mistral parser
# reads `[TOOL_CALLS]name[ARGS]{...}` for each call; the arguments as the model wrote them.
NAMED = [
    (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        None,
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        'Sure.\n[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}',
        "Sure.\n",
        [("add", '{"a": 3.5, "b": 4}'), ("multiply", '{"a": 3, "b": 6}')],
    ),
    (
        '[TOOL_CALLS] plan [ARGS] {"trip": {"to": "Zürich 中 😀", "legs": [{"by": "train"}]},'
        ' "note": "a \\"}{ [TOOL_CALLS] \\u00e9"}',
        None,
        [
            (
                "plan",
                '{"trip": {"to": "Zürich 中 😀", "legs": [{"by": "train"}]},'
                ' "note": "a \\"}{ [TOOL_CALLS] \\u00e9"}',
            )
        ],
    ),
    # vLLM's `name{...}` (no [ARGS]); text after the arguments dropped (vLLM's gh#48975).
    ('[TOOL_CALLS]f{"x": 1}Estimating the weather...', None, [("f", '{"x": 1}')]),
    # mistral-common v11 writes `[CALL_ID]id` before [ARGS]: read, and a new id given.
    (
        '[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{}\n[TOOL_CALLS]g[ARGS]{"y": []}',
        None,
        [
            ("f", "{}"),
            ("g", '{"y": []}'),
        ],
    ),
]


@pytest.mark.parametrize(("text", "content", "calls"), NAMED)
def test_mistral_v11_calls_whole_and_streamed(
    text: str, content: str | None, calls: list[tuple[str, str]]
) -> None:
    found_content, found = parse("mistral", text)
    assert found_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in found] == calls
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in found)
    # Streamed in random pieces: the same content and calls, each call's name first.
    rng = random.Random(text)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) // 3)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream = Stream("mistral", 1 << 17)
        deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
        assert "".join(d.get("content", "") for d in deltas) == (content or ""), pieces
        assert _joined(deltas) == calls, pieces
        ids = [c["id"] for d in deltas for c in d.get("tool_calls", ()) if "id" in c]
        assert all(len(i) == 9 and i.isalnum() for i in ids)


@pytest.mark.parametrize(
    ("after", "calls"),
    [
        ('get_weather[ARGS]{"city": "Oslo"}', [("get_weather", '{"city": "Oslo"}')]),
        ('[{"name": "f", "arguments": {"a": 1}}]', [("f", '{"a": 1}')]),
    ],
)
def test_spaces_after_the_mistral_tag_come_apart_from_the_call(
    after: str, calls: list[tuple[str, str]]
) -> None:
    """Spaces after `[TOOL_CALLS]`, one a piece, then either format: the pieces are held
    apart until the format shows, and the calls are the whole answer's."""
    pieces = ["[TOOL_", "CALLS]", *([" "] * 50), "\n", "", *after]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in
            parse("mistral", "".join(pieces))[1]] == calls  # fmt: skip
    stream = Stream("mistral", 1 << 17)
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
    assert _joined(deltas) == calls
    assert not any(d.get("content") for d in deltas)


@pytest.mark.parametrize(
    ("text", "mended"),
    [
        # ge-serve's rule, as for its other formats: no call (vLLM: a call of raw text).
        ("[TOOL_CALLS]toolname_no_args", "[TOOL_CALLS]toolname_no_args[ARGS]{}"),
        ('[TOOL_CALLS]get weather[ARGS]{"a": 1}', '[TOOL_CALLS]get_weather[ARGS]{"a": 1}'),
        ('[TOOL_CALLS][ARGS]{"a": 1}', '[TOOL_CALLS]f[ARGS]{"a": 1}'),
        ('[TOOL_CALLS]f[ARGS]"text"', '[TOOL_CALLS]f[ARGS]{"a": "text"}'),
        ('[TOOL_CALLS]f[ARGS]{"a": }', '[TOOL_CALLS]f[ARGS]{"a": 1}'),
        ('[TOOL_CALLS]f[CALL_ID]x y[ARGS]{"a": 1}', '[TOOL_CALLS]f[CALL_ID]xy[ARGS]{"a": 1}'),
        ("[TOOL_CALLS]f[ARGS]{]", "[TOOL_CALLS]f[ARGS]{}"),
    ],
)
def test_a_mistral_v11_answer_that_is_no_call_is_content(text: str, mended: str) -> None:
    assert parse("mistral", text) == (text, [])
    # Streamed: nothing sent before the answer stops being calls: the whole parse's.
    deltas, content = _stream_all("mistral", text, len(text))
    assert content == text and _joined(deltas) == []
    # Mended, it is one call.
    assert len(parse("mistral", mended)[1]) == 1
    assert len(_joined(_stream_all("mistral", mended, 3)[0])) == 1


def test_a_mistral_v11_call_streams_as_it_grows() -> None:
    arguments = '{"city": "Oslo", "days": [1, 2, 3]}'
    text = f"Let me see. [TOOL_CALLS]weather[ARGS]{arguments}"
    stream = Stream("mistral", 1 << 17)
    sent = [d for at in range(0, len(text), 4) for d in stream.feed(text[at : at + 4])]
    calls = [d for d in sent if "tool_calls" in d]
    assert calls[0]["tool_calls"][0]["function"] == {"name": "weather", "arguments": ""}
    assert len(calls) > 5 and _joined(sent) == [("weather", arguments)]
    assert "".join(d.get("content", "") for d in sent) == "Let me see. "
    assert stream.finish() == [] and stream.called
    # Cut short after a call was sent: what was sent stays (vLLM's), as for the others.
    text += '[TOOL_CALLS]g[ARGS]{"b": "c'
    assert parse("mistral", text) == (text, [])
    assert _joined(_streamed("mistral", text, 4)) == [("weather", arguments), ("g", '{"b": "c')]
    # Past --max-tool-call-parse-bytes the text is no longer read, as for the others.
    stream = Stream("mistral", 30)
    sent = [d for at in range(0, len(text), 4) for d in stream.feed(text[at : at + 4])]
    assert stream.truncated and stream.finish() == [] and _joined(sent) == []


@pytest.mark.parametrize("parser", ["hermes", "llama3", "mistral", "granite", "phi4_mini_json"])
def test_a_call_streams_as_it_grows(parser: str) -> None:
    arguments = '{"city": "Oslo", "days": [1, 2, 3]}'
    text = {
        "hermes": f'<tool_call>{{"name": "w", "arguments": {arguments}}}</tool_call>',
        "llama3": f'<|python_tag|>{{"name": "w", "parameters": {arguments}}}',
        "mistral": f'[TOOL_CALLS][{{"name": "w", "arguments": {arguments}}}]',
        "granite": f'<|tool_call|>[{{"name": "w", "arguments": {arguments}}}]',
        "phi4_mini_json": f'functools[{{"name": "w", "arguments": {arguments}}}]',
    }[parser]
    stream = Stream(parser, 1 << 17)
    deltas = [stream.feed(text[at : at + 4]) for at in range(0, len(text), 4)]
    sent = [d for found in deltas for d in found]
    # The name comes first, as soon as its member ends; the arguments in many pieces
    # before the model ends.
    assert sent[0]["tool_calls"][0]["function"] == {"name": "w", "arguments": ""}
    assert len(sent) > 5 and _joined(sent) == [("w", arguments)]
    assert stream.finish() == [] and stream.called


def test_a_call_cut_short_stays_as_sent() -> None:
    # vLLM's: the name and arguments sent stay; the held text is not sent as content.
    text = '<|python_tag|>{"name": "f", "arguments": {"a": "b'
    stream = Stream("llama3", 1 << 17)
    deltas = [d for at in range(0, len(text), 5) for d in stream.feed(text[at : at + 5])]
    assert stream.finish() == []
    assert _joined(deltas) == [("f", '{"a": "b')]
    assert parse("llama3", text) == (text, [])


def _stream_all(parser: str, text: str, size: int) -> tuple[list[dict[str, Any]], str]:
    """The deltas of `text` fed in pieces of `size`, and its content joined."""
    deltas = _streamed(parser, text, size)
    return deltas, "".join(d.get("content", "") for d in deltas)


@pytest.mark.parametrize("escape", ["\\u-123", "\\u+041", "\\u 041", "\\u0x41", "\\u1_23"])
def test_a_unicode_escape_takes_four_hex_digits(escape: str) -> None:
    # After the name: the call stops where its text stops being JSON; what was sent stays.
    text = f'<tool_call>{{"name": "f", "arguments": {{"a": "x{escape}"}}}}</tool_call>'
    for size in (1, 3):
        deltas, content = _stream_all("hermes", text, size)
        assert content == "" and _joined(deltas) == [("f", '{"a": "x')]
    # Nothing sent before it (the answer in one piece): the whole parse's, no call.
    assert _stream_all("hermes", text, len(text))[1] == text == parse("hermes", text)[0]
    # Before it: nothing was sent, and the whole answer is parsed at the end: no call.
    text = f'<tool_call>{{"arguments": {{"a": "{escape}"}}, "name": "f"}}</tool_call>'
    assert parse("hermes", text) == (text, [])
    for size in (1, 3, len(text)):
        deltas, content = _stream_all("hermes", text, size)
        assert content == text and _joined(deltas) == []


@pytest.mark.parametrize("first", ["name", "arguments"])
def test_a_call_nested_too_deep_is_no_call(first: str) -> None:
    deep = "[" * 3000 + "]" * 3000
    members = ['"name": "f"', f'"arguments": {{"a": {deep}}}']
    text = "<tool_call>{" + ", ".join(members if first == "name" else members[::-1]) + "}"
    text += "</tool_call>"
    assert parse("hermes", text) == (text, [])
    for size in (7, len(text)):
        deltas, content = _stream_all("hermes", text, size)
        if first == "name" and size == 7:  # stopped where too deep: what was sent stays
            [(name, arguments)] = _joined(deltas)
            assert name == "f" and content == "" and deep.startswith(arguments[6:])
            assert arguments.startswith('{"a": ') and 0 < arguments.count("[") <= 512
        else:  # nothing sent: the whole parse's answer, no call
            assert content == text and _joined(deltas) == []
    # Under the bound, a deep call streams whole.
    deep = "[" * 400 + "1" + "]" * 400
    text = f'<tool_call>{{"name": "f", "arguments": {{"a": {deep}}}}}</tool_call>'
    [found] = parse("hermes", text)[1]
    deltas, content = _stream_all("hermes", text, 5)
    assert _joined(deltas) == [("f", found["function"]["arguments"])] and content == ""


def test_a_defect_of_the_streamed_reader_stops_the_calls_not_the_answer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the incremental reader raises, the streaming stops there as for a broken
    call (what was sent stays; nothing sent: the whole parse at the end), logged once."""
    text = '<tool_call>{"name": "w", "arguments": {"c": 1, "d": 2}}</tool_call>'
    calls, fail = [], [12]
    real = toolstream.CallText.feed

    def feed(self: toolstream.CallText, piece: str) -> int:
        calls.append(piece)
        if len(calls) == fail[0]:
            raise RuntimeError("a defect")
        return real(self, piece)

    monkeypatch.setattr(toolstream.CallText, "feed", feed)
    with caplog.at_level(logging.WARNING):
        deltas, content = _stream_all("hermes", text, 3)
    [(name, arguments)] = _joined(deltas)
    assert name == "w" and '{"c": 1, "d": 2}'.startswith(arguments) and content == ""
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    # Nothing was sent yet: the text held is parsed whole at the end.
    calls.clear()
    caplog.clear()
    fail[0] = 1
    deltas, content = _stream_all("hermes", text, 30)
    assert content == "" and _joined(deltas) == [("w", '{"c": 1, "d": 2}')]
    assert len(caplog.records) == 1


def test_a_member_given_twice_holds_the_call_until_its_object_ends() -> None:
    for text in (
        '<tool_call>{"name": "a", "name": "b", "arguments": {"x": 1}}</tool_call>',
        '<tool_call>{"parameters": {"p": 1}, "arguments": {"x": 1}, "name": "f"}</tool_call>',
        '<tool_call>{"arguments": {"x": 1}, "parameters": {"p": 1}, "name": "f"}</tool_call>',
    ):
        whole = [
            (c["function"]["name"], c["function"]["arguments"]) for c in parse("hermes", text)[1]
        ]
        for pieces in _splits(text):
            stream = Stream("hermes", 1 << 17)
            deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
            assert _joined(deltas) == whole, pieces
    # After the name was sent, vLLM's rule: a delta sent is not taken back.
    text = '<tool_call>{"name": "f", "parameters": {"p": 1}, "arguments": {"x": 1}}</tool_call>'
    assert _joined(_streamed("hermes", text, 4)) == [("f", '{"p": 1}')]
    text = '<tool_call>{"name": "f", "arguments": {"x": 1}, "name": "g"}</tool_call>'
    assert _joined(_streamed("hermes", text, 4)) == [("f", '{"x": 1}')]
