"""A Triton launch line starts ge-serve: every `tritonserver --help` flag is accepted, and
each is either honoured or named in one warning with the reason it does nothing."""

from __future__ import annotations

import dataclasses
import logging
import shlex
from pathlib import Path

import pytest

from ge_serve.server.cli import parse_settings
from ge_serve.server.startup.flags import flag_of
from ge_serve.server.startup.part_settings import grpc_settings, scheduler_options, warn_about_flags
from ge_serve.server.startup.settings import Settings
from ge_serve.server.startup.tritonflags import INAPPLICABLE, warning

FLAG_LIST = Path(__file__).resolve().parent.parent / "data" / "tritonserver_r24_flags.txt"
REPO = ["--model-repository", "/models"]


def flag_lines() -> list[str]:
    lines = FLAG_LIST.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def expand(line: str, tmp_path: Path) -> list[str]:
    return shlex.split(line.format(tmp=tmp_path, repo="/models"))


def settings_flags() -> dict[str, str]:
    """Every flag name of a setting (and of its deprecated spelling) -> the setting."""
    found = {}
    for field in dataclasses.fields(Settings):
        spec = flag_of(field)
        aliases = (spec.true_alias[0],) if spec.true_alias else ()
        for name in (*spec.names, *aliases):
            found[name] = field.name
    return found


def test_the_list_is_tritons_whole_help() -> None:
    flags = [line.split()[0] for line in flag_lines()]
    assert len(flags) == len(set(flags)) == 85


@pytest.mark.parametrize("line", flag_lines())
def test_every_tritonserver_flag_is_accepted(line: str, tmp_path: Path) -> None:
    argv = expand(line, tmp_path)
    # As in Triton, --load-model needs explicit mode.
    mode = ["--model-control-mode=explicit"] if argv[0] == "--load-model" else []
    settings = parse_settings([*REPO, *mode, *argv])  # a usage error would exit 2
    flag = argv[0]
    inapplicable = {entry.flag for entry in INAPPLICABLE}
    if flag in inapplicable:
        assert settings.inapplicable == ((flag, argv[1]),)
        message = warning(settings.inapplicable)
        assert message is not None and flag in message, "named, with why"
    else:
        assert flag in settings_flags(), f"{flag} is neither honoured nor warned about"
        assert settings.inapplicable == ()


def test_one_warning_names_each_inapplicable_flag_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = parse_settings(
        [
            *REPO,
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            "--cuda-memory-pool-byte-size=1:0",
            "--repoagent-directory=/opt/tritonserver/repoagents",
            "--backend-directory=/srv/backends",  # honoured: Python-based backends
            "--model-namespacing=false",  # Triton's default: nothing to warn about
        ]
    )
    with caplog.at_level(logging.WARNING):
        warn_about_flags(settings)
    warnings = [r.getMessage() for r in caplog.records if "Triton compatibility" in r.getMessage()]
    assert len(warnings) == 1
    (message,) = warnings
    assert message.count("--cuda-memory-pool-byte-size") == 1
    assert "--pinned-memory-pool-byte-size (there is no CUDA device" in message
    assert "--repoagent-directory (repository agents" in message
    assert "--backend-directory" not in message
    assert settings.backend_directory == Path("/srv/backends")
    assert "--model-namespacing" not in message


def test_a_real_triton_launch_line(tmp_path: Path) -> None:
    line = (
        "--model-repository=/models --log-verbose=true --log-format=ISO8601 "
        "--log-file={tmp}/t.log --log-warning=false --model-control-mode=explicit "
        "--load-model=* --strict-model-config=false --exit-timeout-secs=10 "
        "--grpc-infer-response-compression-level=high --grpc-port=9001 "
        "--cache-config=local,size=1048576 --trace-config=triton,file={tmp}/trace.json "
        "--trace-config=level=TIMESTAMPS --trace-config=rate=1 --trace-config=count=-1 "
        "--rate-limit=execution_count --rate-limit-resource=R1:4 "
        "--pinned-memory-pool-byte-size=0 --cuda-memory-pool-byte-size=0:0 "
        "--model-load-thread-count=8 --model-config-name=cpu --id=edge-1 "
        "--backend-config=default-max-batch-size=8 --metrics-interval-ms=500.0 "
        "--http-thread-count=8"
    )
    settings = parse_settings(shlex.split(line.format(tmp=tmp_path)))
    assert settings.log_verbose == 1 and settings.log_format == "ISO8601"
    assert settings.log_file == f"{tmp_path}/t.log" and not settings.log_warning
    assert settings.load_models == ("*",) and settings.model_control_mode == "explicit"
    assert settings.cache_size() == 1048576
    trace = settings.trace()
    assert (trace.file, trace.level, trace.rate, trace.count) == (
        f"{tmp_path}/trace.json",
        ("TIMESTAMPS",),
        1,
        -1,
    )
    assert settings.rate_limit_resource == (("r1", 4, -1),)
    assert scheduler_options(settings).rate_limiter is not None
    assert settings.model_load_thread_count == 8 and settings.model_config_name == "cpu"
    assert settings.id == "edge-1" and settings.metrics_interval_ms == 500
    assert settings.backend_config == (("default-max-batch-size", "8"),)
    options = dict(grpc_settings(settings).channel_options())
    assert options["grpc.default_compression_level"] == 3
    assert {flag for flag, _ in settings.inapplicable} == {
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--http-thread-count",
    }


def test_deprecated_trace_flags_and_trace_config_agree() -> None:
    old = parse_settings(
        [*REPO, "--trace-file=/tmp/t", "--trace-level=TIMESTAMPS", "--trace-rate=5"]
    )
    new = parse_settings(
        [
            *REPO,
            "--trace-config=triton,file=/tmp/t",
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=5",
        ]
    )
    assert old.trace() == new.trace()
    both = parse_settings([*REPO, "--trace-rate=5", "--trace-config=rate=7"])
    assert both.trace().rate == 7, "--trace-config wins"


@pytest.mark.parametrize(
    ("word", "level"),
    [
        ("MIN", ("TIMESTAMPS",)),
        ("max", ("TIMESTAMPS",)),
        ("True", ("TIMESTAMPS",)),
        ("on", ("TIMESTAMPS",)),
        ("FALSE", ()),
        ("tensors", ("TENSORS",)),
    ],
)
def test_trace_levels_take_tritons_other_words(word: str, level: tuple[str, ...]) -> None:
    """Triton's qa starts servers with --trace-level=MIN / MAX (L0_cmdline_trace,
    L0_batcher); its parser also takes true, on and false, in any case."""
    old = parse_settings([*REPO, "--trace-file=/tmp/t", f"--trace-level={word}"])
    new = parse_settings(
        [*REPO, "--trace-config=triton,file=/tmp/t", f"--trace-config=level={word}"]
    )
    assert old.trace().level == new.trace().level == level


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--cache-config=local,size=10", "--response-cache-byte-size=10"],
            "Incompatible flags --response-cache-byte-size and --cache-config both provided",
        ),
        (["--cache-config=size=10"], "No cache specified. --cache-config option format is"),
        (["--cache-config=redis,host=x"], "cache 'redis' is not available"),
        (
            ["--cache-config=local,size=10", "--cache-config=redis,host=x"],
            "found multiple cache configurations, but only a single cache is currently supported",
        ),
        (["--response-cache-byte-size=-5"], "--response-cache-byte-size must be a byte count"),
        (["--metrics-config=summary_max_age_secs=inf"], "expected finite seconds > 0"),
        (["--trace-config=level=LOUD"], "invalid trace level 'LOUD'"),
        (["--trace-config=mode=zipkin"], "unknown trace mode 'zipkin'"),
        (["--rate-limit-resource=R1"], "--rate-limit-resource option format is"),
        (["--rate-limit=sometimes"], "invalid choice: 'sometimes'"),
        (["--log-format=json"], "invalid choice: 'json'"),
    ],
)
def test_bad_values_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings([*REPO, *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_grpc_connection_flags_reach_grpc() -> None:
    settings = parse_settings(
        [
            *REPO,
            "--grpc-http2-max-ping-strikes=0",
            "--grpc-max-connection-age=60000",
            "--grpc-max-connection-age-grace=5000",
            "--reuse-grpc-port=true",
        ]
    )
    options = dict(grpc_settings(settings).channel_options())
    assert options["grpc.http2.max_ping_strikes"] == 0
    assert options["grpc.max_connection_age_ms"] == 60000
    assert options["grpc.max_connection_age_grace_ms"] == 5000
    assert options["grpc.so_reuseport"] == 1
    assert "grpc.default_compression_level" not in dict(
        grpc_settings(parse_settings(REPO)).channel_options()
    )


def test_unknown_trace_settings_are_warned_about_and_ignored() -> None:
    """Triton ignores a --trace-config key it does not know; so does ge-serve, with a
    warning that names the key probably meant."""
    from ge_serve.server.observability.traceconfig import unknown_settings

    settings = parse_settings(
        [
            *REPO,
            "--trace-config=log_frequency=1",
            "--trace-config=triton,url=x",
            "--trace-config=rate=3",
        ]
    )
    assert settings.trace().rate == 3
    assert settings.trace().log_frequency == 0
    assert unknown_settings(settings.trace_config) == [
        "--trace-config: ignoring unknown global trace setting 'log_frequency'; "
        "did you mean 'triton,log_frequency'?",
        "--trace-config: ignoring unknown 'triton' trace setting 'url'; "
        "did you mean 'opentelemetry,url'?",
    ]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parse_settings([*REPO, *argv])
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # grpc core would bind 70000 modulo 65536 (4464) and the log would say 70000.
        (["--grpc-port", "70000"], "a port is 0 to 65535, got 70000"),
        (["--metrics-port", "-1"], "a port is 0 to 65535, got -1"),
        (["--exit-timeout-secs", "nan"], "expected a finite number of seconds >= 0, got 'nan'"),
        (["--repository-poll-secs", "inf"], "expected a finite number of seconds >= 0"),
        # Triton's text, which its qa greps for, "Error: " included.
        (["--http-max-input-size", "0"], "Error: --http-max-input-size must be greater than 0."),
        (
            ["--http-restricted-api=model-reposit,health:k1=v1"],
            "unknown restricted api 'model-reposit'",
        ),
        (
            ["--grpc-restricted-protocol=model-reposit,health:k1=v1"],
            "unknown restricted protocol 'model-reposit'",
        ),
        (
            [
                "--http-restricted-api=model-repository,health:k1=v1",
                "--http-restricted-api=metadata,health:k2=v2",
            ],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
        (
            [
                "--grpc-restricted-protocol=model-repository,health:k1=v1",
                "--grpc-restricted-protocol=metadata,health:k2=v2",
            ],
            "restricted protocol 'health' can not be specified in multiple config groups",
        ),
        (
            ["--load-model", "m"],
            "Use of '--load-model' requires setting '--model-control-mode=explicit' as well.",
        ),
        # Triton's checks of gRPC flags that do nothing here (qa L0_sequence_stress
        # expects the server not to start), in its words.
        *(
            (
                [f"--grpc-infer-thread-count={count}"],
                "invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128.",
            )
            for count in (-1, 0, 1, 129)
        ),
        (
            ["--grpc-max-response-pool-size=0"],
            "Error: --grpc-max-response-pool-size must be greater than 0.",
        ),
        (["--grpc-infer-thread-count=abc"], "Invalid option value. Got abc"),
        (["--grpc-infer-allocation-pool-size=many"], "Invalid option value. Got many"),
        (
            ["--grpc-max-response-pool-size=99999999999"],
            "Provided option value is out of bound. Got 99999999999",
        ),
        (
            # Triton's CheckPortCollision: the safe range must hold the other endpoints.
            ["--allow-sagemaker=true", "--sagemaker-safe-port-range=8081-9000"],
            "The server cannot listen to HTTP requests at port 8000, allowed port range is "
            "[8081, 9000]",
        ),
        (
            ["--allow-vertex-ai=true", "--vertex-ai-port=8001"],
            "The server cannot listen to GRPC requests and Vertex AI requests at the same "
            "address and port 0.0.0.0:8001",
        ),
        (
            # A cloud endpoint that is on needs a port in range, as HTTP and gRPC do.
            ["--allow-sagemaker=true", "--sagemaker-port=70000"],
            "--sagemaker-port: a port is 0 to 65535, got 70000",
        ),
        (["--allow-sagemaker=yes"], "invalid value for bool option: yes"),
        (["--sagemaker-safe-port-range=8081"], "requires format <first>-<second>. Found: 8081"),
    ],
)
def test_values_triton_refuses_or_that_would_misbehave_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in usage_error(argv, capsys)


def test_a_cloud_port_out_of_range_is_read_when_its_endpoint_is_off() -> None:
    settings = parse_settings([*REPO, "--sagemaker-port=70000", "--vertex-ai-port=-1"])
    assert settings.cloud.sagemaker_port == 70000 and not settings.cloud.allow_sagemaker


def test_choice_values_take_any_case_as_in_triton() -> None:
    settings = parse_settings(
        [
            *REPO,
            "--model-control-mode=EXPLICIT",
            "--rate-limit=EXECUTION_COUNT",
            "--grpc-infer-response-compression-level=High",
        ]
    )
    assert settings.model_control_mode == "explicit"
    assert settings.rate_limit == "execution_count"
    assert settings.grpc_infer_response_compression_level == "high"


@pytest.mark.parametrize(
    "argv",
    [
        ["--enable-peer-access=false"],  # r24.10
        ["--grpc-infer-thread-count=4"],  # r25.x
        ["--grpc-infer-thread-count=2"],
        ["--grpc-infer-thread-count=128"],
        ["--grpc-max-response-pool-size=16"],
        # As C's stoi reads them (Triton's ParseOption<int>): what follows the digits is
        # ignored.
        ["--grpc-max-response-pool-size=1.5"],
        ["--grpc-infer-allocation-pool-size= 8"],
        ["--sagemaker-thread-count=8"],
    ],
)
def test_later_releases_flags_are_accepted_and_named(argv: list[str]) -> None:
    settings = parse_settings([*REPO, *argv])
    message = warning(settings.inapplicable)
    assert message is not None and argv[0].split("=")[0] in message


def test_client_shared_memory_is_off_unless_asked_for() -> None:
    # Triton's default (command_line_parser.h): a client must not make the server map and
    # write its /dev/shm objects unless the operator allows it.
    assert parse_settings([*REPO]).allow_client_shm is False
    assert parse_settings([*REPO, "--allow-client-shm=true"]).allow_client_shm is True


def test_the_vertex_ai_environment_sets_defaults_the_command_line_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Triton's command_line_parser.cc: AIP_MODE=PREDICTION turns Vertex AI on and HTTP
    # and gRPC off; AIP_STORAGE_URI is the repository when none is given.
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_STORAGE_URI", "/vertex/models")
    monkeypatch.setenv("AIP_HTTP_PORT", "5234")
    settings = parse_settings([])
    assert settings.cloud.allow_vertex_ai and settings.cloud.vertex_ai_port == 5234
    assert not settings.allow_http and not settings.allow_grpc
    assert settings.model_repositories == (Path("/vertex/models"),)
    given = parse_settings([*REPO, "--allow-http=true", "--allow-vertex-ai=false"])
    assert given.allow_http and not given.cloud.allow_vertex_ai
    assert given.model_repositories == (Path("/models"),)
