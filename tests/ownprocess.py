"""Tests that must run in a pytest process of their own, and the switch that marks it.

The tests that take the `watch` fixture (tests/component/test_config_paths.py) add a Python
audit hook, and an audit hook lasts as long as its process. On CPython before 3.12,
`sys.settrace` runs audit hooks while it holds a process-wide "being installed" flag; a
Python hook can hand the GIL to another thread there, and a thread that then starts under
coverage's tracer dies before its target runs ("Cannot install a trace function while
another trace function is being installed"). filelock declines to add its own hook on those
versions for the same reason. So the watched tests run only in a process started for them
(`test_the_watched_tests_pass_in_a_process_of_their_own`), and that process runs nothing else.
"""

from __future__ import annotations

WATCH_PROCESS = "GE_SERVE_TEST_WATCH_PROCESS"
WATCH_FIXTURE = "watch"


def runs_here(fixturenames: tuple[str, ...] | list[str], in_watch_process: bool) -> bool:
    """Whether a test that takes these fixtures runs in this process."""
    return (WATCH_FIXTURE in fixturenames) == in_watch_process
