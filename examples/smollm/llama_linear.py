"""The step graph's projections: on fp32 weights, or on the GGUF's Q4_1 blocks as they
are (the one-token steps').

A Q4_1 block holds 32 weights of one row as w = d * q + m: an fp16 scale d, an fp16
minimum m and 32 four-bit q (the low nibbles are weights 0-15, the high ones 16-31).

onnxruntime's MatMulNBits (com.microsoft) reads 4-bit blocks as (q - zero_point) * scale.
Its fast kernels take integer zero points only; a float zero point (-m / d, which would
hold a Q4_1 block exactly) sends it to a path that dequantizes the whole matrix on every
call, slower than fp32. So each block takes the integer zero point z nearest -m / d,
and what that leaves of the minimum is a term apart, both exact:

    x . w = sum_b d_b (x_b . (q_b - z_b))  +  sum_b (m_b + z_b d_b) (sum of x_b)

the first a MatMulNBits, the second the block sums of x (a Reshape and a ReduceSum) times
the leftovers [blocks, out] (a MatMul), left out where they are all 0 (Q4_0: z = 8). The
sum is what the dequantized fp32 weights give, up to fp32 rounding, with the activations
kept fp32 (accuracy_level 0). Q4_0 (d (q - 8)) and Q4_K (eight blocks of d sc q - dmin m
a super-block) are such blocks too.

With int8 activations (accuracy_level 4) MatMulNBits rounds x to 8 bits per block of 32,
as llama.cpp does for its quantized dot products, and takes its integer kernels: a
third of the fp32-activation kernel's time for SmolLM2's projections, and the only fast
path for 8-bit weights, so the LM head can then read the GGUF's Q8_0 table (w = d * q,
an 8-bit MatMulNBits with zero point 128: a quarter of the fp32 table's bytes). Answers
then differ from the exact model's where two tokens' logits nearly tie.

onnxruntime's 4-bit kernel is fast for one row of x only (a GEMV that reads a quarter of
the fp32 weights' bytes); from two rows on it is as slow as fp32 or slower, and prefill
chunks are slower by a tenth. So the step graph uses these weights where a step has one
token (one stream decoding) and the fp32 ones otherwise (llama_onnx.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from llama_attention import Graph
from onnx import TensorProto, helper

BLOCK = 32
# d (fp16), m (fp16), 16 bytes of nibbles.
BLOCK_BYTES = 20
# d (fp16), 32 int8.
Q8_BLOCK_BYTES = 34
# d (fp16), 16 bytes of nibbles.
Q4_0_BLOCK_BYTES = 18
# d and dmin (fp16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles: 256 weights.
Q4_K_BLOCK_BYTES = 144
# 128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, d (fp16): 256 weights.
Q6_K_BLOCK_BYTES = 210
# d (fp16), 4 bytes of fifth bits, 16 of nibbles; Q5_1 an fp16 minimum after d; Q5_K
# Q4_K's super-block with 32 bytes of fifth bits before the nibbles.
Q5_0_BLOCK_BYTES = 22
Q5_1_BLOCK_BYTES = 24
Q5_K_BLOCK_BYTES = 176
Q8_ZERO = 128
# MatMulNBits' accuracy_level: fp32 activations, or int8 ones (llama.cpp's rounding).
FP32_ACTIVATIONS = 0
INT8_ACTIVATIONS = 4
DOMAIN = "com.microsoft"
# The projections a layer has (Hugging Face's `{kind}_proj`).
LINEAR_KINDS = ("q", "k", "v", "o", "gate", "up", "down")
# A projection: x [n, in] @ (the named weights' rows stacked, each times its factor)^T.
Linear = Callable[[Graph, str, Sequence[tuple[str, float]], str], str]


@dataclass(frozen=True)
class Q41Blocks:
    """A [rows, cols] weight as Q4_1 blocks along its columns (the input dimension)."""

    q: npt.NDArray[np.uint8]  # [rows, blocks, 32], values 0-15
    scale: npt.NDArray[np.float32]  # [rows, blocks]
    minimum: npt.NDArray[np.float32]  # [rows, blocks]

    @property
    def shape(self) -> tuple[int, int]:
        rows, blocks, _ = self.q.shape
        return rows, blocks * BLOCK

    def dequantize(self) -> npt.NDArray[np.float32]:
        w = self.q * self.scale[..., None] + self.minimum[..., None]
        return w.reshape(self.shape).astype(np.float32)

    def rows_reordered(self, order: npt.NDArray[np.intp]) -> Q41Blocks:
        return Q41Blocks(self.q[order], self.scale[order], self.minimum[order])

    def scaled(self, factor: float) -> Q41Blocks:
        """The weight times `factor` (a power of two keeps it exact)."""
        f = np.float32(factor)
        return Q41Blocks(self.q, self.scale * f, self.minimum * f)


@dataclass(frozen=True)
class Q80Blocks:
    """A [rows, cols] weight as 8-bit blocks along its columns, w = d * q (+ m): Q8_0's
    of 32, Q6_K's of 16 (q in -32..31), the 5-bit types' of 32 (q in 0..31, or -16..15
    for Q5_0; a minimum m for Q5_1 and Q5_K)."""

    q: npt.NDArray[np.int8]  # [rows, blocks, block]
    scale: npt.NDArray[np.float32]  # [rows, blocks]
    minimum: npt.NDArray[np.float32]  # [rows, blocks]; 0 where the type has none

    @property
    def shape(self) -> tuple[int, int]:
        rows, blocks, block = self.q.shape
        return rows, blocks * block

    @property
    def block(self) -> int:
        return int(self.q.shape[2])

    def dequantize(self) -> npt.NDArray[np.float32]:
        w = self.q.astype(np.float32) * self.scale[..., None] + self.minimum[..., None]
        return w.reshape(self.shape)

    def rows_reordered(self, order: npt.NDArray[np.intp]) -> Q80Blocks:
        return Q80Blocks(self.q[order], self.scale[order], self.minimum[order])

    def scaled(self, factor: float) -> Q80Blocks:
        """The weight times `factor` (a power of two keeps it exact)."""
        f = np.float32(factor)
        return Q80Blocks(self.q, self.scale * f, self.minimum * f)


# A projection's blocks as the GGUF stores them.
Blocks = Q41Blocks | Q80Blocks


def _blocks(data: npt.NDArray[np.uint8], size: int) -> npt.NDArray[np.uint8]:
    """A tensor's bytes as gguf's reader gives them, [rows, row bytes], as [rows, blocks,
    `size` bytes]."""
    return np.ascontiguousarray(data).reshape(data.shape[0], -1, size)


def _fp16(blocks: npt.NDArray[np.uint8], at: int) -> npt.NDArray[np.float32]:
    """The fp16 at byte `at` of every block, [rows, blocks]."""
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """16 bytes of nibbles a block as 32 values: the low nibbles first, then the high."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.uint8)


def q4_0_from_gguf(data: npt.NDArray[np.uint8]) -> Q41Blocks:
    """Blocks from a Q4_0 tensor's bytes: an fp16 scale d and 32 nibbles a block, w =
    d * (q - 8), which is d * q + (-8 d) exactly (a Q4_1 block whose minimum is -8 d)."""
    blocks = _blocks(data, Q4_0_BLOCK_BYTES)
    scale = _fp16(blocks, 0)
    return Q41Blocks(_nibbles(blocks[..., 2:]), scale, scale * np.float32(-8))


def q4_k_from_gguf(data: npt.NDArray[np.uint8]) -> Q41Blocks:
    """Blocks from a Q4_K tensor's bytes. A super-block of 256 weights holds an fp16 d
    and dmin, 12 bytes of eight 6-bit scales and eight 6-bit mins (one each per block of
    32), and 128 bytes of nibbles (each 32 bytes: block 2i in the low nibbles, 2i + 1 in
    the high ones); block j's weights are d sc_j q - dmin m_j, a Q4_1 block of scale
    d sc_j and minimum -dmin m_j, both exact in fp32."""
    blocks = _blocks(data, Q4_K_BLOCK_BYTES)
    rows, supers, _ = blocks.shape
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    # Bytes 0-3: scales 0-3 (low 6 bits), 4-7: mins 0-3; bytes 8-11 hold the low 4 bits
    # of scales 4-7 (low nibble) and mins 4-7 (high), whose top 2 bits are the top
    # 2 bits of bytes 0-3 (scales) and 4-7 (mins).
    first, second, rest = blocks[..., 4:8], blocks[..., 8:12], blocks[..., 12:16]
    scales = np.concatenate([first & 0x3F, (rest & 0x0F) | ((first >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([second & 0x3F, (rest >> 4) | ((second >> 2) & 0x30)], axis=-1)
    nibbles = blocks[..., 16:].reshape(rows, supers, 4, 1, BLOCK)
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=3).reshape(rows, supers * 8, BLOCK)
    scale = (d[..., None] * scales.astype(np.float32)).reshape(rows, -1)
    minimum = -(dmin[..., None] * mins.astype(np.float32)).reshape(rows, -1)
    return Q41Blocks(q.astype(np.uint8), scale, minimum)


def from_gguf(data: npt.NDArray[np.uint8]) -> Q41Blocks:
    """Blocks from a Q4_1 tensor's bytes as gguf's reader gives them, [rows, row bytes]."""
    blocks = _blocks(data, BLOCK_BYTES)
    return Q41Blocks(_nibbles(blocks[..., 4:]), _fp16(blocks, 0), _fp16(blocks, 2))


def stacked(parts: Sequence[Q41Blocks]) -> Q41Blocks:
    """The weights' rows one after another (Q, K and V as one projection)."""
    return Q41Blocks(
        np.concatenate([p.q for p in parts]),
        np.concatenate([p.scale for p in parts]),
        np.concatenate([p.minimum for p in parts]),
    )


def stacked8(parts: Sequence[Q80Blocks]) -> Q80Blocks:
    return Q80Blocks(
        np.concatenate([p.q for p in parts]),
        np.concatenate([p.scale for p in parts]),
        np.concatenate([p.minimum for p in parts]),
    )


def fp32_linear(weights: Mapping[str, npt.NDArray[np.float32]]) -> Linear:
    def apply(g: Graph, x: str, parts: Sequence[tuple[str, float]], prefix: str) -> str:
        rows = [weights[name] * np.float32(factor) for name, factor in parts]
        w_t = np.concatenate(rows, axis=0).T  # pre-transposed [in, out] for MatMul
        return g.op("MatMul", [x, g.const(f"{prefix}.weight_t", w_t)], prefix)

    return apply


def blocks_linear(
    blocks: Mapping[str, Blocks],
    weights: Mapping[str, npt.NDArray[np.float32]],
    int8_activations: bool = False,
    mixed: bool = False,
) -> Linear:
    """A projection on its parts' blocks where each has a form a kernel serves: 4-bit
    (Q4_0, Q4_1, Q4_K), or 8-bit (Q5_*, Q6_K, Q8_0) with int8 activations, the only fast 8-bit
    kernel; on the fp32 weights where any part has not (one GEMM, the fp32 weights being
    in the graph anyway), or, with `mixed` (a graph that keeps no fp32 copy of the
    others), that part alone on fp32. Neighbouring parts of one form are one kernel;
    parts of different forms (a Q6_K V beside Q4_K Q and K, as Q4_K_M stores them) are a
    kernel each, their outputs joined."""
    accuracy = INT8_ACTIVATIONS if int8_activations else FP32_ACTIVATIONS
    fallback = fp32_linear(weights)

    def form(found: Blocks | None) -> int:
        """4 or the 8-bit block size; 0: no kernel here."""
        if isinstance(found, Q41Blocks):
            return 4
        return found.block if isinstance(found, Q80Blocks) and int8_activations else 0

    def apply(g: Graph, x: str, parts: Sequence[tuple[str, float]], prefix: str) -> str:
        found = [(part, blocks.get(part), factor) for part, factor in parts]
        if not mixed and not all(form(b) for _, b, _ in found):
            return fallback(g, x, parts, prefix)
        runs = [list(run) for _, run in itertools.groupby(found, key=lambda pbf: form(pbf[1]))]
        outs = []
        for n, run in enumerate(runs):
            name = prefix if len(runs) == 1 else f"{prefix}.{n}"
            four = [b.scaled(f) for _, b, f in run if isinstance(b, Q41Blocks)]
            eight = [b.scaled(f) for _, b, f in run if isinstance(b, Q80Blocks)]
            if not form(run[0][1]):
                outs.append(fallback(g, x, [(part, f) for part, _, f in run], name))
            elif four:
                outs.append(q4_linear(g, x, stacked(four), name, accuracy))
            else:
                outs.append(q8_linear(g, x, stacked8(eight), name))
        return outs[0] if len(outs) == 1 else g.op("Concat", outs, f"{prefix}.out", axis=-1)

    return apply


def q6_k_from_gguf(data: npt.NDArray[np.uint8]) -> Q80Blocks:
    """Blocks from a Q6_K tensor's bytes. A super-block of 256 weights holds 128 bytes of
    low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales and an fp16 d; weight
    q (6 bits, less 32) of block j of 16 is d sc_j q: 8-bit blocks of 16, exact.
    Each half of 128 weights takes 64 low-nibble bytes (weights 0-63 in their low
    nibbles, 64-127 in the high ones) and 32 high bytes (bits 0-1 for weights 0-31,
    2-3 for 32-63, 4-5 for 64-95, 6-7 for 96-127)."""
    blocks = _blocks(data, Q6_K_BLOCK_BYTES)
    rows, supers, _ = blocks.shape
    low = blocks[..., 0:128].reshape(rows, supers, 2, 1, 64)
    high = blocks[..., 128:192].reshape(rows, supers, 2, 1, 32)
    scales = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)
    d = _fp16(blocks, 208)
    nibbles = np.concatenate([low & 0x0F, low >> 4], axis=3).reshape(rows, supers, 2, 4, 32)
    pairs = np.concatenate([(high >> s) & 0x03 for s in (0, 2, 4, 6)], axis=3)
    q = (nibbles | (pairs << 4)).astype(np.int16) - 32
    scale = (d[..., None] * scales).reshape(rows, -1)
    return Q80Blocks(q.astype(np.int8).reshape(rows, supers * 16, 16), scale, np.zeros_like(scale))


def _fifth_bits(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Q5_0 and Q5_1's 32 fifth bits a block, a little-endian uint32 (bit i: weight i),
    as [..., 32] of 0 or 16."""
    bits = np.unpackbits(packed, axis=-1, bitorder="little")
    return (bits << 4).astype(np.uint8)


def q5_0_from_gguf(data: npt.NDArray[np.uint8]) -> Q80Blocks:
    """Blocks from a Q5_0 tensor's bytes: an fp16 d, 4 bytes of fifth bits and 16 of
    nibbles (weights 0-15 low, 16-31 high) a block of 32; w = d (q - 16)."""
    blocks = _blocks(data, Q5_0_BLOCK_BYTES)
    scale = _fp16(blocks, 0)
    q = (_nibbles(blocks[..., 6:]) | _fifth_bits(blocks[..., 2:6])).astype(np.int16) - 16
    return Q80Blocks(q.astype(np.int8), scale, np.zeros_like(scale))


def q5_1_from_gguf(data: npt.NDArray[np.uint8]) -> Q80Blocks:
    """Blocks from a Q5_1 tensor's bytes: as Q5_0's with an fp16 minimum m after d;
    w = d q + m."""
    blocks = _blocks(data, Q5_1_BLOCK_BYTES)
    q = _nibbles(blocks[..., 8:]) | _fifth_bits(blocks[..., 4:8])
    return Q80Blocks(q.astype(np.int8), _fp16(blocks, 0), _fp16(blocks, 2))


def q5_k_from_gguf(data: npt.NDArray[np.uint8]) -> Q80Blocks:
    """Blocks from a Q5_K tensor's bytes: Q4_K's super-block (d, dmin, 12 bytes of
    scales and mins, 128 of nibbles) with 32 bytes of fifth bits before the nibbles
    (bit j of byte k: weight k of block j); block j is d sc_j q - dmin m_j, q in 0..31."""
    blocks = _blocks(data, Q5_K_BLOCK_BYTES)
    rows = blocks.shape[0]
    four = q4_k_from_gguf(
        np.concatenate([blocks[..., :16], blocks[..., 48:]], axis=-1).reshape(rows, -1)
    )
    fifth = blocks[..., 16:48]  # [rows, supers, 32]
    high = np.stack([(fifth >> j) & 1 for j in range(8)], axis=2)  # [rows, supers, 8, 32]
    q = four.q.reshape(high.shape) | (high << 4)
    return Q80Blocks(q.reshape(four.q.shape).astype(np.int8), four.scale, four.minimum)


def q8_from_gguf(data: npt.NDArray[np.uint8]) -> Q80Blocks:
    """Blocks from a Q8_0 tensor's bytes as gguf's reader gives them, [rows, row bytes]:
    each block an fp16 scale then 32 int8 weights."""
    blocks = _blocks(data, Q8_BLOCK_BYTES)
    scale = _fp16(blocks, 0)
    return Q80Blocks(blocks[..., 2:].copy().view(np.int8), scale, np.zeros_like(scale))


def head_switch(g: Graph, one_token: str, x: str, table: str, head: Q80Blocks, out: str) -> str:
    """The LM head in an If: x [rows, hidden] against the Q8_0 blocks where `one_token`
    (the 8-bit kernel on int8 activations), against the fp32 table (a Gemm) otherwise."""
    branches = []
    for tag in ("head_one_token/", "head_tokens/"):
        branch = Graph(tag, g)
        if tag == "head_one_token/":
            logits = q8_linear(branch, x, head, "lm_head")
        else:
            logits = branch.op("Gemm", [x, table], "lm_head.out", transB=1)
        output = helper.make_tensor_value_info(logits, TensorProto.FLOAT, None)
        branches.append(helper.make_graph(branch.nodes, tag.rstrip("/"), [], [output]))
    return g.ops("If", [one_token], [out], then_branch=branches[0], else_branch=branches[1])[0]


def q8_linear(g: Graph, x: str, w: Q80Blocks, prefix: str) -> str:
    """x [n, cols] @ w^T -> [n, rows] on int8 activations (MatMulNBits' fast path for
    8-bit weights): the int8 weights shifted to unsigned against a zero point of 128,
    plus each block's minimum as the 4-bit blocks carry theirs (zero_points: the
    integer nearest -m / d in the zero point, what is left a term apart)."""
    rows, cols = w.shape
    unsigned = (w.q.astype(np.int16) + Q8_ZERO).astype(np.uint8)
    z, left = _offsets(w.scale, w.minimum, -Q8_ZERO, Q8_ZERO - 1)
    zeros = (z.astype(np.int16) + Q8_ZERO).astype(np.uint8).reshape(-1)
    main = g.op(
        "MatMulNBits",
        [
            x,
            g.const(f"{prefix}.q8", unsigned, np.uint8),
            g.const(f"{prefix}.scale", w.scale.reshape(-1)),
            g.const(f"{prefix}.zero_point", zeros, np.uint8),
        ],
        f"{prefix}.kernel",
        domain=DOMAIN, K=cols, N=rows, bits=8, block_size=w.block,
        accuracy_level=INT8_ACTIVATIONS,
    )  # fmt: skip
    return _with_leftover(g, x, main, left, w.block, prefix)


def zero_points(w: Q41Blocks) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """Each block's integer zero point z nearest -m / d (0-15), and what the minimum
    leaves, m + z d: w = d q + m = d (q - z) + (m + z d). The kernel's term then holds
    nearly all of a block (all of a Q4_0 block, z = 8, which leaves 0), so with int8
    activations the offset is computed on the rounded activations as llama.cpp's
    q8_1 block sums do, and the two roundings cancel as there."""
    z, left = _offsets(w.scale, w.minimum, 0, 15)
    return z.astype(np.uint8), left


def _offsets(
    scale: npt.NDArray[np.float32], minimum: npt.NDArray[np.float32], low: int, high: int
) -> tuple[npt.NDArray[np.int16], npt.NDArray[np.float32]]:
    """Each block's integer z in low..high nearest -m / d, and m + z d."""
    safe = np.where(scale != 0, scale, np.float32(1))
    z = np.where(scale != 0, np.clip(np.round(-minimum / safe), low, high), 0).astype(np.int16)
    return z, (minimum + z.astype(np.float32) * scale).astype(np.float32)


def _with_leftover(
    g: Graph, x: str, main: str, left: npt.NDArray[np.float32], block: int, prefix: str
) -> str:
    """`main` plus the block sums of x times what the minima leave [blocks, out]; `main`
    itself where they leave nothing."""
    if not left.any():
        return main
    blocks = left.shape[1]
    per_block = g.op("Reshape", [x, g.ints(f"{prefix}.block_shape", [-1, blocks, block])],
                     f"{prefix}.x_blocks")  # fmt: skip
    sums = g.op(
        "ReduceSum", [per_block, g.ints("axes.last", [-1])], f"{prefix}.block_sums", keepdims=0
    )
    minima = g.const(f"{prefix}.minimum_t", np.ascontiguousarray(left.T))
    return g.op("Add", [main, g.op("MatMul", [sums, minima], f"{prefix}.minima")], f"{prefix}.out")


def q4_linear(g: Graph, x: str, w: Q41Blocks, prefix: str, accuracy: int = 0) -> str:
    """x [n, cols] @ w^T -> [n, rows]: MatMulNBits on the nibbles, less each block's zero
    point, plus the term of what the minima leave (none where that is 0 everywhere);
    `accuracy` is MatMulNBits' accuracy_level (0 fp32 activations, 4 int8)."""
    rows, cols = w.shape
    blocks = cols // BLOCK
    # MatMulNBits packs each pair of neighbours in a byte, the first in the low nibble,
    # and the zero points too (a last odd block's with a 0 beside it).
    packed = (w.q[..., 0::2] | (w.q[..., 1::2] << 4)).astype(np.uint8)
    z, left = zero_points(w)
    if blocks % 2:
        z = np.concatenate([z, np.zeros((rows, 1), np.uint8)], axis=1)
    zeros = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
    main = g.op(
        "MatMulNBits",
        [
            x,
            g.const(f"{prefix}.q4", packed, np.uint8),
            g.const(f"{prefix}.scale", w.scale.reshape(-1)),
            g.const(f"{prefix}.zero_point", zeros.reshape(-1), np.uint8),
        ],
        f"{prefix}.nibbles",
        domain=DOMAIN, K=cols, N=rows, bits=4, block_size=BLOCK, accuracy_level=accuracy,
    )  # fmt: skip
    return _with_leftover(g, x, main, left, BLOCK, prefix)
