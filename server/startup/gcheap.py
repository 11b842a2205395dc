"""Python's cyclic garbage collector, told which objects are the server's standing heap.

A collection of the oldest generation walks every tracked object that is not frozen. In a
server most of those are the standing heap: the loaded models' configs, schedulers,
sessions and tokenizers, the protobuf descriptors, the modules. They never become garbage
while the repository stays as it is, yet each full collection walks them all again, with
the event loop stopped: about 90,000 objects and 24-37 ms on a 2-core machine with the
bench's models, every few seconds under gRPC load (grpc.aio leaves one small reference
cycle per call, so collections keep coming). vLLM freezes its start-up heap for the same
reason.

`settle_heap` runs once the server has started (models and front ends up) and after every
change to the repository (when the last of concurrent loads and unloads ends, whether or
not their callers waited): it thaws what the last change froze, collects, so that an
unloaded model's cycles go with it, and freezes what lives now. Later collections walk
only what was allocated since.

What this trades: an object that was alive at the last settle and later becomes part of
unreachable cycles, say a connection open at that moment, is collected only at the next
settle. Such objects are at most the heap that was frozen, so memory cannot grow by them
over time; and the executors free their sessions, device memory and caches when a
version closes, so a retired version that a late reference carried past its settle keeps
only its Python objects.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect what the repository's last change left, then freeze what lives now.

    Blocks for one full collection (tens of ms): call it on the loop, once a load or
    unload has finished, not per request."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def collect_all() -> None:
    """A full collection that the frozen heap takes part in, for a server part that stops
    while the server goes on (its objects were frozen with the rest)."""
    gc.unfreeze()
    gc.collect()
