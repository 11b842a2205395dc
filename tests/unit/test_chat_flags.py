"""vLLM's chat flags on the command line: what each reads into the /v1 front end's chat
settings, and the usage errors (exit 2) a bad value gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from ge_serve.server.cli import parse_settings
from ge_serve.server.control.chat import ChatSettings
from ge_serve.server.startup.part_settings import http_settings

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def chat(*given: str) -> ChatSettings:
    return http_settings(parse_settings(["--model-repo", "m", *given])).chat


def refused(capsys: pytest.CaptureFixture[str], *given: str) -> str:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model-repo", "m", *given])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_without_the_flags_chats_render_as_before() -> None:
    assert chat() == ChatSettings(None, "auto", {}, False, "assistant")


def test_chat_template_reads_a_file_or_takes_the_template_itself(tmp_path: Path) -> None:
    path = tmp_path / "tool_chat_template.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    assert chat("--chat-template", str(path)).template == TEMPLATE
    assert chat(f"--chat-template={path}").template == TEMPLATE
    inline = "{{ messages[0]['content'] }}"
    assert chat("--chat-template", inline).template == inline
    # The last given wins, as argparse's: the others are not read.
    assert chat("--chat-template", inline, "--chat-template", str(path)).template == TEMPLATE
    missing = str(tmp_path / "missing.jinja")
    assert chat("--chat-template", missing, "--chat-template", inline).template == inline


def test_a_chat_template_path_that_does_not_open_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.jinja"
    err = refused(capsys, "--chat-template", str(missing))
    assert f"The supplied chat template ({missing}) looks like a file path, but it failed" in err
    assert "argument --chat-template: expected one argument" in refused(capsys, "--chat-template")


def test_the_other_chat_flags(capsys: pytest.CaptureFixture[str]) -> None:
    given = chat(
        "--chat-template-content-format", "openai",
        "--default-chat-template-kwargs", '{"enable_thinking": false, "n": 2}',
        "--trust-request-chat-template",
        "--response-role", "bot",
    )  # fmt: skip
    assert given == ChatSettings(None, "openai", {"enable_thinking": False, "n": 2}, True, "bot")
    assert not chat("--trust-request-chat-template=false").trust_request_template
    assert "invalid choice: 'html'" in refused(capsys, "--chat-template-content-format", "html")
    for bad in ("[]", "1", "{"):
        err = refused(capsys, "--default-chat-template-kwargs", bad)
        assert "--default-chat-template-kwargs takes a JSON object" in err
    # Any variable, as vLLM takes them (what a chat sets itself wins: test_chat_rendering).
    defaults = '{"documents": [{"title": "a"}], "add_generation_prompt": false}'
    assert chat("--default-chat-template-kwargs", defaults).default_kwargs == {
        "documents": [{"title": "a"}],
        "add_generation_prompt": False,
    }
    assert "argument --response-role: expected one argument" in refused(capsys, "--response-role")
    err = refused(capsys, "--trust-request-chat-template=perhaps")
    assert "argument --trust-request-chat-template: expected true or false" in err


def test_reasoning_effort_map(capsys: pytest.CaptureFixture[str]) -> None:
    given = chat("--reasoning-effort-map", '{"medium": "low", "xhigh": "max"}')
    assert given.effort_map == {"medium": "low", "xhigh": "max"}
    assert (given.effort("medium"), given.effort("high"), given.effort(None)) == (
        "low",
        "high",
        None,
    )
    err = refused(capsys, "--reasoning-effort-map", '{"medium": 1}')
    assert "Error: --reasoning-effort-map must be a JSON object mapping reasoning efforts" in err
    err = refused(capsys, "--reasoning-effort-map", '{"huge": "max"}')
    assert "Error: --reasoning-effort-map has unknown efforts ['huge']" in err
