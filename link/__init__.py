"""One link between the server and each of its child processes.

Every child the server starts (a front-end worker, a Python model's worker) is spoken to
the same way, over one Unix socket pair:

- `frames`: a frame is a 4-byte little-endian length and a msgpack payload; file
  descriptors (new shared-memory segments) ride with the frame that announces them;
- `messages`: each message is a tagged `msgspec.Struct`, read by field name, never by
  position; one decoder per link accepts only the message types its protocol declares,
  so a child that went wrong cannot make the server build anything else or run code;
- `arena` and `tensors`: tensor bytes in memfd arenas, named by region, read in place as
  zero-copy numpy views; `dtypes` holds the one table of Triton datatypes;
- `loop` and `thread`: one driver for an asyncio loop, one for threads, over the same
  `endpoint` (framing, decoding, segments);
- `child`: starting a supervised child (the socket pair, the process, its exit), the
  restart backoff, and the health signal a child sends once it serves.

This package imports nothing from server/, scheduler/ or backends/: both sides build on it.
"""
