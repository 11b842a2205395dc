"""Listening TCP sockets for the endpoints, bound by the server rather than by uvicorn or
grpc, so that an address in use is one clear line (uvicorn calls sys.exit() from inside
its task)."""

from __future__ import annotations

import socket

from ..errors import ErrorCode, ServerError


def listen_socket(host: str, port: int, what: str, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket for an endpoint, or a ServerError that says why not.

    `reuse_port` (--reuse-http-port): other servers that set it may share the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServerError(
            ErrorCode.UNAVAILABLE,
            f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}",
        ) from None
    return sock
