"""How the server's chat settings shape a rendered prompt: the content format a template
is given (detected from its syntax, as vLLM detects it, or forced), OpenAI's `developer`
role for templates that do not know it, and the default template variables."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ge_serve.backends.base import TextGeneration
from ge_serve.server.control.chat import ChatSettings
from ge_serve.server.http.openai.errors import OpenAIError
from ge_serve.server.http.openai.messages import ChatMessage
from ge_serve.server.http.openai.schemas import ChatCompletionRequest
from ge_serve.server.http.openai.template import (
    content_form,
    render,
    render_request,
)
from ge_serve.server.http.openai.templateproc import TemplateProcesses

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A multimodal template's walk over the content parts (Llama 3.2 Vision's shape).
PARTS = (
    "{% for message in messages %}[{{ message['role'] }}:"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}|"
    "{% endif %}{% endfor %}]{% endfor %}"
)
# Templates that walk a message's content in the other ways vLLM's detection knows.
OPENAI_SHAPES = [
    PARTS,
    "{% for m in messages|reverse %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
    "{% set rest = messages[1:] %}{% for m in rest %}{% for p in m['content'] %}{{ p }}"
    "{% endfor %}{% endfor %}",
    "{% set ns = namespace(rest=messages) %}{% for m in ns.rest %}"
    "{% for p in m['content'] %}{{ p }}{% endfor %}{% endfor %}",
    "{% for m in messages %}{% set content = m['content'] %}"
    "{% for p in content %}{{ p }}{% endfor %}{% endfor %}",
    "{% macro show(parts) %}{% for p in parts %}{{ p['text'] }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ show(m['content']) }}{% endfor %}",
    "{% macro show(x, parts=none) %}{% for p in parts %}{{ p }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ show(1, parts=m['content']) }}{% endfor %}",
]
# transformers' generation tag around the walk: parsed as the template is rendered.
GENERATION_PARTS = (
    "{% for m in messages %}{% generation %}{% for p in m['content'] %}{{ p['text'] }}"
    "{% endfor %}{% endgeneration %}{% endfor %}"
)
OPENAI_SHAPES.append(GENERATION_PARTS)
STRING_SHAPES = [
    CHATML,
    "{{ messages[0]['content'] }}{% for m in messages %}{{ m.role }}{% endfor %}",
    "{% for m in messages %}{% for c in m['tool_calls'] or [] %}{{ c }}{% endfor %}{% endfor %}",
    "{% macro show(parts) %}{% for p in parts %}{{ p }}{% endfor %}{% endmacro %}{{ show(tools) }}",
    "{% for m in messages %}",  # does not parse: chats with it are refused anyway
]


def generation(template: str) -> TextGeneration:
    return TextGeneration(template, "<s>", "</s>", 0)


def messages(*pairs: tuple[str, Any]) -> list[ChatMessage]:
    return [ChatMessage(role=role, content=content) for role, content in pairs]


@pytest.mark.parametrize("template", OPENAI_SHAPES)
def test_a_template_that_walks_a_messages_content_is_given_parts(template: str) -> None:
    assert content_form("auto", template) == "openai"


@pytest.mark.parametrize("template", STRING_SHAPES)
def test_other_templates_are_given_a_string(template: str) -> None:
    assert content_form("auto", template) == "string"


def test_the_content_format_decides_what_a_parts_template_prints() -> None:
    sent = messages(
        ("system", "be brief"),
        ("user", [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}]),
        ("tool", [{"type": "text", "text": "42"}]),
        ("assistant", None),
    )
    # Detected: each part, a tool's result as a string (whose characters are no parts).
    auto = render(generation(PARTS), sent, add_generation_prompt=False)
    assert auto == "[system:be brief|][user:Say|hello|][tool:][assistant:]"
    assert render(generation(PARTS), sent, content_format="openai") == auto
    # Forced to a string, the template walks its characters and prints nothing of it.
    forced = render(generation(PARTS), sent, content_format="string")
    assert forced == "[system:][user:][tool:][assistant:]"
    # A string template forced to parts prints the parts' list.
    listed = render(generation(CHATML), sent[:1], content_format="openai")
    assert "[{'type': 'text', 'text': 'be brief'}]" in listed


def test_continue_final_message_continues_the_last_part() -> None:
    sent = messages(
        ("user", "hi"),
        ("assistant", [{"type": "text", "text": "Well"}, {"type": "text", "text": "then,"}]),
    )
    prompt = render(generation(PARTS), sent, add_generation_prompt=False, continue_final=True)
    assert prompt == "[user:hi|][assistant:Well|then,"


def test_developer_messages_reach_a_template_without_that_role_as_system() -> None:
    sent = messages(("developer", "be brief"), ("user", "hi"))
    prompt = render(generation(CHATML), sent, add_generation_prompt=False)
    assert prompt == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    # Several system messages, or one not first, are merged into a first one.
    sent = messages(("system", "one"), ("user", "hi"), ("developer", "two"), ("system", ""))
    prompt = render(generation(CHATML), sent, add_generation_prompt=False)
    assert prompt == ("<|im_start|>system\none\n\ntwo<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    # Without a developer message, nothing is merged; a template that names the role
    # gets it as sent.
    sent = messages(("user", "hi"), ("system", "late"))
    assert render(generation(CHATML), sent).count("<|im_start|>system") == 1
    knowing = CHATML + "{# roles: 'developer' #}"
    sent = messages(("developer", "be brief"), ("user", "hi"))
    assert "<|im_start|>developer\nbe brief" in render(generation(knowing), sent)


def test_merged_system_messages_reach_a_parts_template_as_a_part() -> None:
    sent = messages(("system", "S"), ("developer", "D"), ("user", "u"))
    assert render(generation(PARTS), sent) == "[system:S\n\nD|][user:u|]"


@pytest.fixture(scope="module")
def processes() -> Iterator[TemplateProcesses]:
    """Template processes whose renders have time to spare on a loaded host."""
    found = TemplateProcesses(1, seconds=20.0)
    yield found
    found.close()


@pytest.fixture(scope="module")
def quick() -> Iterator[TemplateProcesses]:
    """Template processes that stop a render after 3 s (a cold start, which counts, takes
    well under a second even on a loaded host)."""
    found = TemplateProcesses(1, seconds=3.0)
    yield found
    found.close()


def own(processes: TemplateProcesses, template: str, gone: bool = False, **fields: Any) -> str:
    """A request's own template rendered as the server renders it: in a template process."""
    stop = threading.Event()
    if gone:
        stop.set()
    with processes.bound(stop):
        return render(generation(template), messages(("user", "x")), own=True, **fields)


@pytest.mark.parametrize(
    "body",
    # Jinja2's `is` tests catch Exception: no stop made in the template's thread could
    # pass through them; a process is killed whatever it runs.
    ["", "{% if messages is sequence %}{% endif %}"],
    ids=["plain", "inside-a-test"],
)
def test_a_requests_template_that_runs_too_long_is_stopped(
    quick: TemplateProcesses, body: str
) -> None:
    looping = (
        "{% for i in range(100000) %}{% for j in range(100000) %}"
        + body
        + "{% endfor %}{% endfor %}"
    )
    started = time.monotonic()
    with pytest.raises(OpenAIError) as refused:
        own(quick, looping)
    assert time.monotonic() - started < 8
    assert refused.value.param == "chat_template"
    assert str(refused.value) == "The request's chat template took more than 3 s to render"
    # A template within its time renders as any other, in a process started again.
    assert own(quick, CHATML) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_a_render_stops_once_its_client_has_gone(processes: TemplateProcesses) -> None:
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(OpenAIError):
        own(processes, looping, gone=True)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x'.center(2000000000) }}",  # one C call: two gigabytes
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  # doubling, turn after turn
        "{{ ([[0] * 1000000] * 200)|sum(start=[]) }}",  # one C call, for seconds
    ],
    ids=["center", "doubling", "sum"],
)
def test_what_a_requests_template_builds_is_bounded_by_its_process(
    quick: TemplateProcesses, template: str
) -> None:
    """Past the process's memory, the client's 400; the server's memory never held it."""
    before = _peak_rss_kb()
    with pytest.raises(OpenAIError) as refused:
        own(quick, template)
    assert refused.value.param == "chat_template"
    assert "needs more than 1024 MiB" in str(refused.value) or "took more than" in str(
        refused.value
    )
    assert _peak_rss_kb() - before < 100_000
    assert own(quick, CHATML).startswith("<|im_start|>user")


def test_a_requests_template_fails_as_a_models_does(processes: TemplateProcesses) -> None:
    with pytest.raises(OpenAIError) as refused:
        own(processes, "{% for %}")
    assert refused.value.param == "chat_template" and refused.value.code == "chat_template_invalid"
    assert "does not compile: line 1" in str(refused.value)
    # Nested past the parser's recursion: a template that does not compile, not a 500.
    deep = "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}"
    with pytest.raises(OpenAIError) as refused:
        own(processes, deep)
    assert refused.value.code == "chat_template_invalid"
    assert "does not compile: RecursionError" in str(refused.value)
    with pytest.raises(OpenAIError) as refused:
        render(generation(deep), messages(("user", "x")))
    assert refused.value.param == "model" and "RecursionError" in str(refused.value)
    with pytest.raises(OpenAIError) as refused:
        own(processes, "{{ raise_exception('no system messages') }}")
    assert str(refused.value) == "The conversation was refused: no system messages"
    with pytest.raises(OpenAIError) as refused:
        own(processes, "{{ 1 // 0 }}")
    assert refused.value.param == "chat_template" and "ZeroDivisionError" in str(refused.value)
    # What msgpack cannot carry to the process (JSON's integers past 64 bits), and an
    # answer it cannot carry back (a lone surrogate): the client's 400s too.
    with pytest.raises(OpenAIError) as refused:
        own(processes, CHATML, extra={"n": 2**70})
    assert refused.value.param == "chat_template" and "cannot be given" in str(refused.value)
    with pytest.raises(OpenAIError) as refused:
        own(processes, "{{ '\\udcff' }}")
    assert "its prompt cannot be sent" in str(refused.value)
    with pytest.raises(OpenAIError) as refused:  # a prompt past 64 MiB stays in its process
        own(processes, "{{ ''|center(70000000) }}")
    assert "its prompt cannot be sent: ValueError: more than 64 MiB" in str(refused.value)
    assert own(processes, CHATML).startswith("<|im_start|>user")


def _peak_rss_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{% set s = 'x' * 10**9 %}{{ messages[0].content }}", "repeats a sequence past"),
        ("{{ [messages] * 2000000 }}", "repeats a sequence past"),
        ("{{ 10 ** 100000 }}", "is past 65536 bits"),
        # Squared twenty times: seconds in one multiplication, which no time bound stops.
        (
            "{% set ns = namespace(n=10) %}{% for i in range(24) %}"
            "{% set ns.n = ns.n * ns.n %}{% endfor %}",
            "product is past 65536 bits",
        ),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(30) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "joins sequences past",
        ),
    ],
)
def test_a_template_cannot_make_a_huge_value(template: str, said: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        render(generation(template), messages(("user", "x")))
    assert refused.value.param == "messages" and said in str(refused.value)
    # What templates multiply stays as it was.
    fine = "{{ '=' * 3 }}{{ 2 ** 10 }}{{ [1] * 2 }}{{ 'a' + 'b' }}{{ 3 * 4 }}"
    assert render(generation(fine), messages(("user", "x"))) == "===1024[1, 1]ab12"


def test_default_variables_are_under_the_requests_own() -> None:
    template = "{{ greeting }} {{ enable_thinking }} {{ messages[0]['content'] }}"
    chat = ChatSettings(default_kwargs={"greeting": "hola", "enable_thinking": False})

    def prompt(**fields: Any) -> str:
        body = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "hi"}], **fields}
        )
        return render_request(generation(template), body, None, chat)

    assert prompt() == "hola False hi"
    assert prompt(chat_template_kwargs={"greeting": "hi"}) == "hi False hi"
    # A request's reasoning effort turns thinking on over the defaults' (vLLM's order)...
    assert prompt(reasoning_effort="high") == "hola True hi"
    # ...but not over the request's own kwargs.
    kwargs = {"enable_thinking": False}
    assert prompt(reasoning_effort="high", chat_template_kwargs=kwargs) == "hola False hi"
    # --reasoning-effort-map rewrites the effort the template gets, thinking with it.
    mapped = ChatSettings(effort_map={"high": "none"})
    body = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"}
    )
    effort = "{{ reasoning_effort }} {{ enable_thinking }}"
    assert render_request(generation(effort), body, None, mapped) == "none False"
    # A request's null or "auto" leaves the default, as vLLM merges them.
    assert prompt(chat_template_kwargs={"greeting": None}) == "hola False hi"
    assert prompt(chat_template_kwargs={"greeting": "auto"}) == "hola False hi"


def test_default_documents_and_tools_are_where_a_request_sends_none() -> None:
    template = "{{ documents | tojson }} {{ tools | tojson }}"
    chat = ChatSettings(default_kwargs={"documents": [{"t": "d"}], "tools": ["x"]})

    def prompt(**fields: Any) -> str:
        body = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "hi"}], **fields}
        )
        return render_request(generation(template), body, fields.get("tools"), chat)

    assert prompt() == '[{"t": "d"}] ["x"]'
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert prompt(documents=[{"t": "mine"}], tools=tools) == (
        '[{"t": "mine"}] [{"type": "function", "function": {"name": "f"}}]'
    )


def test_a_template_that_refuses_parts_is_the_clients_400() -> None:
    template = "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}"
    with pytest.raises(OpenAIError) as refused:
        render(generation(template), messages(("user", "x")), content_format="openai")
    assert refused.value.param == "messages"


def test_tool_call_arguments_nested_past_the_parser_are_a_400() -> None:
    deep = "[" * 5000 + "]" * 5000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    conversation = [ChatMessage.model_validate({"role": "assistant", "tool_calls": [call]})]
    with pytest.raises(OpenAIError) as refused:
        render(generation(CHATML), conversation)
    assert refused.value.param == "messages[0].tool_calls[0].function.arguments"
