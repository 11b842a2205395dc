"""The Jinja2 environment chat templates render in: transformers' (the one
`apply_chat_template` uses, so a template gives the same prompt here as in vLLM and
Triton's OpenAI front end), in Jinja2's `ImmutableSandboxedEnvironment`, since a template
is code that comes with a model, or with a request (--trust-request-chat-template).

The sandbox keeps a template from the server's objects, and bounds `range` (Jinja2's
MAX_RANGE), but not what its operators build: `'x' * 10**9` is a gigabyte, made as the
template compiles (Jinja2 folds constants), and squaring an integer twenty times holds the
interpreter for seconds in one multiplication. `*`, `**` and `+` are intercepted here
(which also keeps them from being folded): a string or list past MAX_ITEMS, or an integer
past MAX_BITS, is refused as the sandbox refuses an unsafe call (a SecurityError: the
client's 400, template.py). These catch a model's template's mistakes; nothing checked
call by call bounds all a template can build (string methods, filters, `str()` of a
list, `~` in a loop), so a request's own template, the client's code, renders in a
process whose memory and time are bounded (templateproc.py). vLLM's sandbox bounds none
of it.
"""

from __future__ import annotations

import json
import operator
from datetime import datetime
from functools import lru_cache
from typing import Any, Final, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The longest string or list `*` may make: far past any prompt a template writes.
MAX_ITEMS: Final = 1 << 20
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


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+"})

    def call_binop(self, context: Context, op: str, left: Any, right: Any) -> Any:
        integers = isinstance(left, int) and isinstance(right, int)
        if op == "+":
            if _sized(left) and _sized(right) and len(left) + len(right) > MAX_ITEMS:
                raise SecurityError(f"the template joins sequences past {MAX_ITEMS} items")
            return operator.add(left, right)
        if op == "*":
            if integers and left.bit_length() + right.bit_length() > MAX_BITS:
                raise SecurityError(f"the template's product is past {MAX_BITS} bits")
            _check_repeat(left, right)
            _check_repeat(right, left)
            return operator.mul(left, right)
        if integers and right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_BITS:
            raise SecurityError(f"the template's {left} ** {right} is past {MAX_BITS} bits")
        return operator.pow(left, right)


def _sized(value: Any) -> bool:
    return isinstance(value, str | bytes | list | tuple)


def _check_repeat(sequence: Any, count: Any) -> None:
    repeated = _sized(sequence) and isinstance(count, int)
    if repeated and len(sequence) * count > MAX_ITEMS:
        raise SecurityError(f"the template repeats a sequence past {MAX_ITEMS} items")


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
    return found


def compiled(source: str) -> jinja2.Template | str:
    """The template compiled in this environment, or why it does not compile: a syntax
    error's line and message, or what else compiling raised (a parser's RecursionError,
    what Jinja2's constant folding raised). A MemoryError is raised, for the caller to
    tell from a template that is wrong."""
    try:
        return environment().from_string(source)
    except jinja2.TemplateError as exc:
        where = f"line {exc.lineno}: " if isinstance(exc, jinja2.TemplateSyntaxError) else ""
        return f"{where}{exc}"
    except MemoryError:
        raise
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
