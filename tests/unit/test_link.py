"""The process link (ge_serve.link): framing, the decoder, both drivers, tensors in
arenas, starting a child again with backoff, and its health signal."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from linkpair import thread_links
from polling import poll

from ge_serve.link import frames
from ge_serve.link.arena import DEFAULT_SEGMENT_BYTES, PeerSegments
from ge_serve.link.child import Backoff, exit_reason, start_child
from ge_serve.link.frames import LENGTH, FrameReader, LinkClosed, frame
from ge_serve.link.loop import LoopLink
from ge_serve.link.messages import Codec, Message, Ready, Region
from ge_serve.link.tensors import (
    ArenaTensor,
    deserialize_bytes,
    read_tensor,
    serialize_bytes,
    write_tensor,
)
from ge_serve.link.thread import ThreadLink


class Note(Message):
    number: int
    text: str
    data: bytes | Region = b""


CODEC = Codec((Note,))


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    stream = frame(b"one") + frame(b"") + frame(b"three" * 1000)
    reader = FrameReader()
    found: list[bytes] = []
    for start in range(0, len(stream), 7):  # in pieces that cut lengths and payloads
        reader.feed(stream[start : start + 7])
        found += reader.payloads()
    assert found == [b"one", b"", b"three" * 1000]
    assert not reader.partial


def test_a_frame_past_the_limit_ends_the_link() -> None:
    reader = FrameReader(max_frame=16)
    reader.feed(LENGTH.pack(17) + b"x" * 17)
    with pytest.raises(LinkClosed, match="larger than allowed"):
        reader.payloads()


def test_a_segment_without_its_fd_ends_the_link() -> None:
    with pytest.raises(LinkClosed, match="without its file descriptor"):
        FrameReader().take_fd()


@pytest.mark.parametrize(
    "payload",
    [
        b"\x93\xa7Unknown\x01\x02",  # a message this link does not know
        b"\x93\xa4Note\xa1x\x01",  # a known one with a field of the wrong type
        b"\x81\xa1a\x01",  # not a message at all
        b"\x80\x03\x63builtins\neval\n.",  # a pickle that would name a function
        b"",
    ],
)
def test_the_decoder_refuses_what_is_not_a_declared_message(payload: bytes) -> None:
    with pytest.raises(LinkClosed, match="unreadable frame"):
        CODEC.decode(payload)


def test_messages_are_read_by_name_and_numpy_scalars_travel_as_values() -> None:
    message = CODEC.decode(CODEC.encode(Note(np.int64(3), "hi", (1, 64, 8))))  # type: ignore[arg-type]
    assert isinstance(message, Note)
    assert (message.number, message.text, message.data) == (3, "hi", (1, 64, 8))
    assert type(message.number) is int


def test_thread_links_carry_messages_and_tensors_in_shared_memory_both_ways() -> None:
    a, b = socket.socketpair()
    got: list[Message] = []
    done = threading.Event()

    def received(message: Message) -> None:
        got.append(message)
        if len(got) == 2:
            done.set()

    left = ThreadLink(a, CODEC, "left", lambda m: None)
    right = ThreadLink(b, CODEC, "right", received)
    reader = threading.Thread(target=right.serve)
    reader.start()
    array = np.arange(100_000, dtype=np.float32).reshape(100, 1000)
    regions: list[Region] = []
    tensor = write_tensor(left.arena, "x", array, regions)
    left.send(Note(1, "small", b"abc"), Note(2, tensor.name, tensor.data))
    assert done.wait(10)
    assert isinstance(got[1], Note) and not isinstance(got[1].data, bytes)
    seen = np.frombuffer(right.view(got[1].data), np.float32).reshape(100, 1000)
    assert np.array_equal(seen, array)
    assert regions == [got[1].data]
    left.close()
    reader.join(10)
    assert right.closed


async def test_loop_links_batch_a_turns_messages_and_report_their_end() -> None:
    a, b = socket.socketpair()
    got: list[Message] = []
    ended = asyncio.Event()
    all_in = asyncio.Event()

    def received(message: Message) -> None:
        got.append(message)
        if len(got) == 51:
            all_in.set()

    left = LoopLink(a, CODEC, "left", lambda m: None, lambda: None, inline_max=64)
    right = LoopLink(b, CODEC, "right", received, ended.set, inline_max=64)
    regions: list[Region] = []
    big = left.place(memoryview(b"z" * 1000), regions)
    writes: list[int] = []
    write = left._write

    def counted(data: bytes, fds: list[int]) -> None:
        writes.append(len(data))
        write(data, fds)

    left._write = counted  # type: ignore[method-assign]
    for number in range(50):
        left.send(Note(number, "n"))
    left.send(Note(99, "big", big))
    await asyncio.wait_for(all_in.wait(), 10)
    assert [m.number for m in got if isinstance(m, Note)] == [*range(50), 99]
    assert len(writes) == 1  # the turn's 51 messages in one write
    last = got[-1]
    assert isinstance(last, Note) and bytes(right.view(last.data)) == b"z" * 1000
    left.close()
    await asyncio.wait_for(ended.wait(), 10)


async def test_a_garbled_frame_closes_the_loop_link() -> None:
    a, b = socket.socketpair()
    ended = asyncio.Event()
    LoopLink(b, CODEC, "right", lambda m: None, ended.set, inline_max=0)
    a.sendall(frame(b"\x93\xa7Unknown\x01\x02"))
    await asyncio.wait_for(ended.wait(), 10)
    a.close()


def test_bytes_tensors_round_trip_and_refuse_truncated_data() -> None:
    raw = serialize_bytes([b"a", "b\u00e9", b""])
    assert list(deserialize_bytes(raw, 3)) == [b"a", "b\u00e9".encode(), b""]
    with pytest.raises(ValueError, match="ends inside"):
        deserialize_bytes(raw[:-2] + b"\x09\x00", 3)
    with pytest.raises(ValueError, match="unknown datatype"):
        read_tensor(PeerSegments(), ArenaTensor("s", "NOPE", (1,), b""), copy=False)


def test_backoff_doubles_to_its_most_and_starts_over_after_serving() -> None:
    backoff = Backoff(0.1, 0.5, settled_s=10.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.next_delay(served_s=60.0) == 0.1
    assert backoff.next_delay() == 0.2
    backoff.reset()
    assert backoff.next_delay() == 0.1


_CHILD = """
import socket, sys
from ge_serve.link.messages import Codec, Ready
from ge_serve.link.thread import ThreadLink
link = ThreadLink(socket.socket(fileno=int(sys.argv[1])), Codec(()), "child", lambda m: None)
link.send(Ready(sys.argv[2] or None))
link.serve()
"""


@pytest.mark.parametrize("failure", ["", "no port"])
async def test_a_child_signals_health_and_its_exit_is_seen_on_the_loop(failure: str) -> None:
    child = start_child(
        lambda fd: [sys.executable, "-c", _CHILD, str(fd), failure], env=dict(os.environ)
    )
    ready: asyncio.Future[Ready] = asyncio.get_running_loop().create_future()
    link = LoopLink(
        child.sock,
        Codec(()),
        "parent",
        lambda m: ready.set_result(m) if isinstance(m, Ready) else None,
        lambda: None,
        inline_max=0,
    )
    signal = await asyncio.wait_for(ready, 30)
    assert signal.failure == (failure or None)
    link.close()  # the child's link ends, and so does the child
    assert await asyncio.wait_for(child.exited(), 30) == 0
    killed = start_child(lambda fd: [sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    assert exit_reason(await asyncio.wait_for(killed.exited(), 30)) == "was killed by SIGKILL"
    killed.sock.close()


_LEAVES_SIGNALS = """
import multiprocessing, os, signal, sys, time
from ge_serve.link.child import leave_stop_signals_to_parent
leave_stop_signals_to_parent()
os.kill(os.getpid(), signal.SIGTERM)  # left to the parent: this process goes on
time.sleep(0.1)
# What it forks (a model's pool) is ended by SIGTERM as any process is.
forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
forked.start()
forked.terminate()
forked.join(30)
print(forked.exitcode)
"""


def test_a_child_leaves_stop_signals_to_its_parent_but_not_what_it_forks() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LEAVES_SIGNALS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(-signal.SIGTERM)


def test_a_garbled_frame_ends_the_thread_links_reading() -> None:
    a, b = socket.socketpair()
    right = ThreadLink(b, CODEC, "right", lambda m: None)
    reader = threading.Thread(target=right.serve)
    reader.start()
    a.sendall(frame(b"\x93\xa4Note\xa1x\x01"))  # a known message with a field of the wrong type
    reader.join(10)
    assert not reader.is_alive() and right.closed
    a.close()


async def test_a_burst_larger_than_the_socket_buffer_arrives_whole_and_in_order() -> None:
    a, b = socket.socketpair()
    got: list[int] = []
    all_in = asyncio.Event()
    count = 3000

    def received(message: Message) -> None:
        assert isinstance(message, Note)
        got.append(message.number)
        if len(got) == count:
            all_in.set()

    left = LoopLink(a, CODEC, "left", lambda m: None, None, inline_max=1 << 20)
    right = LoopLink(b, CODEC, "right", received, None, inline_max=1 << 20)
    for number in range(count):  # ~3 MB in one loop turn: the kernel takes it in parts
        left.send(Note(number, "x", b"y" * 1000))
    await asyncio.wait_for(all_in.wait(), 30)
    assert got == list(range(count))
    left.close()
    right.close()


def test_a_message_past_the_frame_limit_fails_alone_at_the_sender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Sent, the peer would take it for a broken link and end it for every request on it.
    monkeypatch.setattr(frames, "MAX_FRAME", 64)
    assert frames.frame_parts(b"x" * 64)[1] == b"x" * 64
    with pytest.raises(frames.FrameTooLarge, match="larger than the 64 a link carries"):
        frames.frame_parts(b"x" * 65)


def test_a_segment_let_go_of_is_unmapped_by_the_peer_and_a_closed_link_holds_none() -> None:
    with thread_links(CODEC) as pair:
        left, right = pair.left, pair.right
        small: list[Region] = []
        write_tensor(left.arena, "s", np.zeros(4, np.float32), small)  # the first segment
        sizes = [DEFAULT_SEGMENT_BYTES + (n << 20) for n in (1, 2, 3)]
        for size in sizes:
            regions: list[Region] = []
            tensor = write_tensor(left.arena, "x", np.ones(size // 4, np.float32), regions)
            pair.arrived.clear()
            left.send(Note(size, "x", tensor.data))
            assert pair.arrived.wait(10)
            left.free(regions)
        # Three wholly free segments past twice the largest: the smallest went, and the
        # peer was told.
        left.send(Note(0, "after the drop"))
        poll(lambda: len(pair.got) == 4, 10, "the last note")
        placed = [n.data for n in pair.got[:3] if isinstance(n, Note)]
        assert all(isinstance(p, tuple) for p in placed)
        with pytest.raises(ValueError, match="not mapped"):
            right.view(placed[0])
        assert [right.view(p).nbytes for p in placed[1:]] == sizes[1:]
    assert right.closed and left.arena.segment_count == 0
    with pytest.raises(LinkClosed):
        left.arena.alloc(10)
