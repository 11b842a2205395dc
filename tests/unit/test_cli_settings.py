"""argv to frozen settings, and settings to the parts the composition root builds."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ge_serve.server.app import ServerApp, configure_gil
from ge_serve.server.cli import build_parser, parse_settings
from ge_serve.server.control.cors import CorsSettings
from ge_serve.server.http.app import HttpSettings
from ge_serve.server.startup.flags import flag_of
from ge_serve.server.startup.part_settings import default_max_batch_size, http_settings
from ge_serve.server.startup.settings import Settings


def test_defaults_are_tritons() -> None:
    settings = parse_settings(["--model-repository", "/models"])
    assert settings.model_repositories == (Path("/models"),)
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.exit_on_error and settings.strict_readiness
    assert settings.exit_timeout_secs == 30.0
    assert settings.http_max_input_size == 64 * 1024 * 1024
    assert not settings.disable_auto_complete_config
    assert settings.model_control_mode == "none"


def test_the_flags_defaults_are_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """One place for defaults: a bare command line gives exactly the dataclass's values."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)  # --api-key's, where it is absent
    assert parse_settings(["--model-repo", "m"]) == Settings(model_repositories=(Path("m"),))


def test_every_setting_is_a_flag() -> None:
    options = {name for action in build_parser()._actions for name in action.option_strings}
    for setting in dataclasses.fields(Settings):
        assert set(flag_of(setting).names) <= options, setting.name


def test_metrics_address_defaults_to_the_http_address() -> None:
    settings = parse_settings(["--model-repo", "m", "--http-address", "127.0.0.2"])
    assert settings.metrics_address == "127.0.0.2"
    settings = parse_settings(
        ["--model-repo", "m", "--http-address", "127.0.0.2", "--metrics-address", "127.0.0.3"]
    )
    assert settings.metrics_address == "127.0.0.3"


def test_backend_config_becomes_backend_dot_key() -> None:
    settings = parse_settings(
        ["--model-repo", "m", "--backend-config", "ge,a=1", "--backend-config", "onnxruntime,b = 2"]
    )
    assert settings.backend_config == (("ge.a", "1"), ("onnxruntime.b", "2"))


def test_bad_backend_config_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", "--backend-config", "ge,novalue"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --backend-config: expected <key>=<value>, got 'novalue'" in err


@pytest.mark.parametrize(
    ("flags", "onnxruntime", "ge"),
    [
        ([], 4, 4),
        (["default-max-batch-size=6"], 6, 6),
        (["default-max-batch-size=7", "default-max-batch-size=8"], 8, 8),
        (["onnxruntime,default-max-batch-size=5", "default-max-batch-size=6"], 5, 6),
        (["npu_ge,default-max-batch-size=0", "default-max-batch-size=6"], 6, 0),
        (["ge,default-max-batch-size=2", "npu_ge,default-max-batch-size=3"], 4, 3),
    ],
)
def test_default_max_batch_size_per_backend_over_global_over_4(
    flags: list[str], onnxruntime: int, ge: int
) -> None:
    argv = ["--model-repo", "m", *(f"--backend-config={flag}" for flag in flags)]
    settings = parse_settings(argv)
    assert default_max_batch_size(settings, "onnxruntime") == onnxruntime
    assert default_max_batch_size(settings, "ge", "npu_ge") == ge


@pytest.mark.parametrize(
    "flag",
    [
        "default-max-batch-size=x",
        "onnxruntime,default-max-batch-size=-1",
    ],
)
def test_a_bad_default_max_batch_size_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", f"--backend-config={flag}"])
    assert info.value.code == 2
    assert "default-max-batch-size: expected an integer >= 0, got" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            ",default-max-batch-size=3",
            "No backend specified. --backend-config option format is <backend name>,"
            "<setting>=<value> or <setting>=<value>. Got ,default-max-batch-size=3",
        ),
        (
            "default-max-batch-size=",
            "--backend-config option format is '<backend name>,<setting>=<value>'. "
            "Got default-max-batch-size=",
        ),
        (
            "python,=3",
            "--backend-config option format is '<backend name>,<setting>=<value>'. Got python,=3",
        ),
    ],
)
def test_backend_config_without_a_backend_setting_or_value_is_refused_as_triton_does(
    capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", f"--backend-config={flag}"])
    assert info.value.code == 2
    assert f"argument --backend-config: {message}" in capsys.readouterr().err


def test_an_empty_model_config_name_is_refused_as_triton_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_settings(["--model-repo", "m"]).model_config_name == ""
    assert parse_settings(["--model-repo", "m", "--model-config-name=cpu"]).model_config_name == (
        "cpu"
    )
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", "--model-config-name="])
    assert info.value.code == 2
    assert "argument --model-config-name: empty argument" in capsys.readouterr().err


def test_model_repo_alias_and_repeats() -> None:
    settings = parse_settings(
        ["--model-repo", "a", "--model-repository", "b", "--model-store", "c"]
    )
    assert settings.model_repositories == (Path("a"), Path("b"), Path("c"))


def test_a_repository_given_twice_is_one_repository(tmp_path: Path) -> None:
    # As Triton's set of paths: else every model in it is in "two" repositories.
    (tmp_path / "repo").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "repo")
    given = [tmp_path / "repo", tmp_path / "other", tmp_path / "repo", tmp_path / "link"]
    settings = parse_settings([arg for path in given for arg in ("--model-repository", str(path))])
    assert settings.model_repositories == (tmp_path / "repo", tmp_path / "other")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--exit-on-error=false"], False),
        (["--exit-on-error", "0"], False),
        (["--exit-on-error=true"], True),
        (["--exit-on-error", "yes"], True),
    ],
)
def test_boolean_flags(argv: list[str], expected: bool) -> None:
    assert parse_settings(["--model-repo", "m", *argv]).exit_on_error is expected


def test_bad_boolean_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", "--exit-on-error=maybe"])
    assert info.value.code == 2
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["--disable-auto-complete-config"], ["--strict-model-config=true"]]
)
def test_auto_complete_off_reaches_the_lifecycle(argv: list[str]) -> None:
    settings = parse_settings(["--model-repo", "m", *argv])
    assert settings.disable_auto_complete_config
    app = ServerApp(settings)
    assert app.lifecycle.settings.autocomplete is False


def test_settings_reach_the_parts(tmp_path: Path) -> None:
    settings = parse_settings(
        [
            "--model-repo", str(tmp_path),
            "--http-max-input-size", "1234",
            "--exit-timeout-secs", "2.5",
            "--strict-readiness=false",
        ]
    )  # fmt: skip
    app = ServerApp(settings)
    assert app.http.settings.max_input_size == 1234
    assert app.lifecycle.settings.autocomplete is True
    assert app.lifecycle.settings.unload_timeout_s == 2.5
    assert app.core.strict_readiness is False
    assert app.repository.paths == [tmp_path]


@pytest.fixture
def restore_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("restore_switch_interval")
@pytest.mark.parametrize(
    ("argv", "expected_s"), [([], 0.001), (["--gil-switch-interval-us", "250"], 0.00025)]
)
def test_gil_switch_interval_is_applied(argv: list[str], expected_s: float) -> None:
    sys.setswitchinterval(0.005)
    configure_gil(parse_settings(["--model-repo", "m", *argv]))
    assert sys.getswitchinterval() == pytest.approx(expected_s)


@pytest.mark.usefixtures("restore_switch_interval")
def test_gil_switch_interval_zero_leaves_pythons_setting() -> None:
    sys.setswitchinterval(0.005)
    configure_gil(parse_settings(["--model-repo", "m", "--gil-switch-interval-us", "0"]))
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_negative_gil_switch_interval_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", "--gil-switch-interval-us", "-1"])
    assert info.value.code == 2
    assert "--gil-switch-interval-us must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--log-verbose", "-1"], "expected a verbose level (0 to 4294967295) or true/false"),
        (["--log-verbose", str(2**32)], "got '4294967296'"),
        (["--log-file", "/nonexistent/dir/x.log"], "--log-file: cannot open "
         "'/nonexistent/dir/x.log': No such file or directory"),
    ],
)  # fmt: skip
def test_bad_logging_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_log_file_that_can_be_opened_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    settings = parse_settings(["--model-repo", "m", "--log-file", str(path), "--log-verbose=2"])
    assert (settings.log_file, settings.log_verbose) == (str(path), 2)


def test_every_flag_has_help_and_shows_its_default() -> None:
    """`ge-serve --help` as a newcomer reads it: one line of help for every flag, and the
    default where the flag has one value."""
    import io
    from contextlib import redirect_stdout

    from ge_serve.server.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{action.option_strings} has no help"
    out = io.StringIO()
    with redirect_stdout(out):
        parser.print_help()
    text = " ".join(out.getvalue().split())
    assert (
        "--http-address HTTP_ADDRESS, --host HTTP_ADDRESS address the HTTP endpoint binds" in text
    )
    assert "(default: 0.0.0.0)" in text and "(default: 8001)" in text
    assert "--log-verbose LEVEL" in text and "GRPC_VERBOSITY" in text


def test_reasoning_parser_reaches_the_http_front_end(capsys: pytest.CaptureFixture[str]) -> None:
    settings = parse_settings(["--model-repo", "m", "--reasoning-parser", "qwen3"])
    assert http_settings(settings).tools.reasoning_parser == "qwen3"
    assert http_settings(parse_settings(["--model-repo", "m"])).tools.reasoning_parser == ""
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model-repo", "m", "--reasoning-parser", "step3"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--reasoning-parser: invalid choice: 'step3'" in err
    assert "'deepseek_r1', 'granite', 'mistral', 'olmo3', 'qwen3'" in err


def test_prompt_tokens_details_given_alone_or_as_a_bool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # vLLM's flag, given alone; ge-serve's BOOL spelling parses too.
    def details(*given: str) -> bool:
        settings = parse_settings(["--model-repo", "m", *given, "--http-port", "9000"])
        return http_settings(settings).tools.prompt_tokens_details

    assert details() is False
    assert details("--enable-prompt-tokens-details") is True
    assert details("--enable-prompt-tokens-details=true") is True
    assert details("--enable-prompt-tokens-details", "false") is False
    assert details("--enable-prompt-tokens-details=false") is False
    with pytest.raises(SystemExit) as info:
        details("--enable-prompt-tokens-details=maybe")
    assert info.value.code == 2
    assert "--enable-prompt-tokens-details" in capsys.readouterr().err


def test_api_key_flag_and_vllm_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's --api-key KEY [KEY ...]; VLLM_API_KEY where the flag is absent; empty keys
    # are none (an empty flag or variable checks nothing).
    def keys(*given: str) -> tuple[str, ...]:
        return http_settings(parse_settings(["--model-repo", "m", *given])).api_keys

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert keys() == ()
    assert keys("--api-key", "a", "b", "--http-port", "9000") == ("a", "b")
    assert keys("--api-key", "a", "--api-key=c") == ("a", "c")
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert keys() == ("from-env",)
    assert keys("--api-key", "k") == ("k",)  # the flag wins, as in vLLM
    assert keys("--api-key", "") == ()
    monkeypatch.setenv("VLLM_API_KEY", "")
    assert keys() == ()


def test_the_api_key_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    from contextlib import redirect_stdout

    monkeypatch.setenv("VLLM_API_KEY", "env-s3cret")
    settings = parse_settings(["--model-repo", "m", "--api-key", "flag-s3cret"])
    assert settings.api_key == ("flag-s3cret",)
    for shown in (repr(settings), repr(http_settings(settings))):
        assert "s3cret" not in shown
    out = io.StringIO()
    with redirect_stdout(out):
        build_parser().print_help()
    text = " ".join(out.getvalue().split())
    assert "--api-key KEY [KEY ...]" in text and "(default: $VLLM_API_KEY;" in text
    assert "s3cret" not in text


def test_cors_flags_are_read_as_vllm_reads_them(capsys: pytest.CaptureFixture[str]) -> None:
    def cors(*given: str) -> CorsSettings:
        return http_settings(parse_settings(["--model-repo", "m", *given])).cors

    assert cors() == CorsSettings((), ("*",), ("*",), False)
    given = cors(
        "--allowed-origins", '["https://a.example", "https://b.example"]',
        '--allowed-methods=["GET", "POST"]', "--allowed-headers", "[]",
        "--allow-credentials", "--http-port", "9000",
    )  # fmt: skip
    assert given == CorsSettings(
        ("https://a.example", "https://b.example"), ("GET", "POST"), (), True
    )
    assert cors("--allowed-origins", '["*"]', "--allowed-origins", "[]").allowed_origins == ()
    assert not cors("--allow-credentials=false").allow_credentials
    for bad in ("*", '"*"', "[1]", "{}"):
        with pytest.raises(SystemExit) as exited:
            parse_settings(["--model-repo", "m", "--allowed-origins", bad])
        assert exited.value.code == 2
        assert f"--allowed-origins takes a JSON list of strings, e.g. '[\"*\"]', got '{bad}'" in (
            capsys.readouterr().err
        )
    for argv, message in (
        (["--allowed-origins"], "argument --allowed-origins: expected one argument"),
        (["--allow-credentials=maybe"], "argument --allow-credentials: expected true or false"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse_settings(["--model-repo", "m", *argv])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err


def test_vllms_switches_reach_the_front_end(capsys: pytest.CaptureFixture[str]) -> None:
    def http(*given: str) -> HttpSettings:
        return http_settings(parse_settings(["--model-repo", "m", *given]))

    plain = http()
    assert not plain.request_id_headers and http("--enable-request-id-headers").request_id_headers
    for flag, name in (
        ("--enable-force-include-usage", "force_include_usage"),
        ("--return-tokens-as-token-ids", "tokens_as_ids"),
        ("--exclude-tools-when-tool-choice-none", "exclude_tools_when_none"),
    ):
        assert not getattr(plain.tools, name) and getattr(http(flag).tools, name), flag
    # vLLM's --enable-auto-tool-choice: taken, and it needs a parser, as in vLLM.
    argv = ["--model-repo", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert parse_settings(argv).enable_auto_tool_choice
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv[:3])
    assert exited.value.code == 2
    assert "--enable-auto-tool-choice requires --tool-call-parser" in capsys.readouterr().err


def test_the_parser_flags_name_every_parser_the_front_end_has() -> None:
    from ge_serve.server.http.openai import reasoning, toolparse
    from ge_serve.server.startup.vllmflags import REASONING_PARSERS, TOOL_PARSERS

    assert sorted(TOOL_PARSERS) == sorted(toolparse.PARSERS)
    assert sorted(REASONING_PARSERS) == sorted(reasoning.PARSERS)
