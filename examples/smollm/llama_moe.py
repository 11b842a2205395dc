"""A mixture of experts in place of a layer's MLP (Qwen3-MoE's, Qwen2-MoE's, OLMoE's,
Granite MoE's, ERNIE 4.5's, Mixtral's), on onnxruntime's MoE and QMoE ops (com.microsoft). A shared
expert beside it is a dense MLP (llama_onnx.py's _shared_expert).

The router's logits (x @ router^T) go to the op, which takes their softmax over the
experts, keeps each token's top k, renormalizes those weights to sum 1 where asked
(`normalize_routing_weights`), and sums the chosen experts' SwiGLU MLPs (silu(gate) *
up, then down) by them, as Hugging Face's and llama.cpp's graphs compute them. Its fc1
is the gate's and the up projection's rows interleaved, [experts, 2 size, hidden] (the
SwiGLU layout its CPU kernel takes), its fc2 the down projection, [experts, hidden,
size].

Experts the GGUF stores as Q4_0 blocks go to QMoE as they are: 4-bit d (q - 8) over
blocks of 32 along each row, the GGUF's own values (the scales in fp32, two nibbles a
byte, the first low, `weights_prepacked` 0), so the op computes what the dequantized
weights would, within fp32 rounding; Qwen3-30B-A3B's sizes take about 2 ms a layer for
one token on two cores, and under a sixth of the fp32 weights' memory. onnxruntime
1.32's CPU QMoE renormalizes the kept weights whatever `normalize_routing_weights` says,
so it is always asked to, and OLMoE's output (not renormalized) is multiplied by their
sum: right whichever way a later version reads the flag. With `--int8-activations`
(where the dense projections round theirs: one-token steps, or every step with
`--low-memory`) it rounds its activations to 8 bits too (`accuracy_level` 4: each block
of 32 scaled by its largest value over 127 and rounded, fc1's input and fc2's, which is
llama.cpp's Q8_0 for Q4_0 weights), about 3.5 times as fast for one token at
Qwen3-30B-A3B's sizes, about 1 % off the exact output. Experts of any other type are
dequantized to fp32 for MoE: QMoE's 8-bit CPU path is about 1 % off the Q8_0 weights
(it rounds what it multiplies), and the other types' blocks are not its form. A factor
on the mixture's output (Granite's residual multiplier) is folded into fc2's weights or
scales. ERNIE 4.5 chooses its experts by their softmax weights plus a bias and weighs
them by the weights alone, which neither op takes: the router's logits they get are
raised for the chosen experts (_biased_choice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from llama_attention import Graph
from llama_linear import BLOCK, DOMAIN, q4_0_from_gguf
from onnx import TensorProto, helper

if TYPE_CHECKING:
    from llama_onnx import LlamaConfig

Weights = Mapping[str, npt.NDArray[np.float32]]
KINDS = ("gate", "up", "down")
# The GGUF type of experts QMoE takes as they are stored; any other is dequantized.
AS_STORED = "Q4_0"


def expert_name(layer: int, kind: str) -> str:
    """The stacked weight of one projection of a layer's experts (llama_weights.py)."""
    return f"model.layers.{layer}.mlp.experts.{kind}_proj.weight"


@dataclass(frozen=True)
class ExpertBlocks:
    """A stacked expert tensor [experts, rows, cols] as the GGUF's Q4_0 blocks of 32 along
    its columns, w = d (q - 8): the blocks' bytes as gguf's reader gives them (a view of
    the mapped file, so a 17 GB GGUF's experts are read a layer at a time as the graph
    takes them, not held twice)."""

    data: npt.NDArray[np.uint8]  # [experts * rows, blocks * 18]
    shape: tuple[int, int, int]

    def _values(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        four = q4_0_from_gguf(self.data)  # q [experts * rows, blocks, 32], 0-15
        return four.q, four.scale

    def qmoe(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """The values as QMoE reads them, two a byte, the first low, [experts, rows,
        cols / 2], and each block's d, [experts, rows, blocks]."""
        experts, rows, _ = self.shape
        q, scale = self._values()
        packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
        return packed.reshape(experts, rows, -1), scale.reshape(experts, rows, -1)

    def dequantize(self) -> npt.NDArray[np.float32]:
        q, scale = self._values()
        values = (q.astype(np.float32) - np.float32(8)) * scale[..., None]
        return values.reshape(self.shape).astype(np.float32)


def experts_from_gguf(
    kind: str, data: npt.NDArray[np.uint8], shape: tuple[int, ...]
) -> ExpertBlocks | None:
    """A stacked expert tensor's blocks where QMoE takes them as they are (Q4_0's); None
    for another type. `data`: the tensor's bytes as gguf's reader gives them, `shape` its
    numpy shape [experts, rows, cols]."""
    if kind != AS_STORED:
        return None
    experts, rows, cols = shape
    return ExpertBlocks(data.reshape(experts * rows, -1), (experts, rows, cols))


def moe(
    g: Graph,
    x: str,
    weights: Weights,
    experts: Mapping[str, ExpertBlocks],
    cfg: LlamaConfig,
    layer: int,
    factor: float,
    int8_activations: bool = False,
) -> str:
    """The layer's mixture of experts over x [tokens, hidden], times `factor`; on its
    experts' blocks where all three projections have them (`int8_activations`: rounding
    the activations they multiply to 8 bits), on fp32 weights otherwise."""
    p = f"model.layers.{layer}.mlp"
    router_t = np.ascontiguousarray(weights[f"{p}.router.weight"].T)
    logits = g.op("MatMul", [x, g.const(f"{p}.router.t", router_t)], f"{p}.router")
    if cfg.expert_selection_bias:
        logits = _biased_choice(g, logits, weights, cfg, p)
    attrs = {"k": cfg.experts_used, "activation_type": "swiglu", "swiglu_fusion": 1,
             "domain": DOMAIN}  # fmt: skip
    found = [experts.get(expert_name(layer, kind)) for kind in KINDS]
    blocks = [b for b in found if b is not None]
    if len(blocks) == len(KINDS):
        fc1 = f"{p}.experts.fc1.q"
        if not g.has(fc1):
            (gate_q, gate_d), (up_q, up_d), (down_q, down_d) = (b.qmoe() for b in blocks)
            g.const(fc1, _interleaved(gate_q, up_q), np.uint8)
            g.const(f"{p}.experts.fc1.scale", _interleaved(gate_d, up_d))
            g.const(f"{p}.experts.fc2.q", down_q, np.uint8)
            g.const(f"{p}.experts.fc2.scale", down_d * np.float32(factor))
        inputs = [x, logits, fc1, f"{p}.experts.fc1.scale", "", f"{p}.experts.fc2.q",
                  f"{p}.experts.fc2.scale", ""]  # fmt: skip
        if int8_activations:
            attrs["accuracy_level"] = 4
        out = g.op(
            "QMoE", inputs, f"{p}.experts", expert_weight_bits=4, block_size=BLOCK,
            weights_prepacked=0, normalize_routing_weights=1, **attrs,
        )  # fmt: skip
        if cfg.expert_norm:
            return out
        # Renormalized (the module's doc): times their sum, they are the softmax's again.
        probs = g.op("Softmax", [logits], f"{p}.router.probs", axis=-1)
        k = g.ints(f"{p}.router.k", [cfg.experts_used])
        kept = g.ops("TopK", [probs, k], [f"{p}.router.kept", f"{p}.router.kept_ids"], axis=-1)
        mass = g.op("ReduceSum", [kept[0], g.ints("axes.last", [-1])], f"{p}.router.mass")
        return g.op("Mul", [out, mass], f"{p}.experts.unnormed")
    fc1 = f"{p}.experts.fc1"
    if not g.has(fc1):
        gate_w, up_w, down_w = (_fp32(weights, experts, layer, kind) for kind in KINDS)
        g.const(fc1, _interleaved(gate_w, up_w))
        g.const(f"{p}.experts.fc2", down_w * np.float32(factor))
    norm = int(cfg.expert_norm)
    inputs = [x, logits, fc1, "", f"{p}.experts.fc2"]
    return g.op("MoE", inputs, f"{p}.experts", normalize_routing_weights=norm, **attrs)


def _biased_choice(g: Graph, logits: str, weights: Weights, cfg: LlamaConfig, p: str) -> str:
    """Router logits under which the op keeps the top k of the softmax plus the
    selection bias, weighted by the softmax alone: the chosen experts' logits raised past
    every other's by one amount (the logits' spread plus 1), which the renormalized
    softmax over the chosen cancels."""
    bias = g.const(f"{p}.router.selection", weights[f"{p}.router.selection.bias"])
    probs = g.op("Softmax", [logits], f"{p}.router.probs", axis=-1)
    biased = g.op("Add", [probs, bias], f"{p}.router.biased")
    k = g.ints(f"{p}.router.k", [cfg.experts_used])
    top, chosen = g.ops(
        "TopK", [biased, k], [f"{p}.router.biased_top", f"{p}.router.chosen"], axis=-1
    )
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    shape = g.op("Shape", [top], f"{p}.router.chosen_shape")
    ones = g.op("ConstantOfShape", [shape], f"{p}.router.ones", value=one)
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    zeros = g.op("ConstantOfShape", [g.op("Shape", [logits], f"{p}.router.shape")],
                 f"{p}.router.zeros", value=zero)  # fmt: skip
    mask = g.op("ScatterElements", [zeros, chosen, ones], f"{p}.router.mask", axis=-1)
    high = g.op("ReduceMax", [logits], f"{p}.router.max", axes=[-1], keepdims=1)
    low = g.op("ReduceMin", [logits], f"{p}.router.min", axes=[-1], keepdims=1)
    spread = g.op("Sub", [high, low], f"{p}.router.spread")
    lift = g.op("Add", [spread, g.const("router.one", 1.0)], f"{p}.router.lift")
    raised = g.op("Mul", [mask, lift], f"{p}.router.raised_by")
    return g.op("Add", [logits, raised], f"{p}.router.raised")


def _fp32(
    weights: Weights, experts: Mapping[str, ExpertBlocks], layer: int, kind: str
) -> npt.NDArray[np.float32]:
    name = expert_name(layer, kind)
    found = experts.get(name)
    return found.dequantize() if found is not None else weights[name]


def _interleaved(
    gate: npt.NDArray[np.generic], up: npt.NDArray[np.generic]
) -> npt.NDArray[np.generic]:
    """Gate's and up's rows alternating, per expert: [experts, 2 rows, ...]."""
    experts, rows, *rest = gate.shape
    both = np.empty((experts, 2 * rows, *rest), dtype=gate.dtype)
    both[:, 0::2] = gate
    both[:, 1::2] = up
    return both
