"""--grpc-use-ssl and --grpc-use-ssl-mutual, read as Triton reads them: one setting, where
the last flag given wins.

Triton (command_line_parser.cc) sets use_ssl from --grpc-use-ssl, and takes any
--grpc-use-ssl-mutual as TLS on, with client certificates required or not by its value.
So `--grpc-use-ssl-mutual=false` alone serves TLS that checks only the server, and
`--grpc-use-ssl-mutual=true --grpc-use-ssl=false` serves plaintext.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ge_serve.backends.text_bool import parse_bool

from .flags import Flag, flag

USE_SSL: Final = "--grpc-use-ssl"
USE_SSL_MUTUAL: Final = "--grpc-use-ssl-mutual"


@dataclass(frozen=True, slots=True)
class GrpcSsl:
    """Whether gRPC serves TLS, and whether clients must present a certificate."""

    on: bool = False
    mutual: bool = False


def grpc_ssl(name: str, given: tuple[tuple[str, str], ...]) -> GrpcSsl:
    """The flags as given, in order, replayed as Triton's parser does."""
    ssl = GrpcSsl()
    for option, text in given:
        try:
            value = parse_bool(text)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
        if option == USE_SSL_MUTUAL:
            ssl = GrpcSsl(on=True, mutual=value)
        else:
            ssl = GrpcSsl(on=value, mutual=ssl.mutual)
    return ssl


def grpc_ssl_flag(group: str) -> Mapping[str, Flag]:
    return flag(
        USE_SSL,
        USE_SSL_MUTUAL,
        repeat=True,
        record_flag=True,
        check=grpc_ssl,
        metavar="BOOL",
        help=f"TLS on gRPC; {USE_SSL_MUTUAL} (any value) turns it on too and says whether "
        "clients must present a certificate; the last of the two given wins (default: false)",
        group=group,
    )
