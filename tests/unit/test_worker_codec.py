"""Requests as a front-end worker's link carries them (server/workers/codec.py)."""

from __future__ import annotations

import numpy as np
from linkpair import thread_links

from ge_serve.link.messages import Region
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.workers.codec import request_from_wire, request_to_wire
from ge_serve.server.workers.messages import INLINE_MAX, TO_SERVER, Infer


def test_large_bytes_tensors_travel_in_shared_memory_and_small_ones_in_the_message() -> None:
    with thread_links(TO_SERVER, INLINE_MAX) as pair:
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
        wire = request_to_wire(pair.left, request, regions)
        frame = pair.left.frame_of(Infer(1, "grpc", wire))
        # In the message, a BYTES tensor past the frame limit would end the link.
        assert len(frame[1]) < INLINE_MAX, "the large tensor's bytes are not in the message"
        assert len(regions) == 1
        pair.left.send(Infer(1, "grpc", wire))
        assert pair.arrived.wait(10)
        message = pair.got[0]
        assert isinstance(message, Infer)
        rebuilt = {t.name: t.data for t in request_from_wire(pair.right, message.request).inputs}
        assert rebuilt["large"].shape == (1, 3) and rebuilt["large"].tolist() == large.tolist()
        assert rebuilt["small"].tolist() == [b"ab", b"c"]
