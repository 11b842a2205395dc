"""The tokenizer as llguidance is given it (structured.py). llguidance keeps every added
token of the form <...> apart from text, special or not (toktrie_hf_tokenizers' rule): a
thinking model's `<think>`, a tool-calling model's `<tool_call>`. A grammar whose text
holds one (a JSON value, a regex, a structural tag's `"}\\n</tool_call>"`) then forces
the bytes, which the tokenizer turns into the token, which the grammar refuses: a dead
end mid-answer. xgrammar, vLLM's default backend, reads such tokens as the text they
stand for; so here, where the tokenizer's model is BPE, the added tokens not marked
special move into its vocabulary, under the text they stand for, and llguidance reads
them as text. Special ones (an EOS, `<|im_start|>`) stay apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any


def text_tokens(raw: str) -> str:
    """tokenizer.json's text (`raw`) with its added <...> tokens that are not special
    read as text (unchanged where the model is not BPE)."""
    spec = json.loads(raw)
    model = spec.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return raw
    vocab = model.get("vocab")
    added = spec.get("added_tokens")
    if not isinstance(vocab, dict) or not isinstance(added, list):
        return raw
    spelled, fallback = _spelling(spec), _byte_fallback(spec)
    kept = []
    for token in added:
        content = token.get("content") if isinstance(token, dict) else None
        if (
            isinstance(content, str)
            and not token.get("special")
            and content.startswith("<")
            and content.endswith(">")
            # Byte fallback's own spellings: <0x41> is a byte there, ▁ a space.
            and not (fallback and (content.startswith("<0x") or "\u2581" in content))
            and vocab.get(spelled(content), token["id"]) == token["id"]
        ):
            vocab[spelled(content)] = token["id"]
        else:
            kept.append(token)
    if len(kept) == len(added):
        return raw
    spec["added_tokens"] = kept
    return json.dumps(spec)


def _spelling(spec: dict[str, Any]) -> Callable[[str], str]:
    """How the vocabulary writes a text: byte-level (GPT-2's alphabet), with `▁` for a
    space (SentencePiece's), or as it is."""
    decoders = json.dumps(spec.get("decoder"))
    if '"ByteLevel"' in decoders and not _byte_fallback(spec):
        alphabet = _byte_alphabet()
        return lambda text: "".join(alphabet[b] for b in text.encode("utf-8"))
    if '"Metaspace"' in decoders or '"ByteFallback"' in decoders:
        return lambda text: text.replace(" ", "\u2581")
    return lambda text: text


def _byte_fallback(spec: dict[str, Any]) -> bool:
    model = spec.get("model") or {}
    return bool(model.get("byte_fallback")) or '"ByteFallback"' in json.dumps(spec.get("decoder"))


@cache
def _byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte-level alphabet: each byte's character in a byte-level vocabulary."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))
