"""The malloc-arena cap: applied through glibc's mallopt, and never over the user's own
MALLOC_ARENA_MAX."""

from __future__ import annotations

import platform

import pytest

from ge_serve.server.cli import parse_settings
from ge_serve.server.malloc import limit_malloc_arenas


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
