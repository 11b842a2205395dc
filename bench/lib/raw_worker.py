"""Raw onnxruntime at one batch size, calling back to back until killed, for the time-shared
runner (frozen_loads.RawLoad starts it as a subprocess).

After every call it writes the samples done so far (a float64) to COUNTER, which the driver
maps and reads without stopping it. The sessions are raw_ort.open_sessions' for `--slots`
slots (default 1): the settings ge-serve's onnxruntime backend gives that many slots (with
two, one intra-op thread each), each session called back to back from its own thread.

    python3 -m bench.lib.raw_worker MODEL.onnx|MODEL_DIR BATCH COUNTER [--slots N]
"""

from __future__ import annotations

import argparse
import mmap
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from bench.lib.raw_ort import batched_feed, open_sessions

COUNTER_FORMAT = "d"
COUNTER_BYTES = struct.calcsize(COUNTER_FORMAT)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("batch", type=int)
    parser.add_argument("counter", type=Path)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--int-high", type=int, default=16, help="integer inputs in [0, N)")
    args = parser.parse_args(argv)
    sessions = open_sessions(args.model, slots=args.slots).sessions
    feed, batched = batched_feed(sessions[0], args.batch, seed=0, int_high=args.int_high)
    samples = args.batch if batched else 1
    for session in sessions:
        session.run(None, feed)  # warm-up, before the counter exists
    # Written whole and then renamed, so that the driver never maps a short file.
    staging = args.counter.with_name(args.counter.name + ".new")
    staging.write_bytes(bytes(COUNTER_BYTES))
    staging.replace(args.counter)
    lock = threading.Lock()
    with args.counter.open("r+b") as file, mmap.mmap(file.fileno(), COUNTER_BYTES) as counter:
        done = 0.0

        def call(session: ort.InferenceSession) -> None:
            nonlocal done
            while True:
                session.run(None, feed)
                with lock:
                    done += samples
                    counter[:COUNTER_BYTES] = struct.pack(COUNTER_FORMAT, done)

        threads = [threading.Thread(target=call, args=(s,), daemon=True) for s in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
