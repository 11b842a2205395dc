"""startup/gcheap.py: the collector's standing heap follows the repository's changes."""

from __future__ import annotations

import gc
import weakref

from ge_serve.server.startup.gcheap import collect_all, settle_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settle_collects_what_the_last_change_left_and_freezes_what_lives() -> None:
    left = Node()
    left_ref = weakref.ref(left)
    del left
    kept = Node()
    kept_ref = weakref.ref(kept)
    settle_heap()
    assert left_ref() is None, "garbage from before the change is collected"
    assert gc.get_freeze_count() > 0
    # What lived at the change is frozen: an ordinary collection walks it no more...
    del kept
    gc.collect()
    assert kept_ref() is not None
    # ...and the next change thaws and collects it (an unloaded model's cycles).
    settle_heap()
    assert kept_ref() is None


def test_collect_all_takes_the_frozen_heap_in() -> None:
    stopped = Node()
    stopped_ref = weakref.ref(stopped)
    settle_heap()
    del stopped
    collect_all()
    assert stopped_ref() is None
    assert gc.get_freeze_count() == 0
