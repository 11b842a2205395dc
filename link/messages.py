"""Typed link messages, and the one decoder.

A message is a tagged `msgspec.Struct`: on the wire a msgpack array whose first item is
its class name, then its fields in order; in code, a record read by field name. Each
protocol over the link (front-end workers, Python-model workers) declares its own
message classes on `Message`; a `Codec` is built from them and decodes nothing else: a
frame that is not one of those messages, field types and all, ends the link. No pickle,
so no unpickler to keep safe.

The link itself owns four messages: `Segment` (a new arena segment, its fd alongside),
`Release` (regions of the receiver's arena the sender has read and let go of), `Drop` (a
segment of the sender's arena let go of) and `Ready` (a child's health signal: it serves,
or why it cannot).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
import numpy as np

from .arena import Region as Region  # the messages carry regions; their users import it here
from .frames import LinkClosed


class Message(msgspec.Struct, tag=True, array_like=True):
    """The base of every link message."""


class Segment(Message):
    seg: int
    size: int


class Release(Message):
    regions: list[Region]


class Drop(Message):
    """A segment of the sender's arena let go of: the receiver unmaps it too."""

    seg: int


class Ready(Message):
    """Sent by a child once: it serves (`failure` None), or why it cannot."""

    failure: str | None = None


LINK_MESSAGES: tuple[type[Message], ...] = (Segment, Release, Drop, Ready)


def _builtin(value: Any) -> Any:
    """numpy scalars in parameters travel as the Python values they hold."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a link message cannot carry {type(value).__name__}")


class Codec:
    """Encodes any message; decodes only the link's own and `types`."""

    def __init__(self, types: tuple[type[Message], ...]) -> None:
        union: Any = Union[(*LINK_MESSAGES, *types)]
        self._decoder: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(union)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_builtin)

    def encode(self, message: Message) -> bytes:
        return self._encoder.encode(message)

    def decode(self, payload: bytes) -> Message:
        try:
            return self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise LinkClosed(f"an unreadable frame: {exc}") from None
