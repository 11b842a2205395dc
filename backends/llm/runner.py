"""One step of the model: the step graph run on a batch of rows, and its new K/V stored.

The graph (docs/generation.md, "The step graph") takes, per row, the tokens to compute
now (q of them: one when decoding, a chunk when prefilling; shorter rows are left-padded),
their absolute positions, the row's block table and an additive attention mask over
[the gathered past slots | the new tokens], plus every layer's whole cache pool. The
pools go in as OrtValues made once over the pool arrays, so onnxruntime reads the cache
in place. The graph returns the last position's logits per row and the new tokens' keys
and values (flat: every row's q tokens in turn), which `KvPool.write` puts into their
slots.

A step has two groups of rows: the decoding rows (q = 1) and the prefilling ones (q = the
longest chunk). A graph that takes the second group as inputs of its own (`chunk_*`, as
examples/smollm/llama_onnx.py builds it) runs both in one call: its dense layers run once
over every token, so the weights are read once per iteration, and only attention is
computed per group, each at its own q, so the decode rows are not padded to the chunk's
length. A graph without them runs the two groups as two calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from .kvcache import KvPool, blocks_for

MASKED = np.float32(-1e9)
_REQUIRED = ("input_ids", "positions", "block_table", "attention_mask")
# The optional output of every new token's final-normed hidden state (the prompt's log
# probabilities); a graph without it serves everything else.
HIDDEN_STATES = "hidden_states"
# The graph's metadata key for the positions its RoPE tables hold (optional).
MAX_POSITIONS = "max_positions"
# The second group's inputs: the same names with this prefix.
CHUNK_PREFIX = "chunk_"


@dataclass(frozen=True, slots=True)
class RowWork:
    """One row of a step: `tokens` at positions start..start+len-1, the sequence's
    `start` earlier tokens already in its `blocks` (which also hold room for these)."""

    tokens: Sequence[int]
    start: int
    blocks: Sequence[int]


@dataclass(frozen=True, slots=True)
class GraphShape:
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    # The graph has the `hidden_states` output.
    hidden: bool = False
    # The positions the graph computes (its metadata's `max_positions`); None: unsaid.
    positions: int | None = None


def check_positions(shape: GraphShape, max_model_len: int) -> None:
    """ValueError where max_model_len passes the positions the graph computes."""
    if shape.positions is not None and max_model_len > shape.positions:
        raise ValueError(
            f"parameter max_model_len {max_model_len} exceeds the {shape.positions} "
            "positions the step model computes (its RoPE tables; build it again for more: "
            "examples/smollm/build.py --max-model-len)"
        )


def max_positions(metadata: Mapping[str, str]) -> int | None:
    """The graph metadata's `max_positions`, None where it has none."""
    found = metadata.get(MAX_POSITIONS)
    if found is None:
        return None
    if not (found.isascii() and found.isdecimal()) or int(found) < 1:
        raise ValueError(f"the step model's metadata {MAX_POSITIONS} {found!r} is not a count")
    return int(found)


def graph_shape(session: ort.InferenceSession, block_size: int) -> GraphShape:
    """What the step graph says about the model; ValueError when it breaks the contract."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    missing = [name for name in _REQUIRED if name not in inputs]
    if missing or "logits" not in outputs:
        raise ValueError(
            f"the step model lacks input(s) {missing}"
            + ("" if "logits" in outputs else " and output 'logits'")
        )
    layers = 0
    while f"key_cache_{layers}" in inputs:
        for name in (f"value_cache_{layers}",):
            if name not in inputs:
                raise ValueError(f"the step model lacks input '{name}'")
        for name in (f"key_{layers}", f"value_{layers}"):
            if name not in outputs:
                raise ValueError(f"the step model lacks output '{name}'")
        layers += 1
    if not layers:
        raise ValueError("the step model has no key_cache_0 input")
    shape = inputs["key_cache_0"].shape
    if len(shape) != 4 or not isinstance(shape[2], int) or not isinstance(shape[3], int):
        raise ValueError(
            "key_cache_0 must be [blocks, block_size, kv_heads, head_dim] with fixed "
            f"heads, got {shape}"
        )
    if isinstance(shape[1], int) and shape[1] != block_size:
        raise ValueError(
            f"parameter kv_block_size {block_size} differs from the step model's block "
            f"size {shape[1]}"
        )
    vocab = outputs["logits"].shape[-1]
    if not isinstance(vocab, int):
        raise ValueError("the step model's logits must have a fixed vocabulary dimension")
    positions = max_positions(session.get_modelmeta().custom_metadata_map)
    return GraphShape(
        layers, int(shape[2]), int(shape[3]), vocab, HIDDEN_STATES in outputs, positions
    )


class Runner(Protocol):
    """Runs steps of the graph with its KV pool, on one placement (the engine's thread)."""

    shape: GraphShape
    block_size: int
    pool: KvPool
    # Seconds inside the graph in the latest step (the rest is the engine's overhead).
    last_graph_s: float
    # The latest step's `hidden_states` where it asked for them: one row per real new
    # token, the rows' in order then the chunk rows'; None otherwise.
    last_hidden: npt.NDArray[np.float32] | None

    def run(
        self, rows: Sequence[RowWork], chunk_rows: Sequence[RowWork] = (), hidden: bool = False
    ) -> npt.NDArray[np.float32]: ...

    def close(self) -> None: ...


def run_apart(
    runner: Runner,
    run_group: Callable[..., npt.NDArray[np.float32]],
    rows: Sequence[RowWork],
    chunk_rows: Sequence[RowWork],
    hidden: bool = False,
) -> npt.NDArray[np.float32]:
    """The two groups of a step as two graph calls (a graph that takes one group only):
    their logits in order, and the graph time of both in `runner.last_graph_s`."""
    first = run_group(rows, hidden=hidden)
    graph_s, first_hidden = runner.last_graph_s, runner.last_hidden
    second = run_group(chunk_rows, hidden=hidden)
    runner.last_graph_s += graph_s
    if first_hidden is not None and runner.last_hidden is not None:
        runner.last_hidden = np.concatenate([first_hidden, runner.last_hidden])
    return np.concatenate([first, second])


class StepRunner:
    """The step graph on onnxruntime (host CPU) with its KV pool. One thread calls it."""

    def __init__(
        self, path: Path, blocks: int, block_size: int, threads: int, spin: bool = False
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or (os.cpu_count() or 1)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        # The graph's `chunk_*` defaults are initializers listed as inputs on purpose
        # (a feed overrides them); onnxruntime warns about each at load otherwise.
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.shape = graph_shape(self.session, block_size)
        self.block_size = block_size
        self.pool = KvPool(
            self.shape.layers, blocks, block_size, self.shape.kv_heads, self.shape.head_dim
        )
        layers = range(self.shape.layers)
        self._pool_values: dict[str, Any] = {}
        for layer in layers:
            self._pool_values[f"key_cache_{layer}"] = ort.OrtValue.ortvalue_from_numpy(
                self.pool.keys[layer]
            )
            self._pool_values[f"value_cache_{layer}"] = ort.OrtValue.ortvalue_from_numpy(
                self.pool.values[layer]
            )
        self._outputs = ["logits", *(f"key_{i}" for i in layers), *(f"value_{i}" for i in layers)]
        self.mixes = takes_chunk_group(self.session)
        # Seconds inside onnxruntime in the latest step, for the overhead measurement.
        self.last_graph_s = 0.0
        self.last_hidden: npt.NDArray[np.float32] | None = None

    def run(
        self, rows: Sequence[RowWork], chunk_rows: Sequence[RowWork] = (), hidden: bool = False
    ) -> npt.NDArray[np.float32]:
        """Logits [rows + chunk_rows, vocab] of each row's last token, in that order; the
        rows' new K/V are stored. One graph call where the graph takes both groups.
        `hidden` (a graph with the output only) fetches every new token's hidden state
        into `last_hidden`; a step without it copies nothing more out."""
        if not rows:
            rows, chunk_rows = chunk_rows, ()
        if chunk_rows and not self.mixes:
            return run_apart(self, self.run, rows, chunk_rows, hidden)
        feed, write = build_step_inputs(rows, self.block_size)
        if chunk_rows:
            more, more_write = build_step_inputs(
                chunk_rows, self.block_size, first_token=feed["input_ids"].size
            )
            feed |= {CHUNK_PREFIX + name: array for name, array in more.items()}
            write = join_writes(write, more_write)
        values = dict(self._pool_values)
        for name, array in feed.items():
            values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        names = [*self._outputs, HIDDEN_STATES] if hidden else self._outputs
        started = time.perf_counter()
        results = self.session.run_with_ort_values(names, values)
        self.last_graph_s = time.perf_counter() - started
        layers = self.shape.layers
        keys = [results[1 + i].numpy() for i in range(layers)]
        vals = [results[1 + layers + i].numpy() for i in range(layers)]
        self.pool.write(keys, vals, *write)
        # The real tokens' rows, in the order their K/V were written (padding left out).
        self.last_hidden = results[-1].numpy()[write[0]] if hidden else None
        logits: npt.NDArray[np.float32] = results[0].numpy()
        return logits

    def close(self) -> None:
        """Let the session (the weights) and the KV pool go now, not when the runner is
        collected: a late reference can keep a retired version's objects for a while
        (server/startup/gcheap.py)."""
        self._pool_values.clear()
        self.pool.release()
        del self.session


_Index = npt.NDArray[np.intp]
# Where a step's new K/V go: (flat output token, block, offset) per real new token.
Writes = tuple[_Index, _Index, _Index]


def takes_chunk_group(session: ort.InferenceSession) -> bool:
    """Whether the graph takes a second group of rows (`chunk_*` inputs). The graph gives
    them defaults (no rows), as initializers a feed overrides, which onnxruntime lists
    apart from the inputs."""
    names = {i.name for i in session.get_inputs()}
    names |= {i.name for i in session.get_overridable_initializers()}
    return all(CHUNK_PREFIX + name in names for name in _REQUIRED)


def join_writes(first: Writes, second: Writes) -> Writes:
    index, blocks, offsets = (np.concatenate(pair) for pair in zip(first, second, strict=True))
    return index, blocks, offsets


def step_shape(rows: Sequence[RowWork], block_size: int) -> tuple[int, int, int]:
    """(rows, longest chunk, past blocks) of a step, unpadded."""
    q = max(len(row.tokens) for row in rows)
    return len(rows), q, max(1, max(blocks_for(row.start, block_size) for row in rows))


def build_step_inputs(
    rows: Sequence[RowWork],
    block_size: int,
    shape: tuple[int, int, int] | None = None,
    first_token: int = 0,
) -> tuple[dict[str, npt.NDArray[Any]], Writes]:
    """One group's four inputs, and where each real new token's K/V goes (its index in
    the flat K/V outputs, where this group's tokens start at `first_token`; block;
    offset). `shape` pads the group to (rows, chunk, past blocks) at least as large as its
    own (a gear): a padding row is one token at position 0 that attends only itself, and
    its results are ignored."""
    batch, q, past_blocks = shape or step_shape(rows, block_size)
    past = past_blocks * block_size
    input_ids = np.zeros((batch, q), np.int64)
    positions = np.zeros((batch, q), np.int64)
    table = np.zeros((batch, past_blocks), np.int64)
    starts = np.zeros(batch, np.int64)
    pads = np.full(batch, q - 1, np.int64)
    out_rows: list[int] = []
    out_cols: list[int] = []
    slots: list[int] = []
    for r, row in enumerate(rows):
        n = len(row.tokens)
        pad = q - n
        input_ids[r, pad:] = row.tokens
        positions[r, pad:] = np.arange(row.start, row.start + n)
        held = row.blocks[:past_blocks]
        table[r, : len(held)] = held
        starts[r] = row.start
        pads[r] = pad
        out_rows.extend([r] * n)
        out_cols.extend(range(pad, q))
        slots.extend(range(row.start, row.start + n))
    past_ok = np.arange(past)[None, :] < starts[:, None]  # [batch, past]
    i = np.arange(q)[:, None]
    j = np.arange(q)[None, :]
    real_query = i[None] >= pads[:, None, None]  # [batch, q, 1]
    causal = (j[None] <= i[None]) & (j[None] >= pads[:, None, None])  # [batch, q, q]
    # A padding query attends itself only, so its (ignored) softmax stays finite.
    new_ok = np.where(real_query, causal, (i == j)[None])
    allowed = np.concatenate([past_ok[:, None, :] & real_query, new_ok], axis=2)
    mask = np.where(allowed, np.float32(0), MASKED).astype(np.float32)
    slot = np.asarray(slots, np.intp)
    flat_blocks = (
        np.concatenate([np.asarray(row.blocks, np.intp) for row in rows])
        if rows
        else np.zeros(0, np.intp)
    )
    # Each row's blocks, indexed by (row offset into flat_blocks) + slot // block_size.
    row_base = np.cumsum([0, *(len(row.blocks) for row in rows[:-1])])
    out_r = np.asarray(out_rows, np.intp)
    blocks: _Index = flat_blocks[row_base[out_r] + slot // block_size]
    offsets = slot % block_size
    feed: dict[str, npt.NDArray[Any]] = {
        "input_ids": input_ids,
        "positions": positions,
        "block_table": table,
        "attention_mask": mask,
    }
    flat: _Index = first_token + out_r * q + np.asarray(out_cols, np.intp)
    return feed, (flat, blocks, offsets)
