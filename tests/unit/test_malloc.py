"""The malloc-arena cap: applied through glibc's mallopt, and never over the user's own
MALLOC_ARENA_MAX; and freed heap pages handed back after loading."""

from __future__ import annotations

import platform

import pytest

from ge_serve.server.cli import parse_settings
from ge_serve.server.startup.malloc import limit_malloc_arenas, release_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_cap_is_applied_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas(2) is True


def test_zero_and_the_environment_leave_glibc_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas(0) is False
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas(2) is False


def test_the_flag_defaults_to_two_and_takes_zero() -> None:
    assert parse_settings(["--model-repository", "."]).malloc_arena_max == 2
    assert (
        parse_settings(["--model-repository", ".", "--malloc-arena-max", "0"]).malloc_arena_max == 0
    )


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_are_returned_after_a_trim() -> None:
    # 160 MiB of small blocks, one in 64 kept: the heap's top stays in use, so glibc's own
    # trimming at free() cannot hand the freed pages back; only malloc_trim can.
    blocks = [bytearray(2048) for _ in range(80_000)]
    kept = blocks[::64]
    del blocks
    before = _rss_mib()
    release_freed_memory()
    after = _rss_mib()
    assert kept  # alive until here
    assert before - after > 80, (before, after)


def test_it_is_safe_to_call_again() -> None:
    release_freed_memory()
    release_freed_memory()
