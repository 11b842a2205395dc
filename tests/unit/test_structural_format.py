"""xgrammar's structural tag, the `format` form (backends/llm/structformat.py), as the
mask sees it: each format's text is what the model may write, token by token, over the
tiny model's byte tokenizer (one token per character)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest

from ge_serve.backends.llm.structtag import structural_tag
from ge_serve.backends.llm.structured import Grammars, Structured
from ge_serve.backends.llm.text import Tokenizer

EOS = 256
THINK, UNTHINK = 257, 258  # `byte_tokenizer(think=True)`'s "<think>" and "</think>"
VOCAB = 400


def grammars_of(folder: Path, think: bool) -> Grammars:
    path = folder / "tokenizer.json"
    llmrepo.byte_tokenizer(think).save(str(path))
    return Grammars(Tokenizer(path), VOCAB, frozenset({EOS}))


@pytest.fixture(scope="module")
def grammars(tmp_path_factory: pytest.TempPathFactory) -> Grammars:
    return grammars_of(tmp_path_factory.mktemp("bytes"), think=False)


def chars(text: str) -> set[int]:
    return set(llmrepo.prompt_ids(text))


FREE = chars("ax<>/ \n")  # some of what free text may hold


class Writer:
    """A format's constraint, written into."""

    def __init__(self, grammars: Grammars, fmt: dict[str, Any], **options: Any) -> None:
        spec = structural_tag({"type": "structural_tag", "format": fmt})
        self._constraint = grammars.constraint(Structured("structural_tag", spec, **options))

    def allowed(self) -> set[int]:
        row = self._constraint.allowed(np.zeros(VOCAB, dtype=np.float32))
        return set() if row is None else {int(i) for i in np.flatnonzero(np.isfinite(row))}

    def write(self, text: str | list[int]) -> set[int]:
        """Writes `text` (each of its tokens must be allowed); the tokens allowed next."""
        for token in llmrepo.prompt_ids(text) if isinstance(text, str) else text:
            assert token in self.allowed(), (text, token)
            self._constraint.accept(token)
        return self.allowed()


def writer_after(grammars: Grammars, fmt: dict[str, Any], text: str) -> set[int]:
    return Writer(grammars, fmt).write(text)


def tag(begin: Any, content: dict[str, Any], end: Any) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


THOUGHT = tag("<think>", {"type": "any_text"}, "</think>")
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = tag("<function=weather>", {"type": "json_schema", "json_schema": CITY}, "</function>")


def test_free_text_in_a_tag_runs_until_the_tags_end(grammars: Grammars) -> None:
    writer = Writer(grammars, THOUGHT)
    assert writer.write("") == chars("<")
    assert writer.write("<think>a</thin") >= FREE  # not yet the end: still free
    assert writer.write("k>") == {EOS}  # the end ends the tag, and the output


def test_triggered_tags_force_a_tag_after_a_trigger_and_free_text_after_it(
    grammars: Grammars,
) -> None:
    fmt = {"type": "triggered_tags", "triggers": ["<function="], "tags": [WEATHER]}
    writer = Writer(grammars, fmt)
    assert FREE | {EOS} <= writer.write("I will call ")
    assert writer.write("<function=") == chars("w")  # the trigger begins the tag
    assert chars('"') <= writer.write("weather>{ ") <= chars('" \n\t\r')
    assert FREE | {EOS} <= writer.write('"city": "Oslo"}</function> and ')


def test_at_least_one_tag_comes_first_and_stop_after_first_ends_after_it(
    grammars: Grammars,
) -> None:
    fmt = {
        "type": "triggered_tags",
        "triggers": ["<function="],
        "tags": [WEATHER],
        "at_least_one": True,
        "stop_after_first": True,
    }
    writer = Writer(grammars, fmt)
    assert writer.write("") == chars("<")
    assert writer.write('<function=weather>{"city": "Oslo"}</function>') == {EOS}


def test_one_tag_then_nothing_once_a_trigger_is_written(grammars: Grammars) -> None:
    fmt = {"type": "triggered_tags", "triggers": ["<f"], "stop_after_first": True, "tags": [
        tag("<f>", const("x"), "</f>")]}  # fmt: skip
    assert FREE | {EOS} <= Writer(grammars, fmt).write("no call at all")
    assert Writer(grammars, fmt).write("text <f>x</f>") == {EOS}


def test_tags_with_a_separator_and_nothing_else(grammars: Grammars) -> None:
    fmt = {
        "type": "tags_with_separator",
        "separator": ",",
        "tags": [tag("<a>", const("1"), "</a>")],
    }
    writer = Writer(grammars, fmt)
    assert writer.write("") == chars("<") | {EOS}
    assert writer.write("<a>1</a>") == chars(",") | {EOS}
    assert writer.write(",") == chars("<")


def test_a_thought_then_an_answer(grammars: Grammars) -> None:
    fmt = {"type": "sequence", "elements": [
        THOUGHT, const("Answer: "), {"type": "json_schema", "json_schema": {"type": "integer"}},
    ]}  # fmt: skip
    writer = Writer(grammars, fmt)
    assert writer.write("<think>so: </think>") == chars("A")
    assert chars("0123456789") | {EOS} <= writer.write("Answer: 42")


def test_choices_grammars_and_patterns(grammars: Grammars) -> None:
    either = {"type": "or", "elements": [const("yes"), const("no")]}
    assert Writer(grammars, either).write("") == chars("yn")
    ebnf = {"type": "grammar", "grammar": 'root ::= "on" | "off"'}
    assert Writer(grammars, ebnf).write("o") == chars("nf")
    pattern = {"type": "regex", "pattern": "[A-Z]{2}-[0-9]"}
    assert Writer(grammars, pattern).write("AB") == chars("-")
    optional = {
        "type": "sequence",
        "elements": [{"type": "optional", "content": const("+")}, const("1")],
    }
    assert Writer(grammars, optional).write("") == chars("+1")


def test_repeats_are_counted(grammars: Grammars) -> None:
    fmt = {"type": "repeat", "min": 2, "max": 3, "content": const("ab")}
    writer = Writer(grammars, fmt)
    assert writer.write("ab") == chars("a")
    assert writer.write("ab") == chars("a") | {EOS}
    assert writer.write("ab") == {EOS}
    never = {"type": "repeat", "min": 0, "max": 0, "content": const("ab")}
    assert writer_after(grammars, never, "") == {EOS}
    assert writer_after(grammars, {"type": "plus", "content": const("ab")}, "") == chars("a")
    assert writer_after(grammars, {"type": "star", "content": const("ab")}, "") == chars("a") | {
        EOS
    }


def test_free_text_is_bounded_in_characters(grammars: Grammars) -> None:
    fmt = tag("[", {"type": "any_text", "max_chars": 3}, "]")
    assert writer_after(grammars, fmt, "[abc") == chars("]")
    # The largest bound an end of eight characters takes, ended early and late.
    thought = tag("<think>", {"type": "any_text", "max_chars": 100}, "</think>")
    for length in (0, 5, 99, 100):
        assert writer_after(grammars, thought, f"<think>{'a' * length}</think>") == {EOS}


def test_free_text_before_a_string_ends_at_that_string(grammars: Grammars) -> None:
    fmt = {"type": "sequence", "elements": [
        {"type": "any_text"}, const("."), tag("<a>", const("1"), "</a>"), {"type": "any_text"},
        tag("[", const("2"), "]"),
    ]}  # fmt: skip
    writer = Writer(grammars, fmt)
    assert writer.write("so ") >= FREE | chars(".")
    assert writer.write("it is.") == chars("<")  # the first "." ends the text
    assert writer.write("<a>1</a>then [") == chars("2")
    assert writer.write("2]") == {EOS}


def test_a_token_string_is_its_decoded_text(grammars: Grammars) -> None:
    assert writer_after(grammars, {"type": "token", "token": " "}, "") == chars(" ")


def test_added_tokens_are_written_as_the_tokens_they_are(tmp_path: Path) -> None:
    # "<think>" is the model's token 257 (an added token, not special): where the format
    # says "<think>" the grammar takes the token or the text, as xgrammar does, and never
    # ends in a dead end when the tokenizer makes the token of the text it forces.
    grammars = grammars_of(tmp_path, think=True)
    writer = Writer(grammars, {"type": "sequence", "elements": [THOUGHT, const("ok")]})
    assert THINK in writer.write("")
    assert FREE | {UNTHINK} <= writer.write([THINK, *llmrepo.prompt_ids("hmm")])
    assert writer.write([UNTHINK]) == chars("o")
    fmt = {
        "type": "triggered_tags",
        "triggers": ["<think>"],
        "tags": [tag("<think>", const("x"), "!")],
    }
    writer = Writer(grammars, fmt)
    assert THINK in writer.write("free ")
    assert writer.write([THINK]) == chars("x")
    # Within other text too, and in a regex, whose forced text is the token's text.
    writer = Writer(grammars, const("\n</think>\n"))
    assert writer.write("\n") == chars("<") | {UNTHINK}
    assert writer.write([UNTHINK, *llmrepo.prompt_ids("\n")]) == {EOS}
    pattern = Writer(grammars, {"type": "regex", "pattern": "x</think>"})
    assert pattern.write(list(llmrepo.prompt_ids("x</"))) == chars("t")
    assert pattern.write(list(llmrepo.prompt_ids("think>"))) == {EOS}


def test_a_trigger_that_begins_with_the_tags_end_never_fires(grammars: Grammars) -> None:
    triggered = {"type": "triggered_tags", "triggers": ["</r>"], "tags": [
        tag("</r>x", const("1"), "!")]}  # fmt: skip
    assert writer_after(grammars, tag("<r>", triggered, "</r>"), "<r>a</r>") == {EOS}


def test_a_bounded_text_cannot_end_with_a_special_token_within_text(tmp_path: Path) -> None:
    # llguidance forces a bounded text's end once its characters run out, and would write
    # the special token for its text within the forced string, which it then refuses.
    path = tmp_path / "tokenizer.json"
    tokenizer = llmrepo.byte_tokenizer()
    tokenizer.add_special_tokens(["<|tool|>"])
    tokenizer.save(str(path))
    grammars = Grammars(Tokenizer(path), VOCAB, frozenset({EOS}))
    bounded = tag("[", {"type": "any_text", "max_chars": 4}, "a<|tool|>")
    with pytest.raises(ValueError) as raised:
        Writer(grammars, bounded)
    assert "max_chars: the end 'a<|tool|>' holds the special token" in str(raised.value)
    assert writer_after(grammars, tag("[", const("1"), "<|tool|>"), "[1") == chars("<") | {257}


def test_free_tokens_stop_at_the_token_after_them(tmp_path: Path) -> None:
    grammars = grammars_of(tmp_path, think=True)
    fmt = {
        "type": "sequence",
        "elements": [{"type": "any_tokens"}, {"type": "token", "token": THINK}],
    }
    writer = Writer(grammars, fmt)
    assert THINK in writer.write("a")
    assert writer.write([THINK]) == {EOS}


def test_a_dispatch_without_a_loop_ends_after_its_first_rule(grammars: Grammars) -> None:
    fmt = {"type": "dispatch", "loop": False, "rules": [["<a>", const("1</a>")]]}
    assert writer_after(grammars, fmt, "hi <a>") == chars("1")
    assert writer_after(grammars, fmt, "hi <a>1</a>") == {EOS}


def test_json_takes_the_requests_whitespace_and_its_own_cap(grammars: Grammars) -> None:
    fmt = {"type": "json_schema", "json_schema": CITY}
    assert writer_after(grammars, fmt, "{") == chars('" \n\t\r')
    assert Writer(grammars, fmt, disable_any_whitespace=True).write("{") == chars('"')
    capped = {**fmt, "max_whitespace_cnt": 1}
    assert Writer(grammars, capped).write("{ ") == chars('"')


def test_token_formats_take_the_models_tokens(tmp_path: Path) -> None:
    grammars = grammars_of(tmp_path, think=True)
    fmt = tag(
        {"type": "token", "token": "<think>"},
        {"type": "any_tokens"},
        {"type": "token", "token": UNTHINK},
    )
    writer = Writer(grammars, fmt)
    assert writer.write("") == {THINK}
    inside = writer.write([THINK, *llmrepo.prompt_ids("hmm")])
    # Any token but the EOS and the ids past the tokenizer's (259 to VOCAB) inside the tag.
    assert inside == set(range(256)) | {THINK, UNTHINK}
    assert writer.write([UNTHINK]) == {EOS}
    think, unthink = {"type": "token", "token": THINK}, {"type": "token", "token": UNTHINK}
    dispatch = {"type": "token_triggered_tags", "trigger_tokens": [THINK], "tags": [
        tag(think, const("x"), unthink)]}  # fmt: skip
    writer = Writer(grammars, dispatch)
    assert writer.write("free ") >= FREE | {THINK, EOS}
    assert writer.write([THINK]) == chars("x")
    assert writer.write("x") == {UNTHINK}


BAD: list[tuple[Any, str]] = [
    ({"type": "yaml"}, "format: unknown format type 'yaml'"),
    ([1], "format must be an object"),
    ({"type": "sequence", "elements": [{"type": "any_text"}, {"type": "regex", "pattern": "x"}]},
     "format.elements[0]: free text (any_text) must end its tag or the output"),
    ({"type": "star", "content": {"type": "any_text", "excludes": ["."]}},
     "format.content: free text (any_text) must end its tag or the output"),
    (tag("<", {"type": "any_text", "max_chars": 101}, "</think>"), "format.content.max_chars"),
    ({"type": "grammar", "grammar": "start: @g1"}, "must be an EBNF grammar"),
    ({"type": "any_text", "max_tokens": 8}, "format.max_tokens is not served"),
    ({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"},
     "style 'qwen_xml' is not served"),
    ({"type": "json_schema", "json_schema": {}, "any_order": True}, "any_order is not served"),
    ({"type": "json_schema", "json_schema": False}, "json_schema must be a JSON schema"),
    ({"type": "triggered_tags", "triggers": ["<g"], "tags": [WEATHER]},
     "One tag does not match any trigger in a triggered tags format"),
    ({"type": "triggered_tags", "triggers": ["<f", "<func"], "tags": [WEATHER]},
     "One tag matches multiple triggers in a triggered tags format"),
    ({"type": "repeat", "min": 3, "max": 2, "content": const("a")}, "min must be <= max"),
    ({"type": "tag", "begin": "<", "content": {"type": "any_text"}, "end": ["", ">"]},
     "needs its tag's end strings non-empty"),
    ({"type": "or", "elements": []}, "format.elements must be a non-empty list"),
    ({"type": "token", "token": "<nope>"}, 'Token string "<nope>" not found in vocabulary'),
    # Found by its decoded text, as xgrammar finds it: " ", not the vocabulary's "Ġ".
    ({"type": "token", "token": "\u0120"}, 'Token string "\u0120" not found in vocabulary'),
    ({"type": "grammar", "grammar": "root ::= ("}, "format.grammar"),
    (tag("[", {"type": "any_tokens"}, "]"), "format.content: free tokens (any_tokens) must end"),
    ({"type": "sequence", "elements": [{"type": "any_tokens"}, const("x")]},
     "format.elements[0]: free tokens (any_tokens) must end"),
    # llguidance writes the EOS for its text, which would end the answer mid-string.
    (const("x<|endoftext|>y"), "'x<|endoftext|>y' holds the EOS token's text"),
    ({"type": "any_text", "excludes": [f"w{i}" for i in range(17)]},
     "free text stops at more than 16 strings"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "words"), BAD, ids=[w for _, w in BAD])
def test_a_format_that_cannot_be_served_says_why(grammars: Grammars, fmt: Any, words: str) -> None:
    with pytest.raises(ValueError) as raised:
        spec = structural_tag({"format": fmt})
        grammars.constraint(Structured("structural_tag", spec))
    assert words in str(raised.value)


def test_the_format_is_sent_on_as_vllm_sends_it() -> None:
    fmt = {"type": "const_string", "value": "x"}
    sent = json.loads(structural_tag({"type": "structural_tag", "format": fmt}))
    assert sent == {"type": "structural_tag", "format": fmt}


def test_added_tokens_reach_llguidance_as_text_where_they_are_not_special() -> None:
    from ge_serve.backends.llm.grammartok import text_tokens

    def spec(decoder: str, content: str, special: bool, model: str = "BPE") -> dict[str, Any]:
        return {
            "model": {"type": model, "vocab": {"a": 0}},
            "decoder": {"type": decoder},
            "added_tokens": [{"id": 1, "content": content, "special": special}],
        }

    moved = json.loads(text_tokens(json.dumps(spec("ByteLevel", "<t x>", False))))
    assert moved["added_tokens"] == [] and moved["model"]["vocab"]["<t\u0120x>"] == 1
    moved = json.loads(text_tokens(json.dumps(spec("Metaspace", "<t x>", False))))
    assert moved["model"]["vocab"]["<t\u2581x>"] == 1
    same = spec("ByteLevel", "<b>", False)
    same["model"]["vocab"]["<b>"] = 1  # already the vocabulary's, at its id: read as text
    assert json.loads(text_tokens(json.dumps(same)))["added_tokens"] == []
    for kept in (
        spec("ByteFallback", "<0x41>", False),  # byte fallback's own spelling of a byte
        spec("ByteLevel", "<|eot|>", True),  # special: apart from text, as it is
        spec("ByteLevel", "plain", False),  # not <...>: llguidance reads it as text already
        spec("ByteLevel", "<t>", False, model="Unigram"),  # only a BPE vocabulary takes it
    ):
        assert text_tokens(json.dumps(kept)) == json.dumps(kept)
