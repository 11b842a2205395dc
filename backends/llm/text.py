"""Text in and out: the tokenizer, the incremental detokenizer and stop strings.

Detokenizing one token at a time is wrong for byte-level BPE: a character may span
tokens (the first token alone decodes to U+FFFD), and a tokenizer's decoder may treat a
token differently at the start of a text. `Detokenizer` decodes a short window of recent
tokens (from `prefix` to the end) and emits only what that window adds beyond what it
decoded without the newest tokens, holding text back while it ends in an incomplete
character (vLLM's and TGI's scheme). Its cost per token is constant. An answer that ends
inside a character (`max_tokens` cut it) ends without it, as in vLLM.

`Tokenizer.encode` tokenizes a long text with `encode_batch`, which releases the GIL
while it works (`encode` holds it for the whole call): a long prompt is tokenized on a
worker thread, and with the GIL held there the event loop would stall all the same. Before
tokenizing, `min_tokens` bounds a text's token count from below by its UTF-8 length: no
token covers more than `max_token_bytes` bytes of text, so a prompt far past the context
is refused without being tokenized. The bound is taken only where it is sure: a
normalizer or pre-tokenizer that may drop or shrink text, an added token that swallows
whitespace (`lstrip`, `rstrip`), a model that may fuse unknown text into one token, or
truncation give no bound (`max_token_bytes` is None).

`StopStrings` finds stop strings in the generated text, including ones that span tokens,
and holds back the text that could still turn out to be the start of one, so a streamed
answer never shows part of a stop string it then drops.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"
# Tokens before the emitted point that the decoding window keeps for context.
_WINDOW_CONTEXT = 5
# Texts longer than this (in characters) are tokenized with `encode_batch`, which releases
# the GIL; a shorter one takes microseconds either way, on the event loop's thread.
GIL_FREE_CHARS = 1024
# Likewise for lists of ids to decode.
GIL_FREE_IDS = 1024
# The longest UTF-8 character: an unknown character is one token.
_MAX_CHAR_BYTES = 4
# Normalizers that never make the text shorter (a `Replace` only where its content is at
# least as long as its pattern, checked apart), and pre-tokenizers that split it without
# dropping any of it (`Split` and `Punctuation` unless their behaviour is `Removed`).
_KEEPING_NORMALIZERS = frozenset({"Prepend", "ByteLevel"})
_KEEPING_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Digits", "Metaspace", "Punctuation", "Split", "UnicodeScripts"}
)


class Tokenizer:
    """A `tokenizers` tokenizer (tokenizer.json)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer  # a heavy import, only for LLMs

        self._tokenizer: Any = HfTokenizer.from_file(str(path))
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        # Ids up to the largest that name no token (gaps before added tokens), so that a
        # long list of ids is checked with set operations rather than id by id; ids from
        # `id_limit` up name none (vLLM's tokenizer's max_token_id + 1).
        named = set(self._tokenizer.get_vocab(with_added_tokens=True).values())
        self.id_limit = max(named, default=-1) + 1
        self._gaps = frozenset(range(self.id_limit)) - named
        decoder = self._tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(int(i) for i, token in decoder.items() if token.special)
        # The most bytes of text one token can stand for; None where none is sure.
        self.max_token_bytes = max_token_bytes(json.loads(self._tokenizer.to_str()))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > GIL_FREE_CHARS:
            # `encode` keeps the GIL to the end, which stalls the event loop even from a
            # worker thread; `encode_batch` releases it while it tokenizes.
            batch = self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
            return list(batch[0].ids)
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def to_json(self) -> str:
        """The tokenizer.json text (what llguidance builds its tokenizer from)."""
        return str(self._tokenizer.to_str())

    def min_tokens(self, utf8_bytes: int) -> int:
        """At least how many tokens a text of `utf8_bytes` bytes encodes to (0 where the
        tokenizer gives no bound)."""
        if self.max_token_bytes is None:
            return 0
        return -(-utf8_bytes // self.max_token_bytes)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) > GIL_FREE_IDS:
            # As encode_batch: `decode` keeps the GIL to the end, `decode_batch` releases it.
            batch = self._tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)
            return str(batch[0])
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_strings(self, ids: list[int]) -> list[str]:
        return [str(self._tokenizer.id_to_token(i)) for i in ids]

    def unknown_id(self, ids: list[int]) -> int | None:
        """The largest of `ids` (none negative) that names no token, or None."""
        top = max(ids, default=-1)
        if top >= self.id_limit:
            return top
        missing = self._gaps.intersection(ids) if self._gaps else ()
        return max(missing, default=None)

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def added_tokens(self) -> dict[str, int]:
        """The added tokens (special or not) by their text."""
        decoder = self._tokenizer.get_added_tokens_decoder()
        return {str(token.content): int(index) for index, token in decoder.items()}

    @property
    def unnamed(self) -> frozenset[int]:
        """The ids below `id_limit` that name no token."""
        return self._gaps


def max_token_bytes(spec: Mapping[str, Any]) -> int | None:
    """The most bytes of a text that one token of the tokenizer `spec` (tokenizer.json's
    contents) stands for, or None where a token may stand for any length of text."""
    if spec.get("truncation") is not None:
        return None  # the text is cut: its length says nothing of the tokens kept
    if not _keeps_text(spec.get("normalizer"), "normalizers", _KEEPING_NORMALIZERS):
        return None
    pre_tokenizer = spec.get("pre_tokenizer")
    if not _keeps_text(pre_tokenizer, "pretokenizers", _KEEPING_PRE_TOKENIZERS):
        return None
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, Mapping):
        return None  # WordPiece and Unigram make one unknown token of a whole word
    if model.get("unk_token") is not None and model.get("fuse_unk"):
        return None
    # Byte-level BPE spells each byte of the text as one character of its alphabet, most
    # of which take two bytes in UTF-8 (Ġ for a space).
    alphabet = _byte_alphabet() if _has_type(pre_tokenizer, "ByteLevel") else frozenset()
    longest = max((_text_bytes(token, alphabet) for token in vocab), default=1)
    if model.get("unk_token") is not None or model.get("byte_fallback"):
        longest = max(longest, _MAX_CHAR_BYTES)
    for added in spec.get("added_tokens") or ():
        if added.get("lstrip") or added.get("rstrip"):
            return None  # it takes the whitespace beside it with it, however long
        longest = max(longest, len(str(added.get("content", "")).encode("utf-8")))
    return longest


def _text_bytes(token: str, alphabet: frozenset[str]) -> int:
    return sum(1 if char in alphabet else len(char.encode("utf-8")) for char in token)


def _byte_alphabet() -> frozenset[str]:
    from tokenizers import pre_tokenizers

    return frozenset(pre_tokenizers.ByteLevel.alphabet())


def _keeps_text(step: Any, nested: str, keeping: frozenset[str]) -> bool:
    """Whether a normalizer or pre-tokenizer never drops or shortens the text."""
    if step is None:
        return True
    kind = step.get("type")
    if kind == "Sequence":
        return all(_keeps_text(s, nested, keeping) for s in step.get(nested) or ())
    if kind == "Replace":
        pattern = (step.get("pattern") or {}).get("String")
        content = step.get("content")
        return (
            isinstance(pattern, str)
            and isinstance(content, str)
            and len(content.encode("utf-8")) >= len(pattern.encode("utf-8")) > 0
        )
    return kind in keeping and step.get("behavior") != "Removed"


def _has_type(step: Any, kind: str) -> bool:
    if step is None:
        return False
    if step.get("type") == "Sequence":
        return any(_has_type(s, kind) for s in step.get("pretokenizers") or ())
    return bool(step.get("type") == kind)


class Detokenizer:
    """The text of one sequence's generated tokens, one delta per token. `kept`: the
    special tokens whose text stays where `skip_special_tokens` skips the others'."""

    __slots__ = ("_context", "_dropped", "_prefix", "_read", "_skip", "_tokenizer", "ids")

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = True,
        context: Sequence[int] = (),
        kept: frozenset[int] = frozenset(),
    ) -> None:
        self._tokenizer = tokenizer
        # With some kept, the others are left out before decoding, which then skips none.
        self._dropped = tokenizer.special_ids - kept if skip_special_tokens and kept else None
        self._skip = skip_special_tokens and self._dropped is None
        self.ids: list[int] = []
        # The prompt's last tokens, before the first window (vLLM primes its decoder so):
        # a decoder that strips a text's leading space (SentencePiece's `▁Hello` at the
        # start) then keeps the answer's first one, as vLLM and llama.cpp do. Left out
        # where they end inside a character, which the answer's first token would finish.
        tail = list(context[-_WINDOW_CONTEXT:])
        cut = self._decode(tail).endswith(REPLACEMENT)
        self._context = [] if cut else tail
        # Window start, and where the text already emitted ends (token indexes).
        self._prefix = 0
        self._read = 0

    def _window(self, end: int | None) -> list[int]:
        part = self.ids[self._prefix : end]
        return self._context + part if self._prefix == 0 else part

    def _decode(self, ids: list[int]) -> str:
        if self._dropped is not None:
            ids = [token for token in ids if token not in self._dropped]
        return self._tokenizer.decode(ids, self._skip)

    def add(self, token: int) -> str:
        """The new text the token completes ("" while a character is incomplete)."""
        self.ids.append(token)
        before = self._decode(self._window(self._read))
        after = self._decode(self._window(None))
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        delta = after[len(before) :]
        self._read = len(self.ids)
        self._prefix = max(self._read - _WINDOW_CONTEXT, 0)
        return delta

    def flush(self) -> str:
        """The text held back at the end, less the incomplete character that held it:
        as in vLLM, an answer cut inside a character never shows it (not even as U+FFFD),
        so the streamed and the whole answer agree."""
        if self._read == len(self.ids):
            return ""
        before = self._decode(self._window(self._read))
        after = self._decode(self._window(None))
        self._read = len(self.ids)
        return after[len(before) :].rstrip(REPLACEMENT)


class StopStrings:
    """The generated text, cut at the first stop string, released as it becomes safe."""

    __slots__ = ("_include", "_released", "_stops", "matched", "stopped", "text")

    def __init__(self, stops: tuple[str, ...], include_stop: bool = False) -> None:
        self._stops = stops
        self._include = include_stop
        self.text = ""
        self._released = 0
        self.stopped = False
        # The stop string that ended the text (vLLM's `stop_reason`), once one has.
        self.matched: str | None = None

    def add(self, delta: str, check: bool = True) -> str:
        """Append generated text; returns the text now safe to show. Once a stop string
        appears, `stopped` is set and the text ends before it (or after, if included).
        `check` false (the tokens before `min_tokens`): no stop string may end in this
        text, as vLLM's rule is; one that begins in it may still end in what follows."""
        if self.stopped or not delta:
            return ""
        before = len(self.text)
        self.text += delta
        if self._stops and check:
            cut = self._first_stop(before)
            if cut is not None:
                self.stopped = True
                self.text = self.text[:cut]
                return self._release(len(self.text))
        return self._release(len(self.text) - self._held())

    def finish(self) -> str:
        """Everything not yet released (the sequence ended otherwise)."""
        return self._release(len(self.text))

    def _first_stop(self, before: int) -> int | None:
        """The cut for the first stop string that ends after `before` (the text's length
        before the last add): one wholly in the text before was either looked for then,
        or lay within `min_tokens`, where none may end (vLLM looks from the same place)."""
        best: tuple[int, int] | None = None
        for stop in self._stops:
            at = self.text.find(stop, max(before - len(stop) + 1, 0))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, at + len(stop))
                self.matched = stop
        if best is None:
            return None
        return best[1] if self._include else best[0]

    def _held(self) -> int:
        """The length of the text's longest ending that begins some stop string."""
        held = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:size]):
                    held = size
                    break
        return held

    def _release(self, upto: int) -> str:
        if upto <= self._released:
            return ""
        out = self.text[self._released : upto]
        self._released = upto
        return out
