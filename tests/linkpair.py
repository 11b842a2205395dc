"""Two ThreadLinks over a socket pair, the right one served by a thread: what the link
tests that carry real messages set up."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ge_serve.link.messages import Codec, Message
from ge_serve.link.thread import ThreadLink


@dataclass
class LinkPair:
    left: ThreadLink
    right: ThreadLink
    # What reached the right end, in order; `arrived` is set on each.
    got: list[Message] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)


@contextmanager
def thread_links(codec: Codec, inline_max: int = 0) -> Iterator[LinkPair]:
    """The left end sends; the right end's messages land in `got`. Both end on exit."""
    a, b = socket.socketpair()
    got: list[Message] = []
    arrived = threading.Event()

    def received(message: Message) -> None:
        got.append(message)
        arrived.set()

    left = ThreadLink(a, codec, "left", lambda m: None, inline_max=inline_max)
    right = ThreadLink(b, codec, "right", received, inline_max=inline_max)
    reader = threading.Thread(target=right.serve)
    reader.start()
    try:
        yield LinkPair(left, right, got, arrived)
    finally:
        left.close()
        reader.join(10)
        right.close()
