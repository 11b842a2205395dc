"""The `minilm_tokenizer` Triton Python-backend model: sentences in, BERT token ids out.

TEXT (BYTES [1] per row, UTF-8) -> input_ids, attention_mask (INT64) and num_input_tokens
(INT32 [1] per row: the sentence's tokens, [CLS] and [SEP] included). `tokenizer.json`
beside this file is all-MiniLM-L6-v2's own (lower-casing WordPiece, [CLS] ... [SEP]).
Single sentences only, so there are no token type ids: all would be 0, which the encoder
assumes.

The token axis is the dims of the `input_ids` output in config.pbtxt:

- `[-1]` (the default pipeline): each request comes back at its own length, the longest
  of its sentences; its shorter sentences are padded with [PAD] and attention mask 0.
  Padding is per request, never to the longest of the batch the batcher formed, so a
  short request is not made long by a long neighbour: the encoder's scheduler pads it to
  its own length gear. The `max_sequence_length` parameter is the model's context.
- `[N]`: every sentence padded to N (the fixed-length pipeline); N is the context.

A sentence longer than the context is never truncated: its request fails with
INVALID_ARG in vLLM 0.34's words ("This model's maximum context length is N tokens.
However, your prompt contains M input tokens, which exceeds this limit ..."), which /v1
answers with OpenAI's 400 `context_length_exceeded`, as vLLM and OpenAI refuse such an
input rather than embed part of it.

Every request of a batch is tokenized in one `encode_batch` call. A request whose text is
not UTF-8, or too long, gets its own INVALID_ARG error; the others in its batch are
answered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Encoding, Tokenizer

OUTPUTS = ("input_ids", "attention_mask", "num_input_tokens")

MAX_LENGTH_KEY = "max_sequence_length"


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        (dim,) = pb_utils.get_output_config_by_name(config, "input_ids")["dims"]
        dim = int(dim)  # a string where the JSON keeps int64s as strings
        self.fixed = dim > 0
        if self.fixed:
            self.length = dim
        else:
            entry = config.get("parameters", {}).get(MAX_LENGTH_KEY, {})
            text = str(entry.get("string_value", "")).strip()
            if not text.isdigit() or int(text) < 1:
                raise pb_utils.TritonModelException(
                    f"parameter {MAX_LENGTH_KEY} must be a whole number of tokens >= 1 when "
                    f"input_ids has dims [-1], got '{text}'"
                )
            self.length = int(text)
        self.tokenizer = Tokenizer.from_file(str(Path(__file__).with_name("tokenizer.json")))
        # tokenizer.json truncates at 128 itself: a sentence is counted whole, then refused
        # if it is longer than the context.
        self.tokenizer.no_truncation()
        self.pad_id = self.tokenizer.token_to_id("[PAD]")
        if self.fixed:
            self.tokenizer.enable_padding(length=self.length, pad_id=self.pad_id, pad_token="[PAD]")
        else:
            # tokenizer.json pads every sentence to 128 itself: padding is done per request.
            self.tokenizer.no_padding()

    def execute(self, requests: list[Any]) -> list[Any]:
        texts: list[str] = []
        rows: list[tuple[int, int] | pb_utils.TritonError] = []  # (start, count) per request
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            try:
                decoded = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
            except UnicodeDecodeError as exc:
                rows.append(
                    pb_utils.TritonError(
                        f"TEXT must be UTF-8: {exc}", pb_utils.TritonError.INVALID_ARG
                    )
                )
                continue
            rows.append((len(texts), len(decoded)))
            texts += decoded

        encodings = self.tokenizer.encode_batch(texts) if texts else []
        responses = []
        for row in rows:
            if isinstance(row, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=row))
                continue
            start, count = row
            mine = encodings[start : start + count]
            refused = self._refusal(mine)
            if refused is not None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=refused))
                continue
            columns = self._columns(mine)
            tensors = [pb_utils.Tensor(name, columns[name]) for name in OUTPUTS]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _refusal(self, encodings: list[Encoding]) -> pb_utils.TritonError | None:
        """INVALID_ARG for a request with a sentence past the context, else None."""
        for row, encoding in enumerate(encodings):
            tokens = _count(encoding)
            if tokens > self.length:
                where = f" (TEXT row {row})" if len(encodings) > 1 else ""
                return pb_utils.TritonError(
                    # vLLM 0.34's (its renderer's token length check), with the whole
                    # count: vLLM stops tokenizing one past the context and says "at
                    # least", while this tokenizer has counted every token.
                    f"This model's maximum context length is {self.length} tokens. However, "
                    f"your prompt contains {tokens} input tokens, which exceeds this limit "
                    f"even without any output tokens. Please reduce the length of the input "
                    f"prompt{where}.",
                    pb_utils.TritonError.INVALID_ARG,
                )
        return None

    def _columns(self, encodings: list[Encoding]) -> dict[str, np.ndarray]:
        """One request's outputs: its sentences' tokens, padded to the longest of them (or
        to the fixed length, which the tokenizer has already padded to), and their counts."""
        width = self.length if self.fixed else max((len(e.ids) for e in encodings), default=0)
        ids = np.full((len(encodings), width), self.pad_id, np.int64)
        mask = np.zeros((len(encodings), width), np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.attention_mask)] = encoding.attention_mask
        counts = np.array([[_count(e)] for e in encodings], np.int32)
        return {"input_ids": ids, "attention_mask": mask, "num_input_tokens": counts}


def _count(encoding: Encoding) -> int:
    """The sentence's tokens, [CLS] and [SEP] included: padding (mask 0) is not counted."""
    return sum(encoding.attention_mask)
