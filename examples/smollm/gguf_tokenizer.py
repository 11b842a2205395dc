"""The tokenizer a GGUF describes, as a `tokenizers` Tokenizer that tokenizes as llama.cpp
does (llama-vocab.cpp), for the two kinds LLaMA-architecture GGUFs use:

- `gpt2`: byte-level BPE. The vocabulary and merges are stored as byte-level strings;
  `tokenizer.ggml.pre` names the pre-tokenizer, whose regexes split the text before the
  merges (`PRE_SPLITS`: llama.cpp's table, in the original form Hugging Face's
  tokenizer.json holds, which `tokenizers`' regex engine takes). Llama 3's kinds look a
  whole piece up before merging (llama.cpp's `ignore_merges`).
- `llama`: SentencePiece BPE (Llama 2, Mistral, TinyLlama). Tokens carry scores and no
  merges: llama.cpp merges the adjacent pair whose union is the token of highest score,
  so each pair of tokens that makes a token becomes a merge ranked by that token's score
  (`spm_merges`). A space is written `▁`, one is put before the text and after each
  special token (`add_space_prefix`, as llama.cpp's fragments do), and a character the
  vocabulary lacks becomes its UTF-8 bytes' `<0xXX>` tokens.

Token types (llama.cpp's): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte. Control and unknown tokens are special (never split, skipped when decoding with
skip_special_tokens); user-defined ones are matched in the text before anything else, as
llama.cpp matches them, and decode as text. BOS (and EOS) are added where the GGUF says
(`add_bos_token`, or llama.cpp's default for the kind): by the tokenizer's post-processor,
as Hugging Face's tokenizers add them, so a completion's prompt starts with BOS and a
chat, whose template writes it, is tokenized without (vLLM's `add_special_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTROL_TOKEN_TYPE = 3
_NORMAL, _UNKNOWN, _USER_DEFINED = 1, 2, 4
_SPACE = "\u2581"

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# GPT-4o's (Phi-4-mini's) and Tekken's (Mistral NeMo's): a word is its capitals, then its
# small letters, so "camelCase" is two pieces. Their tokenizer.json's regex, which keeps
# combining marks with their letters; llama.cpp's stand-in splits them off (Thai).
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"


def _cased(suffix: str, digits: str) -> str:
    lead = r"[^\r\n\p{L}\p{N}]?"
    return (
        f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}|{digits}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


_TEKKEN = _cased("", r"\p{N}")
_GPT4O = _cased(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?", r"\p{N}{1,3}")
# llama.cpp's letters and CJK ranges for DeepSeek LLM, as code points (several of its
# characters have canonical equivalents an editor may write in their place).
_DEEPSEEK_LETTERS = (
    r"\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}"
    r"\x{1c4}-\x{293}\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}"
    r"\x{37f}\x{386}\x{388}-\x{38a}\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}"
    r"\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}\x{10a0}-\x{10c5}"
    r"\x{13a0}-\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}"
    r"\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}"
    r"\x{1f18}-\x{1f1d}\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}"
    r"\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d}\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}"
    r"\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}"
    r"\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107}"
    r"\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}"
    r"\x{212a}-\x{212d}\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}"
    r"\x{214e}\x{2183}\x{2184}\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}"
    r"\x{2cf2}\x{2cf3}\x{a640}-\x{a66d}\x{a680}-\x{a69b}\x{a722}-\x{a76f}"
    r"\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-\x{abbf}\x{fb00}-\x{fb06}"
    r"\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f}"
    r"\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2}"
    r"\x{118a0}-\x{118df}\x{1e900}-\x{1e943}]+"
)
_CJK = r"[\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+"
_DEEPSEEK_LLM = (
    r"[\r\n]",
    _DEEPSEEK_LETTERS,
    r"\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
# Each kind's regexes, applied in turn (each splits every piece the ones before left,
# keeping what it does not match), then GPT-2's byte-level mapping. Names as llama.cpp
# reads `tokenizer.ggml.pre`.
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    # A GGUF that names none: llama.cpp's default set.
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    **dict.fromkeys(("gpt2", "mpt", "olmo", "jais", "gpt-2", "phi-2"), (_GPT2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell"), (r"\p{N}", _GPT2)),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "smaug-bpe", "dbrx"),
        (_LLAMA3,),
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2,)),
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-coder": _DEEPSEEK_CODER,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "minimax-m2"), (_GPT4O,)),
    "tekken": (_TEKKEN,),
}
# The kinds that take a piece found whole in the vocabulary as it is, unmerged, and add a
# BOS unless the GGUF says otherwise (llama.cpp's `ignore_merges`, `add_bos`).
_WHOLE_PIECES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"})


# The tokens llama.cpp ends generation at (its end-of-generation list, where the
# vocabulary has them), control tokens whatever type the GGUF gives them, as llama.cpp
# makes them: `</s>` of a vocabulary that types it normal is one token, not three.
END_TOKENS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)  # fmt: skip


# The special tokens llama.cpp's Phi-3 rule leaves the whitespace after.
_KEEP_SPACE_AFTER = frozenset(("<unk>", "<s>", "<|endoftext|>"))


@dataclass(frozen=True)
class TokenizerSpec:
    """The GGUF's tokenizer fields (`tokenizer.ggml.*`, `tokenizer.chat_template`)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_token_id: int
    eos_token_id: int
    chat_template: str
    # `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE, with `scores`).
    model: str = "gpt2"
    scores: list[float] | None = None
    # None: llama.cpp's default (BOS for SentencePiece and Llama 3's kinds).
    add_bos_token: bool | None = None
    add_eos_token: bool = False
    add_space_prefix: bool = True
    # Phi-3's: whitespace after a special token is dropped (its tokenizer.json's `rstrip`),
    # which llama.cpp sets by the model's name.
    rstrip_special: bool = False

    def kind(self, token_id: int) -> int:
        """The token's type, an end-of-generation token's control (llama.cpp's)."""
        found = self.token_types[token_id]
        return CONTROL_TOKEN_TYPE if self.tokens[token_id] in END_TOKENS else found

    @property
    def adds_bos(self) -> bool:
        if self.add_bos_token is not None:
            return self.add_bos_token
        return self.model == "llama" or self.pre in _WHOLE_PIECES


def read_spec(reader: Any) -> TokenizerSpec:
    """The tokenizer fields of a `gguf.GGUFReader`'s file."""

    def get(key: str, default: Any = ...) -> Any:
        field = reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"the GGUF has no {key}")
            return default
        return field.contents()

    model = str(get("tokenizer.ggml.model"))
    scores = get("tokenizer.ggml.scores", None)
    add_bos = get("tokenizer.ggml.add_bos_token", None)
    return TokenizerSpec(
        tokens=[str(t) for t in get("tokenizer.ggml.tokens")],
        token_types=[int(t) for t in get("tokenizer.ggml.token_type")],
        merges=[str(m) for m in get("tokenizer.ggml.merges", [])],
        pre=str(get("tokenizer.ggml.pre", "default")),
        bos_token_id=int(get("tokenizer.ggml.bos_token_id")),
        eos_token_id=int(get("tokenizer.ggml.eos_token_id")),
        chat_template=str(get("tokenizer.chat_template", "")),
        model=model,
        scores=None if scores is None else [float(x) for x in scores],
        add_bos_token=None if add_bos is None else bool(add_bos),
        add_eos_token=bool(get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", True)),
        rstrip_special=any(k in str(get("general.name", "")).lower() for k in ("phi-3", "phi3")),
    )


def spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """Every pair of normal tokens whose union is a normal token, the union of highest
    score first: the order llama.cpp's SentencePiece tokenizer merges in (ties go to the
    leftmost pair there, to the lower token id here)."""
    normal = {t for t, kind in zip(tokens, types, strict=True) if kind == _NORMAL}
    ranked: list[tuple[float, int, str, str]] = []
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind != _NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def build_tokenizer(spec: TokenizerSpec) -> Any:
    """A `tokenizers` Tokenizer equal to llama.cpp's for this vocabulary."""
    from tokenizers import AddedToken, Tokenizer, processors

    if spec.model == "gpt2":
        tokenizer = _byte_level(spec)
    elif spec.model == "llama":
        tokenizer = _sentencepiece(spec)
    else:
        raise ValueError(f"tokenizer model {spec.model!r} is not supported (gpt2, llama)")
    assert isinstance(tokenizer, Tokenizer)
    kinds = [spec.kind(i) for i in range(len(spec.tokens))]
    added = [
        AddedToken(
            token,
            special=kind != _USER_DEFINED,
            normalized=False,
            rstrip=spec.rstrip_special and token not in _KEEP_SPACE_AFTER,
        )
        for token, kind in zip(spec.tokens, kinds, strict=True)
        if kind in (CONTROL_TOKEN_TYPE, _UNKNOWN, _USER_DEFINED)
    ]
    tokenizer.add_special_tokens([t for t in added if t.special])
    tokenizer.add_tokens([t for t in added if not t.special])
    if spec.model == "gpt2":
        tokenizer.decoder = _byte_level_decoder([t.content for t in added])
    ends = [(spec.adds_bos, spec.bos_token_id), (spec.add_eos_token, spec.eos_token_id)]
    front = [spec.tokens[spec.bos_token_id]] if spec.adds_bos else []
    back = [spec.tokens[spec.eos_token_id]] if spec.add_eos_token else []
    if front or back:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join([*front, "$A", *back]),
            pair=" ".join([*front, "$A", *back, *front, "$B", *back]),
            special_tokens=sorted({(spec.tokens[i], i) for on, i in ends if on}),
        )
    return tokenizer


def _byte_level(spec: TokenizerSpec) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    splits = PRE_SPLITS.get(spec.pre)
    if splits is None:
        known = ", ".join(sorted(PRE_SPLITS))
        raise ValueError(f"pre-tokenizer {spec.pre!r} is not supported ({known})")
    vocab = {token: i for i, token in enumerate(spec.tokens)}
    merges = [(left, right) for left, _, right in (m.partition(" ") for m in spec.merges)]
    bpe = models.BPE(
        vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
        ignore_merges=spec.pre in _WHOLE_PIECES,
    )  # fmt: skip
    tokenizer = Tokenizer(bpe)
    if splits[-1] == _GPT2:
        # GPT-2's own regex is the byte-level pre-tokenizer's.
        last: Any = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        steps = [_split(r) for r in splits[:-1]] + [last]
    else:
        last = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        steps = [_split(r) for r in splits] + [last]
    tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    return tokenizer


def _byte_level_decoder(added: list[str]) -> Any:
    """GPT-2's byte-level decoder. It reads each character of its alphabet as the byte it
    stands for, so an added token whose text holds a character that stands for a byte no
    UTF-8 text has (DeepSeek's user-defined `ü` and 12 more letters) is first spelled in
    the alphabet, and decodes to its text, as llama.cpp's does. The rewrite finds the
    token's text within every token decoded, so one made only of bytes UTF-8 does use
    (a lone `é`) is left alone: it would rewrite the byte in other tokens too."""
    from tokenizers import decoders

    alphabet = _byte_alphabet()
    unused = {alphabet[b] for b in (0xC0, 0xC1, *range(0xF5, 0x100))}
    spelled = {
        token: "".join(alphabet[b] for b in token.encode("utf-8"))
        for token in added
        if any(c in unused for c in token)
    }
    if not spelled:
        return decoders.ByteLevel()
    replaces = [decoders.Replace(t, spelled[t]) for t in sorted(spelled, key=len, reverse=True)]
    return decoders.Sequence([*replaces, decoders.ByteLevel()])


def _byte_alphabet() -> list[str]:
    """GPT-2's byte alphabet: byte b's character in a byte-level vocabulary."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _split(regex: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if regex == r"\p{N}":
        return pre_tokenizers.Digits(individual_digits=True)
    return pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)


def _sentencepiece(spec: TokenizerSpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    if spec.scores is None:
        raise ValueError("a SentencePiece GGUF (tokenizer.ggml.model 'llama') must hold scores")
    vocab: dict[str, int] = {}
    for i, token in enumerate(spec.tokens):
        vocab.setdefault(token, i)
    unknown = next(
        (t for t, k in zip(spec.tokens, spec.token_types, strict=True) if k == _UNKNOWN), None
    )
    bpe = models.BPE(
        vocab=vocab,
        merges=spm_merges(spec.tokens, spec.token_types, spec.scores),
        unk_token=unknown,
        # With the 256 byte tokens nothing is unknown; without, a character is one <unk>
        # (so a text's token count keeps its bound, backends/llm/text.py).
        fuse_unk=False,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(bpe)
    spaces: list[Any] = [normalizers.Replace(" ", _SPACE)]
    back: list[Any] = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if spec.add_space_prefix:
        spaces.insert(0, normalizers.Prepend(_SPACE))
        back.append(decoders.Strip(" ", 1, 0))
    tokenizer.normalizer = normalizers.Sequence(spaces)
    tokenizer.decoder = decoders.Sequence(back)
    return tokenizer
