"""The reasoning parsers of `--reasoning-parser` (server/http/openai/reasoning.py): vLLM
0.34's splits of a whole answer, and streamed deltas that join to the same split however
the text is cut into pieces."""

from __future__ import annotations

import pytest

from ge_serve.server.http.openai.reasoning import Reasoning, plan

TEXTS = [
    "<think>Let me see.</think>It is 4.",
    "Opened by the template.</think>Answer",
    "<think>never ends",
    "<think></think>",
    "a<think>b</think>c</think>d",
    "thinking<tool_call>{}</tool_call>",
    "</th</think><thin",
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>Let me see.</think>It is 4.", ("Let me see.", "It is 4.")),
        ("Opened.</think>Answer", ("Opened.", "Answer")),
        ("<think>never ends", ("never ends", None)),
        ("<think>done</think>", ("done", None)),
        # vLLM's partition: text before `<think>` is dropped; the content is as written.
        ("x<think>y</think>z</think>", ("y", "z</think>")),
    ],
)
def test_deepseek_r1(text: str, expected: tuple[str | None, str | None]) -> None:
    assert Reasoning("deepseek_r1").split(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a<think>b</think>c</think>d", ("ab", "cd")),
        ("never ends", ("never ends", None)),
        ("thinking<tool_call>{}", ("thinking", "<tool_call>{}")),
        ("<think></think>only", (None, "only")),
    ],
)
def test_qwen3(text: str, expected: tuple[str | None, str | None]) -> None:
    assert Reasoning("qwen3").split(text) == expected


def _streams_as(use: Reasoning, text: str, whole: tuple[str | None, str | None]) -> None:
    """`text` streamed in pieces of every size gives the deltas of `whole`."""
    for size in range(1, len(text) + 1):
        stream = use.stream()
        deltas = [d for at in range(0, len(text), size) for d in stream.feed(text[at : at + size])]
        deltas += stream.finish()
        reasoning = "".join(d.get("reasoning", "") for d in deltas) or None
        content = "".join(d.get("content", "") for d in deltas) or None
        assert (reasoning, content) == whole, size


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_join_to_the_split(parser: str, text: str) -> None:
    use = Reasoning(parser)
    # vLLM's deepseek_r1 streams text before a `<think>` as thoughts (whole, it drops it).
    whole = use.split(text.replace("<think>", "", 1) if parser == "deepseek_r1" else text)
    if whole[0] == "":  # an empty delta is not sent
        whole = (None, whole[1])
    _streams_as(use, text, whole)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[THINK]Let me see.[/THINK]It is 4.", ("Let me see.", "It is 4.")),
        # Content until the model writes [THINK]: no thoughts, no reasoning.
        ("No thoughts.", (None, "No thoughts.")),
        ("[THINK]never ends", ("never ends", None)),
        ("x[THINK]y", ("y", "x")),
        ("[THINK]done[/THINK]", ("done", None)),
        # A [/THINK] without [THINK] is dropped; tags after the thoughts stay, whole.
        ("a[/THINK]b", (None, "ab")),
        ("x[THINK]y[/THINK]z[THINK]w", ("y", "xz[THINK]w")),
        ("", (None, "")),
    ],
)
def test_mistral(text: str, expected: tuple[str | None, str | None]) -> None:
    assert Reasoning("mistral", thinking=False).split(text) == expected


MISTRAL_TEXTS = [
    "[THINK]Let me see.[/THINK]It is 4.",
    "No thoughts.",
    "[THINK]never ends",
    "x[THINK]y[/THINK]z",
    "[THINK][/THINK]",
    "[/TH[/THINK]x[THI",
]


@pytest.mark.parametrize("text", MISTRAL_TEXTS)
def test_mistral_streamed_pieces_join_to_the_split(text: str) -> None:
    use = plan("mistral", True, None, "[INST]q[/INST]", None)
    assert use == Reasoning("mistral", thinking=False)
    whole = use.split(text)
    if whole[0] == "":
        whole = (None, whole[1])
    _streams_as(use, text, whole)


def test_mistral_streamed_drops_every_tag() -> None:
    # vLLM's streamed deltas skip a tag that comes as a token of its own, wherever it is;
    # whole, the tags after the thoughts are kept (its extract_reasoning).
    stream = Reasoning("mistral", thinking=False).stream()
    deltas = [d for piece in ("a", "[THINK]", "b", "[/THINK]", "c", "[THINK]", "d", "[/THINK]", "e")
              for d in stream.feed(piece)]  # fmt: skip
    assert deltas == [
        {"content": "a"}, {"reasoning": "b"}, {"content": "c"}, {"content": "d"}, {"content": "e"},
    ]  # fmt: skip


def test_mistral_structured_outputs_wait_for_its_thoughts_to_end() -> None:
    # Magistral's system prompt shows the format with the tags: closed, as vLLM's
    # is_reasoning_end reads the prompt, so the grammar applies from the first token.
    shown = "[SYSTEM_PROMPT]Think as [THINK]thoughts[/THINK]answer.[/SYSTEM_PROMPT][INST]q[/INST]"
    use = plan("mistral", True, None, shown, "response_format")
    assert use == Reasoning("mistral", thinking=False, after=None)
    for prompt in ("[INST]q[/INST]", "[INST]q[/INST][THINK]"):
        use = plan("mistral", True, None, prompt, "response_format")
        assert use is not None and use.after == "[/THINK]", prompt
    assert use.kept_special_tokens() == ("[THINK]", "[/THINK]")
    assert Reasoning("qwen3").kept_special_tokens() == ()


def test_qwen3_thinking_off() -> None:
    assert plan("qwen3", True, {"enable_thinking": False}, "p", None) == Reasoning(
        "qwen3", thinking=False
    )
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    use = plan("qwen3", True, None, closed, None)
    assert use is not None and use.split("a</think>b") == (None, "ab")
    opened = "<|im_start|>user\n</think><|im_end|>\n<|im_start|>assistant\n"
    assert plan("qwen3", True, None, opened, None) == Reasoning("qwen3")
    assert plan("", True, None, opened, None) is None


def test_structured_outputs_wait_for_the_end_of_open_thoughts() -> None:
    opened = "<|im_start|>assistant\n"
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    use = plan("deepseek_r1", True, None, opened, "response_format")
    assert use is not None and use.after == "</think>"
    use = plan("qwen3", True, None, opened, "tool_choice")
    assert use is not None and use.after == "</think>"
    # Thoughts the prompt has closed (vLLM's is_reasoning_end on the prompt), thinking
    # off, or nothing constrained: the grammar (if any) applies from the first token.
    for parser, kwargs, prompt, field in [
        ("deepseek_r1", None, closed, "response_format"),
        ("qwen3", None, closed, "response_format"),
        ("qwen3", {"enable_thinking": False}, opened, "structured_outputs"),
        ("deepseek_r1", None, opened, None),
    ]:
        use = plan(parser, True, kwargs, prompt, field)
        assert use is not None and use.after is None, (parser, prompt)


THOUGHT, RESPONSE = "Here is my thought process:", "Here is my response:"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{THOUGHT}\nTwo and two.\n{RESPONSE}\nFour.", ("\nTwo and two.\n", "\nFour.")),
        ("Here's my thought process: a Here's my response: b", (" a ", " b")),
        # vLLM's regex: both phrases, or no thoughts; text before the first is dropped.
        (f"{THOUGHT} never answered", (None, f"{THOUGHT} never answered")),
        (f"Sure. {THOUGHT} a {RESPONSE} b", (" a ", " b")),
        (f"{THOUGHT} a {RESPONSE}", (" a ", None)),
        ("Four.", (None, "Four.")),
    ],
)
def test_granite(text: str, expected: tuple[str | None, str | None]) -> None:
    assert Reasoning("granite").split(text) == expected


GRANITE_TEXTS = [
    f"{THOUGHT}\nTwo and two.\n{RESPONSE}\nFour.",
    "Here's my thought process: a Here is my respo Here's my response: b",
    "Here is my answer: four.",
    "Four.",
]


@pytest.mark.parametrize("text", GRANITE_TEXTS)
def test_granite_streamed_pieces_join_to_the_split(text: str) -> None:
    use = plan("granite", True, {"thinking": True}, "p", None)
    assert use == Reasoning("granite", thinking=True)
    _streams_as(use, text, use.split(text))


def test_granite_streamed_thoughts_begin_the_answer_or_are_none() -> None:
    # vLLM's deltas read thoughts only where the answer begins with the phrase, and up to
    # its end where no response phrase comes (whole, its regex needs both).
    for text, expected in [
        (f"Sure. {THOUGHT} a {RESPONSE} b", [{"content": f"Sure. {THOUGHT} a {RESPONSE} b"}]),
        (f"{THOUGHT} cut sho", [{"reasoning": " cut sho"}]),
    ]:
        stream = Reasoning("granite").stream()
        deltas = [*stream.feed(text), *stream.finish()]
        assert deltas == expected
    hidden = Reasoning("granite", include=False).stream()
    assert [*hidden.feed(f"{THOUGHT} a {RESPONSE} b"), *hidden.finish()] == [{"content": " b"}]


def test_granite_structured_outputs_wait_for_its_response_where_it_thinks() -> None:
    use = plan("granite", True, {"thinking": True}, "p", "response_format")
    # Either response phrase ends so ("Here's" too, as quantized models write it).
    assert use is not None and use.after == "my response:"
    assert use.tags is None and Reasoning("olmo3").tags is None  # no budget, no count
    use = plan("granite", True, None, "p", "response_format")
    assert use == Reasoning("granite", thinking=False, after=None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>Let me see.</think>It is 4.", ("Let me see.", "It is 4.")),
        ("Opened by the template.</think>Answer", ("Opened by the template.", "Answer")),
        # vLLM's regex: without `</think>` all of it is content (deepseek_r1: thoughts).
        ("<think>never ends", (None, "<think>never ends")),
        ("a<think>b</think>c", ("a<think>b", "c")),
        ("<think></think>only", (None, "only")),
    ],
)
def test_olmo3(text: str, expected: tuple[str | None, str | None]) -> None:
    assert Reasoning("olmo3").split(text) == expected


def test_olmo3_streams_as_deepseek_r1_and_waits_for_its_end() -> None:
    stream = Reasoning("olmo3").stream()
    deltas = [
        d
        for piece in ("<thi", "nk>Let me", " see.</th", "ink>It is 4.")
        for d in stream.feed(piece)
    ]
    deltas += stream.finish()
    assert "".join(d.get("reasoning", "") for d in deltas) == "Let me see."
    assert "".join(d.get("content", "") for d in deltas) == "It is 4."
    use = plan("olmo3", True, None, "<|im_start|>assistant\n<think>", "response_format")
    assert use is not None and use.after == "</think>"
    # vLLM's is_reasoning_end reads any `</think>` in the prompt as the end.
    closed = plan(
        "olmo3", True, None, "a</think>b<|im_start|>assistant\n<think>", "response_format"
    )
    assert closed is not None and closed.after is None
