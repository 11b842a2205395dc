"""What a chat template may build (sandbox.py's bounds): a value past MAX_ITEMS, or more
than MAX_BUILT items made in one render, is refused as the sandbox refuses an unsafe
call (a SecurityError: the client's 400).

Two kinds of check, for two ways a template holds memory. One operation that makes a
huge value in one C call (`'x'.center(10**10)`, `'%999999999s' % x`, a join or a
replace of large parts) is checked before it runs, from its arguments, since the
allocation itself would be the harm. A loop that makes many values each within bounds
(`ns.s ~ ns.s` doubling, a list of distinct megabyte strings) is stopped by the render's
budget: everything the template's operators, method calls and filters return counts
against it (`charged`), so what a render can hold is bounded by what it may build. A
render that never reaches the bounds pays a length check per operation.
"""

from __future__ import annotations

import re
import string
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from jinja2.exceptions import SecurityError

# The longest string or list one operation may make: far past any prompt a template writes.
MAX_ITEMS: Final = 1 << 20
# The items (characters, list entries) one render may make in all: a template that builds
# its prompt by `~` turn after turn makes the prompt's length times its turns.
MAX_BUILT: Final = 1 << 28
# A %-format's widths and precisions (`*`: taken from the arguments).
_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")
# str methods whose argument sets the result's length.
_WIDTHS: Final = frozenset(("center", "ljust", "rjust", "zfill"))

_SIZED: Final = (str, bytes, list, tuple, dict)


class _Budget(threading.local):
    """The items the render on this thread may still make (None: no render)."""

    left: list[int] | None = None


_render = _Budget()


@contextmanager
def render_budget() -> Iterator[None]:
    """MAX_BUILT items for the render run inside (on this thread)."""
    outer = _render.left
    _render.left = [MAX_BUILT]
    try:
        yield
    finally:
        _render.left = outer


def sized(value: Any) -> bool:
    return isinstance(value, _SIZED)


def charged(value: Any) -> Any:
    """`value`, its length counted against the render's budget."""
    left = _render.left
    if left is not None and isinstance(value, _SIZED):
        left[0] -= len(value)
        if left[0] < 0:
            raise SecurityError(f"the template builds more than {MAX_BUILT} items")
    return value


def within(length: int, what: str) -> None:
    if length > MAX_ITEMS:
        raise SecurityError(f"the template's {what} is past {MAX_ITEMS} items")


def check_percent(fmt: Any, args: Any) -> None:
    """`fmt % args`: no width or precision past MAX_ITEMS, given or taken from `args`."""
    if not isinstance(fmt, str):
        return
    values = args if isinstance(args, tuple) else (args,)
    for match in _PERCENT.finditer(fmt):
        for field in match.groups():
            if field == "*":
                if any(isinstance(v, int) and abs(v) > MAX_ITEMS for v in values):
                    raise SecurityError(f"the template's format is wider than {MAX_ITEMS}")
            elif field is not None:
                within(int(field), "format width")


def check_format(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """`fmt.format(...)`: no width or precision past MAX_ITEMS, written or nested."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # the call itself raises it
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:  # nested: the width comes from the arguments
            values = (*args, *kwargs.values())
            if any(isinstance(v, int) and abs(v) > MAX_ITEMS for v in values):
                raise SecurityError(f"the template's format is wider than {MAX_ITEMS}")
        for digits in _DIGITS.findall(spec):
            within(int(digits), "format width")


def check_method(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """A str method whose result's length its arguments set, checked before it runs."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in _WIDTHS and args and isinstance(args[0], int):
        within(args[0], f"{name} width")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            within(len(owner) + owner.count("\t") * max(size, 0), "expandtabs")
    elif name == "replace" and len(args) >= 2:
        check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        check_join(owner, args[0])


def check_replace(text: Any, old: Any, new: Any, count: Any = -1) -> None:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return
    found = len(text) + 1 if not old else text.count(old)
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    within(len(text) + found * max(len(new) - len(old), 0), "replace")


def check_join(separator: Any, items: Any) -> None:
    """A join of a sequence already made (an iterator's items are charged as made)."""
    if isinstance(items, list | tuple):
        total = sum(len(i) if isinstance(i, str) else 0 for i in items)
        within(total + len(str(separator)) * max(len(items) - 1, 0), "join")
