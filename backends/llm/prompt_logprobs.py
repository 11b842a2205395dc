"""The prompt's log probabilities (vLLM's `prompt_logprobs`): for each prompt token after
the first, its logprob given the tokens before it, and the top N there.

The step graph gives the logits of each row's last position only; its optional
`hidden_states` output (examples/smollm/llama_onnx.py) gives every new token's final-normed
hidden state, and the LM head over it (`hidden @ head^T`) is the logits at each position.
The engine asks the graph for it only in a step whose prefill rows include a request that
wants them, and computes those rows here, on the engine thread: position p's logits give
the entry of prompt token p + 1, made as a sampled token's (logprobs.py: raw logits, vLLM's
rank and order). A chunked prefill adds its chunks' entries as they are computed; a
sequence prefilled again after a preemption skips the positions it already has, so no
entry is lost or repeated.

The head's weights come from the step graph's file (the initializer the `logits` Gemm or
MatMul reads: the tied embedding table or lm_head), read once per model, on the first
request that asks, and kept: vocab x hidden floats (113 MiB for SmolLM2-135M). A graph
whose logits are soft-capped after the head (Gemma 2's c * tanh(logits / c)) gives its cap
the same way, and the entries are computed on capped logits, as the sampled tokens' are.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import external_data_helper, numpy_helper

from .logprobs import TokenLogprobs
from .text import Tokenizer

NO_HIDDEN_STATES = (
    "prompt_logprobs is not supported by this model: its step graph has no "
    "'hidden_states' output (every prompt position's hidden state), which the prompt's "
    "log probabilities are computed from. Rebuild the graph with the current "
    "examples/smollm/build.py (the NPU placement's compiled step does not give it)"
)


def read_head(path: Path) -> tuple[npt.NDArray[np.float32], float]:
    """(the LM head [vocab, hidden] the step graph's `logits` are computed with, the
    logits' soft cap: 0 where they have none). Of a graph whose weights are in a file
    beside it (a large model's), only the head is read."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    node = next((n for n in graph.node if "logits" in n.output), None)
    node, cap = _under_cap(graph, node)
    if node is not None and node.op_type == "If":
        # The head in an If (examples/smollm's --int8-activations: 8-bit blocks for
        # one-token steps); its other branch is the Gemm on the fp32 table, kept in the
        # outer graph, as every branch keeps its weights.
        other = next((a.g for a in node.attribute if a.name == "else_branch"), None)
        out = other.output[0].name if other is not None and other.output else ""
        node = next((n for n in other.node if out in n.output), None) if other else None
    if node is None or node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2:
        raise ValueError("the step graph's 'logits' are not a Gemm or MatMul over the LM head")
    found = next((t for t in graph.initializer if t.name == node.input[1]), None)
    if found is None:
        raise ValueError(f"the step graph's LM head '{node.input[1]}' is not an initializer")
    if external_data_helper.uses_external_data(found):
        _load_within(found, path.parent)
    weights = numpy_helper.to_array(found).astype(np.float32, copy=False)
    trans_b = any(a.name == "transB" and a.i for a in node.attribute)
    # Gemm with transB reads it as [vocab, hidden]; otherwise it is [hidden, vocab].
    head: npt.NDArray[np.float32] = np.ascontiguousarray(weights if trans_b else weights.T)
    return head, cap


def _under_cap(
    graph: onnx.GraphProto, node: onnx.NodeProto | None
) -> tuple[onnx.NodeProto | None, float]:
    """The node under a soft cap Mul(Tanh(Div(x, c)), c) where `node` is that Mul, with c;
    else `node` and 0."""
    if node is None or node.op_type != "Mul":
        return node, 0.0
    by_output = {out: n for n in graph.node for out in n.output}
    consts = {t.name: t for t in graph.initializer}
    tanh = by_output.get(node.input[0])
    div = by_output.get(tanh.input[0]) if tanh is not None and tanh.op_type == "Tanh" else None
    # The cap divides and multiplies: one constant both times, or it is not this pattern.
    if div is None or div.op_type != "Div" or div.input[1] != node.input[1]:
        return node, 0.0
    if node.input[1] not in consts:
        return node, 0.0
    cap = numpy_helper.to_array(consts[node.input[1]])
    if cap.size != 1:
        return node, 0.0
    return by_output.get(div.input[0]), float(cap.reshape(-1)[0])


def _load_within(tensor: onnx.TensorProto, folder: Path) -> None:
    """The tensor's data from its external file, which must be in `folder` (the graph's
    own: a path out of it is refused, as onnxruntime refuses it)."""
    info = external_data_helper.ExternalDataInfo(tensor)
    where = (folder / info.location).resolve()
    if not where.is_relative_to(folder.resolve()):
        raise ValueError(f"the LM head's data file '{info.location}' is outside the model folder")
    external_data_helper.load_external_data_for_tensor(tensor, str(folder))


class LmHead:
    """A model's LM head, read on the first request that asks for it (a worker
    thread's file read), then kept."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.weights: npt.NDArray[np.float32] | None = None
        self.cap = 0.0
        self._lock = threading.Lock()

    def load(self) -> None:
        with self._lock:
            if self.weights is None:
                self.weights, self.cap = read_head(self.path)

    def logits(self, hidden: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The logits of hidden states [n, hidden] (loaded first)."""
        assert self.weights is not None
        found: npt.NDArray[np.float32] = hidden @ self.weights.T
        return np.tanh(found / self.cap) * self.cap if self.cap else found


class PromptLogprobs:
    """One sequence's prompt entries, filled chunk by chunk as its prefill runs."""

    __slots__ = ("found", "next")

    def __init__(self, top: int, tokenizer: Tokenizer, vocab: int) -> None:
        self.found = TokenLogprobs(top, tokenizer, vocab)
        # The first position whose entry is still to come (prompt token next + 1).
        self.next = 0

    def done(self, prompt_len: int) -> bool:
        return self.next >= prompt_len - 1

    def add(
        self,
        hidden: npt.NDArray[np.float32],
        start: int,
        tokens: list[int],
        prompt_len: int,
        head: LmHead,
    ) -> None:
        """The entries the hidden states of positions start.. (one row each) give."""
        first = max(self.next, start)
        last = min(start + len(hidden), prompt_len - 1)
        if last <= first:
            return
        logits = head.logits(hidden[first - start : last - start])
        for position, row in zip(range(first, last), logits, strict=True):
            self.found.add(row, tokens[position + 1])
        self.next = last

    def take(self) -> bytes:
        """vLLM's list: None for the first prompt token, then one entry per token."""
        return json.dumps([None, *self.found.entries]).encode("utf-8")
