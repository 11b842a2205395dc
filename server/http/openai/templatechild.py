"""The process a request's own chat template renders in (--trust-request-chat-template;
templateproc.py starts and drives it).

Such a template is the client's code. The sandbox (sandbox.py) keeps it from the
server's objects, but no check made call by call bounds what it builds: a string
method, a filter, a `str()` of a list or Jinja2's own constant folding at compile time
can each make gigabytes in one C call, and one C call can hold the interpreter for
seconds. Here the template compiles and renders in a process whose address space is
limited (MEMORY_LIMIT): what it builds past that is a MemoryError in this process,
answered as the client's 400, and the server kills it at the render's time limit or
when the client leaves, and starts another for the next request.

The messages: a `Job` (the template's source and its variables, JSON values) in, a
`Rendered` or a `Failed` out, each a msgpack frame after its 4-byte length.
"""

from __future__ import annotations

import ctypes
import resource
import signal
import struct
import sys
from functools import lru_cache
from typing import IO, Any, Final

import jinja2
import msgspec

# The address space the process may hold: a prompt and the template's own values, with
# room to spare, far below the host's memory.
MEMORY_LIMIT: Final = 1 << 30
# The longest frame either side sends: a prompt past this is no prompt a model takes,
# and the server would hold it.
MAX_FRAME: Final = 64 << 20
# A job's time, past which this process ends itself whatever the server does (which
# kills it sooner): the server's 30 s and a margin.
_JOB_SECONDS: Final = 40
_LENGTH = struct.Struct(">I")
# prctl(PR_SET_PDEATHSIG): Linux's signal to a process when its parent dies.
_PR_SET_PDEATHSIG: Final = 1


class Job(msgspec.Struct, tag="job"):
    source: str
    variables: dict[str, Any]


class Rendered(msgspec.Struct, tag="rendered"):
    text: str


class Failed(msgspec.Struct, tag="failed"):
    # "compile" (the template does not), "refused" (its raise_exception), "memory"
    # (past MEMORY_LIMIT; the process exits after answering), "error" (anything else).
    kind: str
    message: str


Reply = Rendered | Failed


def frame(message: msgspec.Struct) -> bytes:
    """The message as sent: its length, then msgpack (ValueError past MAX_FRAME; what
    msgpack cannot encode raises msgspec.EncodeError, TypeError or OverflowError)."""
    data = msgspec.msgpack.encode(message)
    if len(data) > MAX_FRAME:
        raise ValueError(f"more than {MAX_FRAME >> 20} MiB")
    return _LENGTH.pack(len(data)) + data


def _sent(writer: IO[bytes], reply: Reply) -> Reply:
    """`reply` written; one that cannot be (a prompt past MAX_FRAME, a lone surrogate
    in it) is answered as a failure instead."""
    try:
        data = frame(reply)
    except MemoryError:
        reply = Failed("memory", f"the template needs more than {MEMORY_LIMIT >> 20} MiB")
        data = frame(reply)
    except Exception as exc:  # the template's output: the client's, not ours
        reply = Failed("error", f"its prompt cannot be sent: {type(exc).__name__}: {exc}")
        data = frame(reply)
    writer.write(data)
    writer.flush()
    return reply


def _read_exactly(stream: IO[bytes], count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        more = stream.read(count - len(data))
        if not more:
            return None
        data += more
    return data


@lru_cache(maxsize=8)
def _compiled(source: str) -> jinja2.Template | str:
    from .sandbox import compiled

    return compiled(source)


def answer(job: Job) -> Reply:
    """The job's prompt, or why there is none."""
    from .sandbox import Refused

    try:
        template = _compiled(job.source)
    except MemoryError:
        return Failed("memory", f"the template needs more than {MEMORY_LIMIT >> 20} MiB")
    if isinstance(template, str):
        return Failed("compile", template)
    try:
        return Rendered(template.render(job.variables))
    except Refused as exc:
        return Failed("refused", str(exc))
    except MemoryError:
        return Failed("memory", f"the template needs more than {MEMORY_LIMIT >> 20} MiB")
    except Exception as exc:
        return Failed("error", f"{type(exc).__name__}: {exc}")


def serve(reader: IO[bytes], writer: IO[bytes]) -> None:
    """Answer jobs until the server closes the pipe, or a template has run out of
    memory (the process may be left short: the server starts another)."""
    decoder = msgspec.msgpack.Decoder(Job)
    while True:
        head = _read_exactly(reader, _LENGTH.size)
        if head is None:
            return
        body = _read_exactly(reader, _LENGTH.unpack(head)[0])
        if body is None:
            return
        signal.alarm(_JOB_SECONDS)
        reply = _sent(writer, answer(decoder.decode(body)))
        signal.alarm(0)
        if isinstance(reply, Failed) and reply.kind == "memory":
            return


def main() -> None:
    # The server ends this process (it closes the pipe, or kills it); a Ctrl-C at the
    # terminal, sent to the whole process group, is the server's to act on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A server killed outright (SIGKILL, the OOM killer) closes no pipe this process is
    # waiting on while it renders: ask Linux to end it with its parent.
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
