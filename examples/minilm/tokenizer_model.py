"""The `minilm_tokenizer` Triton Python-backend model: sentences in, BERT token ids out.

TEXT (BYTES [1] per row, UTF-8) -> input_ids, attention_mask, token_type_ids (INT64 [L]),
padded and truncated to L, the dims of the `input_ids` output in config.pbtxt (128: the
encoder's fixed length). `tokenizer.json` beside this file is all-MiniLM-L6-v2's own
(lower-casing WordPiece, [CLS] ... [SEP]). Single sentences only, so type ids are 0.

Every request of a batch is tokenized in one `encode_batch` call. A request whose text is
not UTF-8 gets its own INVALID_ARG error; the others in its batch are answered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        (length,) = pb_utils.get_output_config_by_name(config, "input_ids")["dims"]
        self.length = int(length)  # a string where the JSON keeps int64s as strings
        self.tokenizer = Tokenizer.from_file(str(Path(__file__).with_name("tokenizer.json")))
        self.tokenizer.enable_truncation(max_length=self.length)
        pad_id = self.tokenizer.token_to_id("[PAD]")
        self.tokenizer.enable_padding(length=self.length, pad_id=pad_id, pad_token="[PAD]")

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
        shape = (len(encodings), self.length)
        columns = {
            "input_ids": np.array([e.ids for e in encodings], np.int64).reshape(shape),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64).reshape(
                shape
            ),
            "token_type_ids": np.zeros(shape, np.int64),
        }
        responses = []
        for row in rows:
            if isinstance(row, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=row))
                continue
            start, count = row
            tensors = [
                pb_utils.Tensor(name, columns[name][start : start + count]) for name in OUTPUTS
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
