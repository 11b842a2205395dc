"""The step graph on the GE backend (`placement: npu`): ND gears over batch, chunk length
and past blocks, on an Ascend NPU or the simulated one.

An NPU runs compiled shapes only, so the step graph is compiled once with ND gears
(`graph.ge.dynamicDims`), and each step is padded up to the smallest gear that holds it:
rows (padding rows are one token that attends itself), the chunk length (left padding,
masked) and the past blocks (block 0, masked). Decode steps use the gears with a chunk of
1, prefill steps those with the prefill chunk gears; every gear combines a batch gear, a
chunk gear and a block gear, so `max_num_seqs`, `max_num_batched_tokens` and
`max_model_len` must fit the largest ones, which the load checks.

The GE backend loads the graph as a model of its own (one executor, the first slot of
its plan), which the engine thread drives directly; the executor binds its device on
that thread. The KV pool is one of the graph's inputs, so each step copies it to the
device with the others: correct everywhere, cheap on the simulated NPU (host memory), and
the reason a real NPU would want the pool device-resident (docs/generation.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx

from ge_serve.protos import model_config_pb2

from ..base import Backend, LoadedModel, ModelSpec, ShapeRejected
from ..onnx_io import load_onnx, onnx_tensors
from .kvcache import KvPool
from .runner import (
    GraphShape,
    RowWork,
    build_step_inputs,
    check_positions,
    max_positions,
    run_apart,
    step_shape,
)

_STEP_INPUTS = ("input_ids", "positions", "block_table", "attention_mask")


@dataclass(frozen=True, slots=True)
class StepGears:
    batch: tuple[int, ...]
    # Prefill chunk lengths (decode steps always have a chunk of 1).
    chunks: tuple[int, ...]
    blocks: tuple[int, ...]

    def all(self) -> list[tuple[int, int, int]]:
        """Every (rows, chunk, past blocks) the graph is compiled for."""
        chunks = sorted({1, *self.chunks})
        return [(b, q, n) for q in chunks for b in self.batch for n in self.blocks]

    def fit(self, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        rows, chunk, blocks = shape
        try:
            return (
                min(b for b in self.batch if b >= rows),
                1 if chunk == 1 else min(q for q in self.chunks if q >= chunk),
                min(n for n in self.blocks if n >= blocks),
            )
        except ValueError:
            raise ShapeRejected(
                f"a step of {rows} rows, chunk {chunk} and {blocks} past blocks fits no gear "
                f"(batch {list(self.batch)}, chunks {list(self.chunks)}, blocks "
                f"{list(self.blocks)})"
            ) from None


def standard_ops_only(model: onnx.ModelProto) -> None:
    """ValueError where the step graph uses operators outside ONNX's own domain: ATC
    compiles those alone (the GGUF build's graph, with onnxruntime's com.microsoft kernels,
    would load on the simulated NPU and fail on a real one). Checked here, not for every
    GE model: ATC takes other domains' operators through custom-op plugins, which a user's
    own model may have; no plugin makes onnxruntime's kernels."""
    others = sorted({op.domain for op in model.opset_import} - {"", "ai.onnx"})
    if others:
        raise ValueError(
            f"parameter placement: npu takes a step graph of standard ONNX operators, which "
            f"ATC compiles; this one uses the {', '.join(others)} domain (a graph for "
            "onnxruntime: build it with examples/smollm/build.py --fp32-only; a mixture of "
            "experts, whose MoE operators are onnxruntime's, cannot run on placement npu)"
        )


def graph_shape_of(path: Path, block_size: int) -> GraphShape:
    """The graph's layers, heads and vocabulary, read from the file (no session), which
    must be standard ONNX."""
    model = load_onnx(path)
    standard_ops_only(model)
    inputs, outputs, _ = onnx_tensors(model)
    names = {t.name: t for t in inputs}
    out = {t.name: t for t in outputs}
    missing = [n for n in _STEP_INPUTS if n not in names]
    if missing or "logits" not in out or "key_cache_0" not in names:
        raise ValueError(f"the step model lacks input(s) {missing or ['key_cache_0']} or logits")
    layers = 0
    while f"key_cache_{layers}" in names:
        layers += 1
    dims = names["key_cache_0"].dims
    if len(dims) != 4 or dims[2] < 0 or dims[3] < 0:
        raise ValueError(f"key_cache_0 must have fixed heads and head size, got {list(dims)}")
    if dims[1] > 0 and dims[1] != block_size:
        raise ValueError(
            f"parameter kv_block_size {block_size} differs from the step model's block "
            f"size {dims[1]}"
        )
    vocab = out["logits"].dims[-1]
    if vocab < 0:
        raise ValueError("the step model's logits must have a fixed vocabulary dimension")
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    return GraphShape(layers, dims[2], dims[3], vocab, positions=max_positions(metadata))


def step_config(
    name: str, shape: GraphShape, pool_blocks: int, block_size: int, gears: StepGears
) -> model_config_pb2.ModelConfig:
    """The step graph as a GE model: ND gears over (rows, chunk, past blocks)."""
    config = model_config_pb2.ModelConfig(name=name, backend="ge", max_batch_size=0)
    int64, fp32 = model_config_pb2.TYPE_INT64, model_config_pb2.TYPE_FP32
    cache = [pool_blocks, block_size, shape.kv_heads, shape.head_dim]
    declared: list[tuple[str, int, list[int]]] = [
        ("input_ids", int64, [-1, -1]),
        ("positions", int64, [-1, -1]),
        ("block_table", int64, [-1, -1]),
        ("attention_mask", fp32, [-1, -1, -1]),
    ]
    for layer in range(shape.layers):
        declared += [(f"key_cache_{layer}", fp32, cache), (f"value_cache_{layer}", fp32, cache)]
    for tensor, kind, dims in declared:
        config.input.add(name=tensor, data_type=kind, dims=dims)
    config.output.add(name="logits", data_type=fp32, dims=[-1, shape.vocab])
    new = [-1, shape.kv_heads, shape.head_dim]  # flat over rows x chunk
    for layer in range(shape.layers):
        config.output.add(name=f"key_{layer}", data_type=fp32, dims=new)
        config.output.add(name=f"value_{layer}", data_type=fp32, dims=new)
    input_shape = ";".join(f"{t}:{','.join(str(d) for d in dims)}" for t, _, dims in declared)
    values = ";".join(
        f"{b},{q},{b},{q},{b},{n},{b},{q},{n * block_size + q}" for b, q, n in gears.all()
    )
    config.parameters["graph.ge.inputShape"].string_value = input_shape
    config.parameters["graph.ge.dynamicDims"].string_value = values
    return config


class GeStepRunner:
    """The step graph on the GE backend, with its KV pool. One thread calls it."""

    def __init__(
        self,
        ge: Backend,
        name: str,
        path: Path,
        blocks: int,
        block_size: int,
        gears: StepGears,
        max_model_len: int,
    ) -> None:
        self.shape = graph_shape_of(path, block_size)
        check_positions(self.shape, max_model_len)  # before the compile, which takes long
        self.block_size = block_size
        self.gears = gears
        self.pool = KvPool(
            self.shape.layers, blocks, block_size, self.shape.kv_heads, self.shape.head_dim
        )
        config = step_config(f"{name}.step", self.shape, blocks + 1, block_size, gears)
        spec = ModelSpec(config.name, 1, config, path.parent, path)
        self._loaded: LoadedModel | None = ge.load(spec)
        self._executor = self._loaded.executors[0]
        self.device = self._executor.slot.device
        self.last_graph_s = 0.0
        # The compiled step declares no `hidden_states` output (shape.hidden is False), so
        # the engine refuses prompt_logprobs on the NPU and never asks for them.
        self.last_hidden: npt.NDArray[np.float32] | None = None

    def run(
        self, rows: Sequence[RowWork], chunk_rows: Sequence[RowWork] = (), hidden: bool = False
    ) -> npt.NDArray[np.float32]:
        """Logits [rows + chunk_rows, vocab]. The compiled graph has the first group's
        inputs only (the second keeps its default of no rows, see runner.py), so the
        groups run as two calls, each padded to its own gear."""
        if not chunk_rows or not rows:
            return self._run(rows or chunk_rows)
        return run_apart(self, self._run, rows, chunk_rows)

    def _run(self, rows: Sequence[RowWork], hidden: bool = False) -> npt.NDArray[np.float32]:
        padded = self.gears.fit(step_shape(rows, self.block_size))
        feed, write = build_step_inputs(rows, self.block_size, padded)
        full = dict(feed)
        for layer in range(self.shape.layers):
            full[f"key_cache_{layer}"] = self.pool.keys[layer]
            full[f"value_cache_{layer}"] = self.pool.values[layer]
        started = time.perf_counter()
        out = self._executor.execute(full)
        self.last_graph_s = time.perf_counter() - started
        layers = range(self.shape.layers)
        keys = [out[f"key_{i}"] for i in layers]
        values = [out[f"value_{i}"] for i in layers]
        self.pool.write(keys, values, *write)
        logits: npt.NDArray[np.float32] = out["logits"][: len(rows)]
        return logits

    def close(self) -> None:
        if self._loaded is not None:
            self._loaded.close()
            self._loaded = None
        self.pool.release()
