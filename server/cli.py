"""Command line: argv becomes frozen settings; `main` hands them to the composition root.

The parser is generated from the fields of `Settings` (server/startup/settings.py), which hold
every flag's name, default and help; nothing here names a setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from ge_serve.backends.text_bool import parse_bool

from .startup.cloudflags import environment_argv
from .startup.combined import check_combined
from .startup.flags import Flag, flag_of
from .startup.grpc_core import grpc_core_environment
from .startup.settings import Settings


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Our parse functions' ValueError messages, as argparse's usage errors.

    Types (int, float, Path) are left to argparse, which names them in its own message.
    """
    if isinstance(parse, type):
        return parse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _alias_dest(setting: str) -> str:
    return f"{setting}:alias"


class _RecordFlag(argparse.Action):
    """Appends (the flag as written, its value): one setting for many flags."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        getattr(namespace, self.dest).append((option_string or "", str(values)))


def _help(setting: dataclasses.Field[Any], spec: Flag) -> str:
    """The flag's help line, ending with its default (argparse's %-format escaped)."""
    text = (spec.help or "").replace("%", "%%")
    if (
        spec.repeat
        or spec.several
        or spec.record_flag
        or spec.fallback is not None
        or spec.required
    ):
        return text
    default = setting.default
    if isinstance(default, bool):
        shown = "true" if default else "false"
    elif default is None or default == "":
        shown = "none"
    else:
        shown = str(default)
    return f"{text} (default: {shown})"


def _arguments(setting: dataclasses.Field[Any], spec: Flag) -> dict[str, Any]:
    if spec.record_flag:
        recorded: dict[str, Any] = {
            "dest": setting.name,
            "action": _RecordFlag,
            "default": [],
            "metavar": spec.metavar,
            "help": _help(setting, spec),
        }
        if spec.bare:  # a flag of the group given alone records "" (its check reads it)
            recorded["nargs"], recorded["const"] = "?", ""
        return recorded
    if spec.switch:
        return {"dest": setting.name, "action": "store_true", "help": _help(setting, spec)}
    options: dict[str, Any] = {"dest": setting.name, "help": _help(setting, spec)}
    if spec.repeat:
        options["action"] = "append"
        options["default"] = []
    elif spec.several:
        options["action"], options["nargs"], options["default"] = "extend", "+", []
    elif spec.fallback is not None or (spec.parse is not None and isinstance(setting.default, str)):
        # argparse passes a str default through `type`; a default is the value as it is,
        # never parsed (an empty --model-config-name is refused, its empty default is not).
        options["default"] = None
    else:
        options["default"] = setting.default
    if spec.parse is not None:
        options["type"] = _argument_type(spec.parse)
    if spec.bare:  # `--flag` alone is true; `--flag=false` still parses
        options["nargs"], options["const"] = "?", True
    if spec.metavar is not None:
        options["metavar"] = spec.metavar
    if spec.choices:
        options["choices"] = spec.choices
    if spec.required:
        options["required"] = True
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ge-serve",
        description="Triton-compatible inference server for Ascend NPUs (CANN/GE), "
        "with a simulated device and a host CPU backend.",
    )
    sections: dict[str | None, Callable[..., argparse.Action]] = {None: parser.add_argument}
    for setting in dataclasses.fields(Settings):
        spec = flag_of(setting)
        if spec.group not in sections:
            sections[spec.group] = parser.add_argument_group(spec.group).add_argument
        add = sections[spec.group]
        add(*spec.names, **_arguments(setting, spec))
        if spec.true_alias is not None:
            name, help_text = spec.true_alias
            add(
                name,
                dest=_alias_dest(setting.name),
                type=_argument_type(parse_bool),
                default=None,
                metavar="BOOL",
                help=help_text,
            )
    return parser


def parse_settings(argv: list[str]) -> Settings:
    parser = build_parser()
    # The Vertex AI environment's defaults, which the command line overrides.
    args = vars(parser.parse_args(environment_argv(argv, os.environ)))
    values: dict[str, Any] = {}
    for setting in dataclasses.fields(Settings):
        spec = flag_of(setting)
        value = args[setting.name]
        if spec.repeat or spec.several:
            value = tuple(value)
        if spec.env is not None and not value:
            value = (os.environ.get(spec.env, ""),)
        if spec.fallback is not None and not value:
            value = values[spec.fallback]
        elif value is None and isinstance(setting.default, str):
            value = setting.default
        if spec.true_alias is not None and args[_alias_dest(setting.name)]:
            value = True
        if spec.check is not None:
            try:
                value = spec.check(spec.names[0], value)
            except ValueError as exc:
                parser.error(str(exc))
        values[setting.name] = value
    settings = Settings(**values)
    try:  # settings read together: a contradiction is a usage error too
        settings.cache_size()
        settings.trace()
        check_combined(settings)
    except ValueError as exc:
        parser.error(str(exc))
    return settings


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    # Read by grpc core as it loads: set while the composition root imports grpc, then
    # taken back, so that the processes this one starts (Python models' workers) do not
    # inherit it; the gRPC front-end workers are given it (server/app.py).
    chosen = grpc_core_environment(os.environ)
    os.environ.update(chosen)
    from .app import run  # the composition root; imported late so --help stays fast

    for name in chosen:
        os.environ.pop(name, None)

    return run(settings)


if __name__ == "__main__":
    if __spec__ is not None and __spec__.name != "ge_serve.server.cli":
        # `python -m server.cli` from a checkout imports the server's modules twice, as
        # `server.*` and `ge_serve.server.*`, and the two copies' errors are not each
        # other's: client mistakes would come back as 500s, and generative models would
        # not be found.
        sys.exit(f"run `ge-serve` or `python -m ge_serve.server.cli`, not {__spec__.name}")
    sys.exit(main())
