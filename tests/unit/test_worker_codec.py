"""Requests as a front-end worker's link carries them (server/workers/codec.py)."""

from __future__ import annotations

import socket
import threading

import numpy as np

from ge_serve.link.messages import Message, Region
from ge_serve.link.thread import ThreadLink
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.workers.codec import request_from_wire, request_to_wire
from ge_serve.server.workers.messages import INLINE_MAX, TO_SERVER, Infer


def test_large_bytes_tensors_travel_in_shared_memory_and_small_ones_in_the_message() -> None:
    a, b = socket.socketpair()
    got: list[Message] = []
    arrived = threading.Event()

    def received(message: Message) -> None:
        got.append(message)
        arrived.set()

    worker = ThreadLink(a, TO_SERVER, "worker", lambda m: None, inline_max=INLINE_MAX)
    server = ThreadLink(b, TO_SERVER, "server", received, inline_max=INLINE_MAX)
    reader = threading.Thread(target=server.serve)
    reader.start()
    try:
        _carry(worker, server, got, arrived)
    finally:
        worker.close()
        reader.join(10)
        server.close()


def _carry(
    worker: ThreadLink, server: ThreadLink, got: list[Message], arrived: threading.Event
) -> None:
    large = np.array([b"x" * INLINE_MAX, b"", "é".encode()], dtype=object).reshape(1, 3)
    small = np.array([b"ab", b"c"], dtype=object)
    request = InferRequest(
        model_name="m",
        inputs=[
            Tensor("large", DataType.BYTES, large.shape, large),
            Tensor("small", DataType.BYTES, small.shape, small),
        ],
    )
    regions: list[Region] = []
    wire = request_to_wire(worker, request, regions)
    frame = worker.frame_of(Infer(1, "grpc", wire))
    # In the message, a BYTES tensor past the frame limit would end the link.
    assert len(frame[1]) < INLINE_MAX, "the large tensor's bytes are not in the message"
    assert len(regions) == 1
    worker.send(Infer(1, "grpc", wire))
    assert arrived.wait(10)
    message = got[0]
    assert isinstance(message, Infer)
    rebuilt = {t.name: t.data for t in request_from_wire(server, message.request).inputs}
    assert rebuilt["large"].shape == (1, 3) and rebuilt["large"].tolist() == large.tolist()
    assert rebuilt["small"].tolist() == [b"ab", b"c"]
