"""Raw onnxruntime at one batch size, calling back to back until killed, for bench/timeshare.py.

After every call it writes the samples done so far (a float64) to COUNTER, which the driver
maps and reads without stopping it. The session is raw_ort.open_sessions' for one slot: the
settings ge-serve's onnxruntime backend gives a slot.

    python3 bench/raw_worker.py MODEL.onnx|MODEL_DIR BATCH COUNTER
"""

from __future__ import annotations

import argparse
import mmap
import struct
from collections.abc import Sequence
from pathlib import Path

from raw_ort import batched_feed, open_sessions

COUNTER_FORMAT = "d"
COUNTER_BYTES = struct.calcsize(COUNTER_FORMAT)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("batch", type=int)
    parser.add_argument("counter", type=Path)
    args = parser.parse_args(argv)
    session = open_sessions(args.model, slots=1).sessions[0]
    feed, batched = batched_feed(session, args.batch, seed=0)
    samples = args.batch if batched else 1
    session.run(None, feed)  # warm-up, before the counter exists
    # Written whole and then renamed, so that the driver never maps a short file.
    staging = args.counter.with_name(args.counter.name + ".new")
    staging.write_bytes(bytes(COUNTER_BYTES))
    staging.replace(args.counter)
    with args.counter.open("r+b") as file, mmap.mmap(file.fileno(), COUNTER_BYTES) as counter:
        done = 0.0
        while True:
            session.run(None, feed)
            done += samples
            counter[:COUNTER_BYTES] = struct.pack(COUNTER_FORMAT, done)


if __name__ == "__main__":
    raise SystemExit(main())
