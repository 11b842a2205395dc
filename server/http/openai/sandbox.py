"""The Jinja2 environment chat templates render in: transformers' (the one
`apply_chat_template` uses, so a template gives the same prompt here as in vLLM and
Triton's OpenAI front end), in Jinja2's `ImmutableSandboxedEnvironment`, since a template
is code that comes with a model, or with a request (--trust-request-chat-template).

The sandbox keeps a template from the server's objects, and bounds `range` (Jinja2's
MAX_RANGE), but not what a template builds: `'x' * 10**9` is a gigabyte, made as the
template compiles (Jinja2 folds constants), `ns.s ~ ns.s` doubles a string each turn of a
loop, and squaring an integer twenty times holds the interpreter for seconds in one
multiplication, which no time bound stops (timebound.py checks between lines). Here every
way a template makes a value is bounded (sandbox_bounds.py): the operators (`*`, `**`,
`+`, `%`, intercepted, which also keeps them from being folded, and `~`), str methods,
`format`, filters, and the output itself (blocks, macros, the prompt). A value past
MAX_ITEMS, an integer past MAX_BITS, or more than MAX_BUILT items in one render is
refused as the sandbox refuses an unsafe call (a SecurityError: the client's 400,
template.py). vLLM's sandbox bounds none of it.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from types import CodeType
from typing import Any, Final, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg

from .sandbox_bounds import (
    charged,
    check_format,
    check_join,
    check_method,
    check_percent,
    check_replace,
    sized,
    within,
)

# The largest integer `**` may make, in bits.
MAX_BITS: Final = 1 << 16


class Refused(Exception):
    """The template's own `raise_exception`."""


def _raise_exception(message: str) -> NoReturn:
    raise Refused(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: what it encloses, rendered in place.
    transformers also notes where that text falls (for training masks); a prompt has no
    use for it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# After the compiled template's imports: `~` joins through the sandbox (Jinja2 imports
# its `str_join` from its runtime, where no environment can replace it).
_REBOUND: Final = "str_join = environment.joined\n"


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Context, op: str, left: Any, right: Any) -> Any:
        integers = isinstance(left, int) and isinstance(right, int)
        if op == "+":
            if sized(left) and sized(right):
                within(len(left) + len(right), "concatenation")
            return charged(operator.add(left, right))
        if op == "*":
            if integers and left.bit_length() + right.bit_length() > MAX_BITS:
                raise SecurityError(f"the template's product is past {MAX_BITS} bits")
            _check_repeat(left, right)
            _check_repeat(right, left)
            return charged(operator.mul(left, right))
        if op == "%":
            check_percent(left, right)
            return charged(operator.mod(left, right))
        if integers and right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_BITS:
            raise SecurityError(f"the template's {left} ** {right} is past {MAX_BITS} bits")
        return operator.pow(left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        check_method(__obj, args, kwargs)
        return charged(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__
        mapped = value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            given = args[0] if mapped and args and isinstance(args[0], Mapping) else kwargs
            check_format(fmt, () if mapped else args, given)
            return str(charged(wrapped(*args, **kwargs)))

        return bounded

    @staticmethod
    def joined(parts: Iterable[Any]) -> str:
        """`~`: Jinja2's str_join, its parts and result bounded."""
        texts = [str(part) for part in parts]
        within(sum(map(len, texts)), "concatenation")
        return str(charged("".join(texts)))

    @staticmethod
    def concat(pieces: Iterable[str]) -> str:  # type: ignore[override]
        """The output of a render, a block or a macro: each piece counted as it comes."""
        return "".join(map(charged, pieces))

    def _compile(self, source: str, filename: str) -> CodeType:
        head, _, body = source.partition("\n")
        return super()._compile(f"{head}\n{_REBOUND}{body}", filename)


def _check_repeat(sequence: Any, count: Any) -> None:
    if sized(sequence) and isinstance(count, int):
        within(len(sequence) * count, "repetition")


def _check_filter(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Before a filter that sizes its result from its arguments runs (`args` without the
    context Jinja2 passes some first); the arguments, a join's items made a list."""
    value = args[0] if args else None

    def arg(index: int, key: str, default: Any) -> Any:
        return args[index] if len(args) > index else kwargs.get(key, default)

    if name == "center" and isinstance(arg(1, "width", 80), int):
        within(arg(1, "width", 80), "center width")
    elif name == "indent" and isinstance(value, str) and isinstance(arg(1, "width", 4), int):
        within(len(value) + arg(1, "width", 4) * (value.count("\n") + 1), "indent")
    elif name == "batch" and isinstance(arg(1, "linecount", 0), int):
        within(arg(1, "linecount", 0), "batch")
    elif name == "replace" and len(args) >= 3:
        check_replace(value, args[1], args[2], arg(3, "count", -1))
    elif name == "format":
        check_percent(value, kwargs or args[1:])
    elif name == "join" and value is not None and not isinstance(value, str | Mapping):
        items = list(value)
        check_join(arg(1, "d", ""), [i if isinstance(i, str) else str(i) for i in items])
        return (charged(items), *args[1:])
    return args


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    passed = 1 if _PassArg.from_obj(func) is not None else 0

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        given = _check_filter(name, args[passed:], kwargs)
        return charged(func(*args[:passed], *given, **kwargs))

    return bounded


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    """transformers' environment, built once, on first use."""
    found = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, jinja2.ext.loopcontrols],
    )
    found.globals["raise_exception"] = _raise_exception
    found.globals["strftime_now"] = _strftime_now
    found.filters["tojson"] = _tojson
    for name, func in list(found.filters.items()):
        found.filters[name] = _bounded_filter(name, func)
    return found
