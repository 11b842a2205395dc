"""vLLM's flags of how its HTTP server serves, read as vLLM reads them, into one recorded
setting (`Settings.serving`) that part_settings.py hands to the front end (the last value
of a flag wins, as argparse's; a switch may be given alone, meaning true, or with a BOOL):

- `--sse-keep-alive-interval N`: whole seconds, 0 (off) by default; a negative number is
  refused in vLLM's words. /v1 chat and completions streams send `: keep-alive` when idle
  that long (http/openai/keepalive.py).
- `--root-path PATH`: the prefix of a proxy that routes by path, FastAPI's `root_path` in
  vLLM (http/rootpath.py); "" (given empty or alone) or "/": none. It must start with
  "/", and a trailing "/" is dropped (with it, no prefixed path would reach a route).
- `--disable-fastapi-docs`: no `/openapi.json` (404), as vLLM's; ge-serve serves no
  `/docs` or `/redoc` pages either way (http/app.py).
- `--enable-server-load-tracking`: GET /load counts (http/openai/serverload.py).
- `--uvicorn-log-level`, `--disable-uvicorn-access-log` and
  `--disable-access-log-for-endpoints` (one comma-separated list, as vLLM's):
  control/uvicornlogs.py.
- `--enable-tokenizer-info-endpoint`: taken for vLLM's launch lines; GET /tokenizer_info
  is served without it (http/openai/tokenize.py).
- `--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`, `--ssl-cert-reqs` (0, 1 or 2:
  ssl's CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED) and `--ssl-ciphers`: HTTPS on the HTTP
  port (control/tls.py), its files read and checked here.
- `--enable-log-requests`, `--max-log-len N`, `--enable-log-outputs` (which needs
  `--enable-log-requests`, as vLLM's) and `--enable-log-deltas` (true by default):
  control/requestlog.py.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ..control.requestlog import RequestLogging
from ..control.tls import HttpTls
from ..control.uvicornlogs import LEVELS, UvicornLogs
from .flags import Flag, flag, given_value, switch_value

_KEEP_ALIVE: Final = "--sse-keep-alive-interval"
_ROOT_PATH: Final = "--root-path"
_LEVEL: Final = "--uvicorn-log-level"
_NO_ACCESS_LOG: Final = "--disable-uvicorn-access-log"
_NOT_LOGGED: Final = "--disable-access-log-for-endpoints"
_MAX_LOG_LEN: Final = "--max-log-len"
# The TLS flags, and their fields.
_TLS: Final = {
    "--ssl-keyfile": "keyfile",
    "--ssl-certfile": "certfile",
    "--ssl-ca-certs": "ca_certs",
    "--ssl-cert-reqs": "cert_reqs",
    "--ssl-ciphers": "ciphers",
}
# The request log's switches, and their fields.
_LOG_SWITCHES: Final = {
    "--enable-log-requests": "requests",
    "--enable-log-outputs": "outputs",
    "--enable-log-deltas": "deltas",
}
# vLLM's (argparse's BooleanOptionalAction) spelling of them off: `--no-enable-log-deltas`
# is vLLM's one way to turn the deltas off.
_LOG_NEGATED: Final = {f"--no-{name[2:]}": key for name, key in _LOG_SWITCHES.items()}
# Each switch among them, and its field.
_SWITCHES: Final = {
    "--disable-fastapi-docs": "disable_fastapi_docs",
    "--enable-server-load-tracking": "load_tracking",
    "--enable-tokenizer-info-endpoint": "tokenizer_info",
}


@dataclass(frozen=True, slots=True)
class Serving:
    sse_keep_alive_interval: int = 0
    root_path: str = ""
    disable_fastapi_docs: bool = False
    load_tracking: bool = False
    tokenizer_info: bool = False
    uvicorn: UvicornLogs = field(default_factory=UvicornLogs)
    log: RequestLogging = field(default_factory=RequestLogging)
    tls: HttpTls = field(default_factory=HttpTls)


def flags() -> Mapping[str, Flag]:
    return flag(
        _KEEP_ALIVE,
        _ROOT_PATH,
        *_SWITCHES,
        _LEVEL,
        _NO_ACCESS_LOG,
        _NOT_LOGGED,
        *_LOG_SWITCHES,
        *_LOG_NEGATED,
        _MAX_LOG_LEN,
        *_TLS,
        record_flag=True,
        bare=True,
        check=_read,
        metavar="VALUE",
        help="vLLM's: --sse-keep-alive-interval N: /v1 chat and completions streams send an "
        "SSE comment ': keep-alive' after N idle seconds (0, the default: never); "
        "--root-path PATH: the prefix of a proxy that routes by path (paths are served "
        "with and without it); --disable-fastapi-docs: no /openapi.json; "
        "--enable-server-load-tracking counts the requests in progress on vLLM's "
        "inference routes, which GET /load answers (0 when off); "
        f"{_LEVEL} {{{','.join(LEVELS)}}} (default: warning) sets uvicorn's loggers, and "
        f"from info on writes its access log, unless {_NO_ACCESS_LOG}, without the paths "
        f"of {_NOT_LOGGED} PATH[,PATH...]; --enable-tokenizer-info-endpoint is taken, "
        "GET /tokenizer_info being always served; --enable-log-requests logs each /v1 "
        "generation request (its prompt with --log-verbose), --enable-log-outputs its "
        "answer (a stream's pieces too, unless --enable-log-deltas=false), "
        "--max-log-len N cuts what is logged of a prompt or an answer; --ssl-certfile, "
        "--ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs 0|1|2, --ssl-ciphers: HTTPS on "
        "the HTTP port",
    )


def _integer(name: str, text: str) -> int:
    try:
        return int(given_value(name, text))
    except ValueError as exc:
        if not text:
            raise  # given alone: given_value's words
        raise ValueError(f"argument {name}: invalid int value: '{text}'") from exc


def _interval(name: str, text: str) -> int:
    seconds = _integer(name, text)
    if seconds < 0:
        raise ValueError(
            f"Error: {name} must be a non-negative integer (0 disables keep-alive comments)."
        )
    return seconds


def _length(name: str, text: str) -> int:
    length = _integer(name, text)
    if length < 0:
        raise ValueError(f"argument {name}: must be 0 or more, got {length}")
    return length


def _tls(given: dict[str, str]) -> HttpTls:
    """HTTPS's settings, its files loaded once to check them as uvicorn will load them."""
    if not given:
        return HttpTls()
    if "certfile" not in given:
        raise ValueError("--ssl-certfile is needed for HTTPS (the other --ssl-* flags refine it)")
    reqs = given.pop("cert_reqs", "0")
    if reqs not in ("0", "1", "2"):
        raise ValueError(
            f"argument --ssl-cert-reqs: invalid choice: '{reqs}' (choose from 0, 1, 2)"
        )
    if reqs != "0" and "ca_certs" not in given:
        raise ValueError("--ssl-cert-reqs 1 or 2 checks clients' certificates: give --ssl-ca-certs")
    found = HttpTls(**given, cert_reqs=int(reqs))
    _load(found)
    return found


class _Encrypted(Exception):
    """A key that asks for a pass phrase."""


def _refuse_pass_phrase() -> str:
    raise _Encrypted


def _load(tls: HttpTls) -> None:
    """The files loaded as uvicorn will load them, each problem named by its flag."""
    for flag_name, path in (
        ("--ssl-certfile", tls.certfile),
        ("--ssl-keyfile", tls.keyfile),
        ("--ssl-ca-certs", tls.ca_certs),
    ):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag_name}: no such file: {path}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile or None, _refuse_pass_phrase)
    except _Encrypted:
        raise ValueError(
            "--ssl-keyfile: the key is encrypted; give it without a pass phrase (vLLM, "
            "like this server, takes none)"
        ) from None
    except ssl.SSLError as exc:
        where = "--ssl-certfile" if not tls.keyfile else "--ssl-certfile and --ssl-keyfile"
        raise ValueError(
            f"{where}: no certificate and its private key load from them ({exc})"
        ) from None
    try:
        if tls.ca_certs:
            context.load_verify_locations(tls.ca_certs)
    except ssl.SSLError as exc:
        raise ValueError(f"--ssl-ca-certs: no certificates load from it ({exc})") from None
    try:
        if tls.ciphers:
            context.set_ciphers(tls.ciphers)
    except ssl.SSLError:
        raise ValueError(f"--ssl-ciphers: no cipher matches '{tls.ciphers}'") from None


def _root_path(name: str, text: str) -> str:
    if text and not text.startswith("/"):
        raise ValueError(f"{name} must start with '/', got '{text}'")
    return text.rstrip("/")


def _level(name: str, text: str) -> str:
    if given_value(name, text).lower() not in LEVELS:
        choices = ", ".join(f"'{level}'" for level in LEVELS)
        raise ValueError(f"argument {name}: invalid choice: '{text}' (choose from {choices})")
    return text.lower()


def _read(_name: str, given: Sequence[tuple[str, str]]) -> Serving:
    values: dict[str, Any] = {}
    logs = UvicornLogs()
    requests = RequestLogging()
    tls: dict[str, Any] = {}
    for name, text in dict(given).items():  # the last of each, as argparse keeps it
        if name in _SWITCHES:
            values[_SWITCHES[name]] = switch_value(name, text)
        elif name == _KEEP_ALIVE:
            values["sse_keep_alive_interval"] = _interval(name, text)
        elif name == _ROOT_PATH:
            values["root_path"] = _root_path(name, text)
        elif name in _TLS:
            tls[_TLS[name]] = given_value(name, text)
        elif name in _LOG_SWITCHES:
            requests = replace(requests, **{_LOG_SWITCHES[name]: switch_value(name, text)})
        elif name in _LOG_NEGATED:
            requests = replace(requests, **{_LOG_NEGATED[name]: not switch_value(name, text)})
        elif name == _MAX_LOG_LEN:
            requests = replace(requests, max_len=_length(name, text))
        elif name == _NO_ACCESS_LOG:
            logs = replace(logs, access_log=not switch_value(name, text))
        elif name == _LEVEL:
            logs = replace(logs, level=_level(name, text))
        else:  # vLLM's: one comma-separated list, blanks dropped
            paths = given_value(name, text).split(",")
            logs = replace(logs, excluded=tuple(p.strip() for p in paths if p.strip()))
    if requests.outputs and not requests.requests:
        raise ValueError("Error: --enable-log-outputs requires --enable-log-requests")
    return Serving(**values, uvicorn=logs, log=requests, tls=_tls(tls))
