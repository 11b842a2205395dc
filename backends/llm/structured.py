"""Structured outputs (constrained decoding): vLLM's sampling key `structured_outputs`,
served as vLLM serves it with its "guidance" backend, by llguidance, but for a JSON
schema's undeclared properties and items: those are refused, as by vLLM's default "auto"
backend, xgrammar (strictschema.py).

The key is vLLM's StructuredOutputsParams, as an object or as the JSON text of one (what
Triton's vLLM backend reads, and Triton's OpenAI frontend sends): exactly one of `json`
(a JSON schema), `regex`, `choice`, `grammar` (Lark or GBNF) or `json_object`, and the
options `disable_any_whitespace`, `disable_additional_properties`, `whitespace_pattern`.
`parse_structured` checks its shape with vLLM's words (cheap, on the event loop); the
grammar is compiled by `Grammars.constraint`, which the engine calls off the event loop:
the model's LLTokenizer takes about a second to build (once per loaded model) and a large
schema takes a while to compile.

Each constrained sequence holds a `Constraint`: before sampling, the tokens the grammar
does not allow next are set to -inf in a copy of the logits row (rows past the
tokenizer's vocabulary too); the sampled token is then consumed. Once the grammar is
complete the EOS is the only token allowed, so the answer ends "stop", as in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .grammartok import text_tokens
from .strictschema import MAX_SCHEMA_DEPTH, close, deeper_than
from .structformat import format_grammar
from .structparts import Vocabulary
from .structtag import structural_tag

if TYPE_CHECKING:
    import llguidance

    from .text import Tokenizer

# vLLM's StructuredOutputsParams: its constraints (exactly one given), and its options.
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
# Set by vLLM's engine, not by a client, but in `asdict(StructuredOutputsParams(...))`,
# which is what Triton's OpenAI frontend sends: taken and ignored.
_PRIVATE = ("_backend", "_backend_was_auto")
_KEYS = frozenset((*CONSTRAINTS, *_OPTIONS, *_PRIVATE))


class UnsupportedTokenizer(RuntimeError):
    """llguidance cannot read the model's tokenizer.json."""


class GrammarFailed(ValueError):
    """A request's grammar cannot go on (llguidance's parser went past its limits on the
    text so far): the request's doing, answered as INVALID_ARG."""


# The grammars compiled lately, per model: an application sends the same schema with
# every request (and `n` choices send it n times), and a compile can take seconds.
_CACHED = 64
# llguidance's errors carry its parser state and the whole grammar (megabytes for a
# large schema): a client gets the first line, cut to this.
_ERROR_CHARS = 300


def _short(error: str) -> str:
    line = error.strip().splitlines()[0] if error.strip() else error
    return line if len(line) <= _ERROR_CHARS else line[:_ERROR_CHARS] + "..."


@dataclass(frozen=True, slots=True)
class Structured:
    """A request's constraint: `kind` one of CONSTRAINTS but structural_tag; `spec` the
    regex or grammar text, the JSON text of the schema or of the choices ("" for
    json_object)."""

    kind: str
    spec: str
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = None


def parse_structured(value: Any) -> Structured:
    """The key's value checked, in vLLM's words; ValueError says what is wrong."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"structured_outputs is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError("structured_outputs must be an object (vLLM's StructuredOutputsParams)")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ValueError(
            f"structured_outputs: unknown key(s) {unknown}; known: {sorted(_KEYS - set(_PRIVATE))}"
        )
    given = {k: value.get(k) for k in (*CONSTRAINTS, *_OPTIONS)}
    count = sum(value.get(k) is not None for k in CONSTRAINTS)
    if count > 1:
        raise ValueError(
            "You can only use one kind of structured outputs constraint "
            f"but multiple are specified: {given}"
        )
    if count < 1:
        raise ValueError(
            "You must use one kind of structured outputs constraint "
            f"but none are specified: {given}"
        )
    kind = next(k for k in CONSTRAINTS if value.get(k) is not None)
    pattern = value.get("whitespace_pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise ValueError("structured_outputs.whitespace_pattern must be a string")
    # Checked, and without effect: a JSON schema is always read strictly (strictschema.py),
    # as vLLM's "auto" backend reads it whatever this says (Triton's frontend sends false).
    _flag(value, "disable_additional_properties")
    return Structured(
        kind,
        _spec(kind, value[kind]),
        disable_any_whitespace=_flag(value, "disable_any_whitespace"),
        whitespace_pattern=pattern,
    )


def _spec(kind: str, spec: Any) -> str:
    if kind == "structural_tag":
        return structural_tag(spec)
    if kind == "json_object":
        if spec is not True:
            raise ValueError(
                "structured_outputs.json_object must be True if set; omit "
                "structured_outputs to disable structured outputs"
            )
        return ""
    if kind == "choice":
        if not isinstance(spec, list) or not all(isinstance(c, str) for c in spec):
            raise ValueError("structured_outputs.choice must be a list of strings")
        if not spec:
            raise ValueError(f"Choice '{spec}' cannot be an empty list")
        return json.dumps(spec)
    if kind == "json":
        if isinstance(spec, str):
            if not spec.strip():
                raise ValueError("structured_outputs.json cannot be an empty string")
            try:
                spec = json.loads(spec)
            except (ValueError, RecursionError):
                raise ValueError("Invalid JSON grammar specification.") from None
        if not isinstance(spec, dict | bool):
            raise ValueError("structured_outputs.json must be a JSON schema (an object)")
        if deeper_than(spec, MAX_SCHEMA_DEPTH):
            # Reading it again would recurse past Python's limit; llguidance stops well
            # before this anyway.
            raise ValueError(
                f"structured_outputs.json is nested more than {MAX_SCHEMA_DEPTH} levels deep"
            )
        return json.dumps(spec)
    if not isinstance(spec, str):
        raise ValueError(f"structured_outputs.{kind} must be a string")
    if kind == "grammar" and not spec.strip():
        raise ValueError("structured_outputs.grammar cannot be an empty string")
    if kind == "regex" and "\x00" in spec:
        raise ValueError("structured_outputs.regex must not contain a NUL character ('\\x00')")
    return spec


def _flag(given: Mapping[str, Any], key: str) -> bool:
    value = given.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"structured_outputs.{key} must be true or false")
    return value


class Grammars:
    """One loaded model's grammar compiler: its LLTokenizer, built on first use, the
    grammars compiled lately, and a thread of its own to compile on. As vLLM's own
    executor does, that thread keeps a slow compile from holding up the work the event
    loop's default executor does for other requests (long prompts, large bodies); slow
    compiles wait for each other only."""

    def __init__(self, tokenizer: Tokenizer, vocab: int, eos_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        # vLLM's: the larger of the graph's vocabulary and the tokenizer's (llguidance
        # refuses a vocabulary smaller than its tokenizer's); the mask is cut to the
        # logits row.
        self._vocab = max(vocab, tokenizer.vocab_size)
        self._eos = sorted(eos_ids)
        # The cache's lock (held briefly, by the event loop's callers too) and the
        # tokenizer build's (held for the build, on the compiling thread only).
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._built: llguidance.LLTokenizer | None = None
        self._tokens: Vocabulary | None = None
        # Unstarted matchers by constraint; each request gets a copy (llguidance's
        # deep_copy shares the compiled grammar, and costs nothing).
        self._compiled: OrderedDict[Structured, llguidance.LLMatcher] = OrderedDict()
        # Starts its thread on the first compile only.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar")

    async def compile(self, structured: Structured) -> Constraint:
        """`constraint`, on the compiling thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self.constraint, structured
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._compiled.clear()

    def constraint(self, structured: Structured) -> Constraint:
        """The matcher for one request (slow: call it off the event loop); ValueError,
        in vLLM's words, for a grammar that does not compile."""
        with self._lock:
            template = self._compiled.get(structured)
            if template is not None:
                self._compiled.move_to_end(structured)
        if template is None:
            template = self._compiled_matcher(structured)
            with self._lock:
                self._compiled[structured] = template
                while len(self._compiled) > _CACHED:
                    self._compiled.popitem(last=False)
        return Constraint(template.deep_copy(), self._vocab, lambda: self._forget(structured))

    def _forget(self, structured: Structured) -> None:
        """Drops a grammar that failed a request: llguidance's copies share a compiled
        grammar's lexer, and one that went past its limits fails every copy after."""
        with self._lock:
            self._compiled.pop(structured, None)

    def _compiled_matcher(self, structured: Structured) -> llguidance.LLMatcher:
        import llguidance

        try:
            grammar = _serialized(structured, self._vocabulary)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ValueError(f"Invalid grammar specification: {_short(str(exc))}") from None
        # vLLM's limits (llguidance's defaults), without the parser state and grammar
        # that verbose errors carry.
        limits = llguidance.LLParserLimits(verbose_errors=False)
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), grammar, log_level=0, limits=limits)
        if error := matcher.get_error():
            raise ValueError(f"Grammar error: {_short(error)}")
        return matcher

    def _vocabulary(self) -> Vocabulary:
        """The tokens as llguidance reads them (built once, on the compiling thread): by
        the bytes they stand for, as xgrammar finds a structural tag's token strings, and
        the special ones by their text."""
        if self._tokens is None:
            ll, tokenizer = self._ll_tokenizer(), self._tokenizer
            by_bytes: dict[bytes, int] = {}
            specials: dict[str, int] = {}
            for index in range(tokenizer.id_limit):
                if index in tokenizer.unnamed:
                    continue
                stands_for = ll.decode_bytes([index])
                if ll.is_special_token(index):
                    if stands_for:  # (llguidance's marker byte, 0xFF, reads as none)
                        specials.setdefault(stands_for.decode("utf-8", "replace"), index)
                else:
                    by_bytes.setdefault(stands_for, index)
            self._tokens = Vocabulary(
                token_id=lambda text: by_bytes.get(text.encode("utf-8")),
                added={text: i for text, i in tokenizer.added_tokens().items() if text},
                specials=specials,
                never=(*self._eos, *sorted(tokenizer.unnamed)),
                named=tokenizer.id_limit,
                size=self._vocab,
            )
        return self._tokens

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._build_lock:  # built once, whichever request comes first
            if self._built is None:
                import llguidance

                # The mask covers the graph's vocabulary (rows past the tokenizer's are
                # never allowed) and the tokenizer's, whichever is larger.
                try:
                    self._built = llguidance.LLTokenizer(
                        text_tokens(self._tokenizer.to_json()),
                        n_vocab=self._vocab,
                        eos_token=self._eos or None,
                    )
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # pyo3's panics too; the model's, not a ValueError
                    raise UnsupportedTokenizer(
                        f"structured outputs are not supported for this model's tokenizer: {exc}"
                    ) from None
            return self._built


def _serialized(structured: Structured, vocabulary: Callable[[], Vocabulary]) -> str:
    """vLLM's serialize_guidance_grammar, with the request's options, a JSON schema read
    as vLLM's default backend (xgrammar) reads it (strictschema.py), and xgrammar's
    structural tags (structformat.py) read against the model's `vocabulary` (built on
    first call: only a structural tag's format reads it)."""
    import llguidance

    defaults: dict[str, Any] = {"whitespace_flexible": not structured.disable_any_whitespace}
    if structured.whitespace_pattern is not None:
        defaults["whitespace_pattern"] = structured.whitespace_pattern

    def schema_grammar(schema: Any) -> str:
        close(schema)  # freshly parsed: changed in place
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)  # type: ignore[arg-type]

    if structured.kind == "json":
        return schema_grammar(json.loads(structured.spec))
    if structured.kind == "json_object":
        return schema_grammar({"type": "object"})  # any object
    if structured.kind == "structural_tag":
        spec = json.loads(structured.spec)
        if "format" in spec:
            return format_grammar(spec, defaults, vocabulary())
        tags = []
        for item in spec["structures"]:
            schema = item["schema"]
            close(schema)  # read as a response format's schema (strictschema.py)
            tags.append(
                llguidance.StructTag(
                    trigger=next(t for t in spec["triggers"] if item["begin"].startswith(t)),
                    begin=item["begin"],
                    # The request's whitespace options, where llguidance reads them in a
                    # schema (a compiled grammar's text here would be read as a schema).
                    grammar={**schema, "x-guidance": defaults},
                    end=item["end"],
                )
            )
        return llguidance.StructTag.to_grammar(tags)
    return llguidance.grammar_from(structured.kind, structured.spec)  # type: ignore[arg-type]


class Constraint:
    """One sequence's grammar state."""

    __slots__ = ("_forget", "_mask", "_matcher", "_seen", "after")

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab: int, forget: Callable[[], None] | None = None
    ) -> None:
        self._matcher = matcher
        self._forget = forget  # called when the grammar fails
        self._mask = np.full((1, (vocab + 31) // 32), -1, dtype=np.int32)
        # The text the grammar waits for (`structured_outputs_after`, a thinking model's
        # `</think>`); None: the grammar applies. While waiting, nothing is masked and
        # nothing consumed (vLLM's reasoning_ended, false).
        self.after: str | None = None
        # The end of the text seen while waiting, where the marker may have begun.
        self._seen = ""

    def see(self, text: str) -> None:
        """The text the sampled token added, while `after` is awaited: once it has been
        written, the grammar applies from the next token on (text that the same token
        adds after the marker is not the grammar's)."""
        after = self.after
        if after is None:
            return
        seen = self._seen + text
        if after in seen:
            self.after, self._seen = None, ""
        else:  # one substring test per token; a marker split over tokens is found too
            self._seen = seen[1 - len(after) :] if len(after) > 1 else ""

    def allowed(
        self, logits: npt.NDArray[np.float32], banned: tuple[int, ...] = ()
    ) -> npt.NDArray[np.float32] | None:
        """A copy of `logits` where the grammar's next tokens (less `banned`) keep their
        value and all others are -inf; None when none is left."""
        from llguidance.numpy import fill_next_token_bitmask

        # A stopped matcher allows the EOS alone; one in error would too, which would
        # end a half-written answer as if complete.
        fill_next_token_bitmask(self._matcher, self._mask)
        if self._matcher.is_error():
            raise self._failed()
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little")
        size = min(int(bits.shape[0]), int(logits.shape[0]))
        keep = bits[:size].astype(bool)
        if banned:
            keep[[b for b in banned if b < size]] = False
        if not keep.any():
            return None
        row = np.full(logits.shape, -np.inf, dtype=np.float32)
        row[:size] = np.where(keep, logits[:size], -np.inf)
        return row

    def accept(self, token: int) -> None:
        """Advance the grammar by the sampled token."""
        matcher = self._matcher
        if matcher.is_stopped():
            # Complete: only the EOS was allowed, and sampled again where ignore_eos
            # keeps the answer going (vLLM's terminated grammar takes it the same way).
            return
        if not matcher.consume_token(token):
            raise self._failed()

    def _failed(self) -> GrammarFailed:
        if self._forget is not None:
            self._forget()
        return GrammarFailed(
            "structured outputs: the grammar cannot go on from the text so far: "
            + _short(self._matcher.get_error())
        )
