"""RoPE, attention over a paged KV cache for one group of rows, and the ONNX graph
builder the step graph (llama_onnx.py) is written with.

The step graph runs its dense layers once over the flat tokens of every group of rows, and
attention per group: each group is [batch, q] tokens (rows left-padded to the group's
longest), so decode rows (q = 1) and a prompt chunk (q = its length) each compute
attention at their own q, and decode rows are never padded to a chunk's length. Shapes are
computed in the graph from the group's inputs (every dim is symbolic); none uses -1, so a
group with no rows (zero-size tensors) runs too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt
import onnx
from onnx import helper, numpy_helper

if TYPE_CHECKING:
    from llama_onnx import LlamaConfig


def key_cache_name(layer: int) -> str:
    return f"key_cache_{layer}"


def value_cache_name(layer: int) -> str:
    return f"value_cache_{layer}"


@dataclass(frozen=True)
class GroupInputs:
    """The input names of one group of rows."""

    tag: str
    input_ids: str
    positions: str
    block_table: str
    attention_mask: str


class ExternalData:
    """The graph's large constants written to one file (onnx's external data) as they are
    made: a model of several GB is then held once, as the caller's weights, not twice
    more as their copies in the graph and in its serialized form."""

    # onnxruntime maps a tensor at an offset aligned to the page, rather than copying it.
    ALIGN = 4096
    # onnx's own threshold: smaller constants stay in the graph.
    THRESHOLD = 1024

    def __init__(self, file: BinaryIO, location: str) -> None:
        self.file = file
        self.location = location

    def tensor(self, name: str, array: npt.NDArray[Any]) -> onnx.TensorProto:
        end = self.file.seek(0, 2)
        offset = -(-end // self.ALIGN) * self.ALIGN
        self.file.write(bytes(offset - end))
        self.file.write(array.data.cast("B"))
        tensor = onnx.TensorProto(name=name, dims=array.shape)
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (
            ("location", self.location),
            ("offset", offset),
            ("length", array.nbytes),
        ):
            tensor.external_data.add(key=key, value=str(value))
        return tensor


class Graph:
    """Nodes and initializers as they are added, with unique names. A subgraph (an If
    branch, `outer` its graph) prefixes its nodes' outputs, so that no two scopes make the
    same name, and puts its constants in the outer graph, where both branches share them;
    the tensors it reads from the outer graph are named as they are. With `external`,
    large constants go to its file as they are added."""

    def __init__(
        self, prefix: str = "", outer: Graph | None = None, external: ExternalData | None = None
    ) -> None:
        self.prefix = prefix
        self.outer = outer
        self.external = external
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def const(self, name: str, value: npt.ArrayLike, dtype: type = np.float32) -> str:
        """An initializer; a name already added is the same constant, added once."""
        if self.outer is not None:
            return self.outer.const(name, value, dtype)
        if name in self._names:
            return name
        self._names.add(name)
        array: npt.NDArray[Any] = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        if self.external is not None and array.nbytes >= ExternalData.THRESHOLD:
            self.initializers.append(self.external.tensor(name, array))
        else:
            self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def has(self, name: str) -> bool:
        """Whether a constant of that name was added (one large to make, made once)."""
        return self.outer.has(name) if self.outer is not None else name in self._names

    def ints(self, name: str, values: Sequence[int]) -> str:
        return self.const(name, list(values), np.int64)

    def op(self, kind: str, inputs: Sequence[str], name: str, **attrs: Any) -> str:
        name = self.prefix + name
        self.nodes.append(helper.make_node(kind, list(inputs), [name], name=name, **attrs))
        return name

    def ops(
        self, kind: str, inputs: Sequence[str], names: Sequence[str], **attrs: Any
    ) -> list[str]:
        names = [self.prefix + name for name in names]
        self.nodes.append(helper.make_node(kind, list(inputs), names, name=names[0], **attrs))
        return names

    def rms_norm(self, x: str, weight: npt.NDArray[np.float32], prefix: str, eps: float) -> str:
        """The Pow/ReduceMean/Add/Sqrt/Div/Mul chain onnxruntime fuses."""
        square = self.op("Pow", [x, self.const(f"{prefix}.two", 2.0)], f"{prefix}.square")
        mean = self.op("ReduceMean", [square], f"{prefix}.mean", axes=[-1], keepdims=1)
        var = self.op("Add", [mean, self.const(f"{prefix}.eps", eps)], f"{prefix}.var")
        std = self.op("Sqrt", [var], f"{prefix}.std")
        normed = self.op("Div", [x, std], f"{prefix}.normed")
        return self.op("Mul", [normed, self.const(f"{prefix}.weight", weight)], f"{prefix}.out")

    def softcap(self, x: str, cap: float, out: str) -> str:
        """cap * tanh(x / cap), as Mul(Tanh(Div(x, cap)), cap)."""
        c = self.const(f"{out}.cap", cap)
        tanh = self.op("Tanh", [self.op("Div", [x, c], f"{out}.div")], f"{out}.tanh")
        return self.op("Mul", [tanh, c], out)

    def gelu_tanh(self, x: str, prefix: str) -> str:
        """GELU's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (opset 17 has no
        Gelu op); written in the order onnxruntime's FastGelu fusion matches."""
        cube = self.op("Pow", [x, self.const("gelu.three", 3.0)], f"{prefix}.cube")
        inner = self.op(
            "Add", [x, self.op("Mul", [cube, self.const("gelu.c", 0.044715)], f"{prefix}.c3")],
            f"{prefix}.inner",
        )  # fmt: skip
        scaled = self.op("Mul", [inner, self.const("gelu.root", math.sqrt(2 / math.pi))],
                         f"{prefix}.scaled")  # fmt: skip
        one = self.op("Add", [self.op("Tanh", [scaled], f"{prefix}.tanh"),
                              self.const("gelu.one", 1.0)], f"{prefix}.one")  # fmt: skip
        half = self.op("Mul", [x, self.const("gelu.half", 0.5)], f"{prefix}.half")
        return self.op("Mul", [half, one], f"{prefix}.out")


def rope_tables(
    cfg: LlamaConfig, theta: float, factors: Sequence[float] | None, rows: int, magnitude: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """(cos, sin) [rows, head_dim] of positions 0.. for rotate-half RoPE at base `theta`
    over the config's rotated dimensions, in float64 rounded once to float32, each
    frequency divided by its factor where given, both times `magnitude` (LongRoPE's or
    YaRN's); the dimensions past them get cos 1 and sin 0 (passed as they are).
    The sin table's first half is negated: rotate-half is concat(-x2, x1), so
    x*cos + concat(x2, x1)*signed_sin is the same rotation."""
    r = cfg.rotary_dim
    inv_freq = 1.0 / (theta ** (np.arange(0, r, 2, dtype=np.float64) / r))
    if factors is not None:  # llama.cpp divides each frequency by its factor
        inv_freq = inv_freq / np.asarray(factors, dtype=np.float64)
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv_freq
    cos = np.cos(np.concatenate([angles, angles], axis=-1)) * magnitude
    sin = np.sin(angles) * magnitude
    passed = (len(angles), cfg.head_dim - r)
    cos = np.concatenate([cos, np.ones(passed)], axis=-1)
    signed_sin = np.concatenate([-sin, sin, np.zeros(passed)], axis=-1)
    return cos.astype(np.float32), signed_sin.astype(np.float32)


def rope(g: Graph, x: str, env: Mapping[str, str], rotary: int, d: int, prefix: str) -> str:
    """x [..., head_dim] rotated over its first `rotary` dimensions: x*cos +
    concat(x2, x1, rest)*signed_sin (the rest's sin is 0, its cos 1)."""
    half = rotary // 2
    sizes, names = [half, half], [f"{prefix}.x1", f"{prefix}.x2"]
    if rotary < d:
        sizes, names = [*sizes, d - rotary], [*names, f"{prefix}.rest"]
    parts = g.ops("Split", [x, g.ints(f"{prefix}.halves", sizes)], names, axis=-1)
    swapped = g.op("Concat", [parts[1], parts[0], *parts[2:]], f"{prefix}.swapped", axis=-1)
    return g.op(
        "Add",
        [
            g.op("Mul", [x, env["cos"]], f"{prefix}.xcos"),
            g.op("Mul", [swapped, env["sin"]], f"{prefix}.xsin"),
        ],
        f"{prefix}.out",
    )


def attention(
    g: Graph,
    q: str,
    key: str,
    value: str,
    cfg: LlamaConfig,
    i: int,
    env: Mapping[str, str],
    tag: str,
) -> str:
    """One group's attention: its flat q [n, heads, d], key and value [n, kv_heads, d] (the
    group's rows x chunk, row-major) against its rows' past blocks; returns the context
    [n, heads * d]."""
    p = f"model.layers.{i}.{tag}"
    # Queries grouped by KV head: [b, q, kvh, grp, d] -> [b, kvh, grp * q, d].
    q5 = g.op("Reshape", [q, env["q5_shape"]], f"{p}.q5")
    qt = g.op("Transpose", [q5], f"{p}.q5t", perm=[0, 2, 3, 1, 4])
    qg = g.op("Reshape", [qt, env["qg_shape"]], f"{p}.qg")
    # The past: [b, blocks, bs, kvh, d] gathered from the pool -> K^T [b, kvh, d, past],
    # V [b, kvh, past, d].
    table = env["block_table"]
    past_k = g.op("Gather", [key_cache_name(i), table], f"{p}.past_k", axis=0)
    past_kt = g.op("Transpose", [past_k], f"{p}.past_kt5", perm=[0, 3, 4, 1, 2])
    past_kt = g.op("Reshape", [past_kt, env["kt_shape"]], f"{p}.past_kt")
    past_v = g.op("Gather", [value_cache_name(i), table], f"{p}.past_v", axis=0)
    past_vt = g.op("Transpose", [past_v], f"{p}.past_vt5", perm=[0, 3, 1, 2, 4])
    past_vt = g.op("Reshape", [past_vt, env["v_shape"]], f"{p}.past_vt")
    key4 = g.op("Reshape", [key, env["kv4_shape"]], f"{p}.key4")
    value4 = g.op("Reshape", [value, env["kv4_shape"]], f"{p}.value4")
    new_kt = g.op("Transpose", [key4], f"{p}.new_kt", perm=[0, 2, 3, 1])
    new_vt = g.op("Transpose", [value4], f"{p}.new_vt", perm=[0, 2, 1, 3])
    scores = g.op(
        "Concat",
        [
            g.op("MatMul", [qg, past_kt], f"{p}.scores_past"),
            g.op("MatMul", [qg, new_kt], f"{p}.scores_new"),
        ],
        f"{p}.scores",
        axis=-1,
    )
    if cfg.attention_softcap:  # on the scaled scores, before the mask (Gemma 2's)
        scores = g.softcap(scores, cfg.attention_softcap, f"{p}.scores_capped")
    scores5 = g.op("Reshape", [scores, env["scores5_shape"]], f"{p}.scores5")
    mask = env["mask5_sliding" if i in cfg.sliding_layers else "mask5"]
    masked = g.op("Add", [scores5, mask], f"{p}.masked")
    probs5 = g.op("Softmax", [masked], f"{p}.probs5", axis=-1)
    probs = g.op("Reshape", [probs5, env["probs_shape"]], f"{p}.probs")
    probs_past, probs_new = g.ops(
        "Split", [probs, env["past_new_split"]], [f"{p}.probs_past", f"{p}.probs_new"], axis=-1
    )
    context = g.op(
        "Add",
        [
            g.op("MatMul", [probs_past, past_vt], f"{p}.ctx_past"),
            g.op("MatMul", [probs_new, new_vt], f"{p}.ctx_new"),
        ],
        f"{p}.ctx",
    )
    # [b, kvh, grp * q, d] -> [b, kvh, grp, q, d] -> [b, q, kvh, grp, d] -> [n, hidden].
    ctx5 = g.op("Reshape", [context, env["ctx5_shape"]], f"{p}.ctx5")
    ctxt = g.op("Transpose", [ctx5], f"{p}.ctx5t", perm=[0, 3, 1, 2, 4])
    return g.op("Reshape", [ctxt, env["flat_shape"]], f"{p}.ctx2")


def group_shapes(
    g: Graph, cfg: LlamaConfig, inputs: GroupInputs, block_size: str
) -> dict[str, str]:
    """The shape tensors of one group of rows ([batch, q] tokens each)."""
    d, kvh, grp, tag = cfg.head_dim, cfg.num_kv_heads, cfg.group, inputs.tag
    zero, one, two = g.ints("c.0", [0]), g.ints("c.1", [1]), g.ints("c.2", [2])
    ids_shape = g.op("Shape", [inputs.input_ids], f"{tag}.shape.ids")
    batch = g.op("Slice", [ids_shape, zero, one], f"{tag}.shape.batch")
    q_len = g.op("Slice", [ids_shape, one, two], f"{tag}.shape.q")
    table_shape = g.op("Shape", [inputs.block_table], f"{tag}.shape.table")
    blocks = g.op("Slice", [table_shape, one, two], f"{tag}.shape.blocks")
    past = g.op("Mul", [blocks, block_size], f"{tag}.shape.past")
    kvh_c, d_c, grp_c = g.ints("c.kvh", [kvh]), g.ints("c.d", [d]), g.ints("c.grp", [grp])
    env = {
        "tag": tag,
        "block_table": inputs.block_table,
        "mask5": g.op(
            "Unsqueeze", [inputs.attention_mask, g.ints("axes.1_2", [1, 2])], f"{tag}.mask5"
        ),
        "tokens": g.op("Mul", [batch, q_len], f"{tag}.shape.tokens"),
    }
    env["q5_shape"] = g.op("Concat", [batch, q_len, kvh_c, grp_c, d_c], f"{tag}.shape.q5", axis=0)
    env["qg_shape"] = g.op(
        "Concat", [batch, kvh_c, g.op("Mul", [grp_c, q_len], f"{tag}.shape.gq"), d_c],
        f"{tag}.shape.qg", axis=0,
    )  # fmt: skip
    env["kv4_shape"] = g.op("Concat", [batch, q_len, kvh_c, d_c], f"{tag}.shape.kv4", axis=0)
    env["kt_shape"] = g.op("Concat", [batch, kvh_c, d_c, past], f"{tag}.shape.kt", axis=0)
    env["v_shape"] = g.op("Concat", [batch, kvh_c, past, d_c], f"{tag}.shape.v", axis=0)
    keys = g.op("Add", [past, q_len], f"{tag}.shape.keys")
    env["scores5_shape"] = g.op(
        "Concat", [batch, kvh_c, grp_c, q_len, keys], f"{tag}.shape.scores5", axis=0
    )
    env["ctx5_shape"] = g.op(
        "Concat", [batch, kvh_c, grp_c, q_len, d_c], f"{tag}.shape.ctx5", axis=0
    )
    env["past_new_split"] = g.op("Concat", [past, q_len], f"{tag}.shape.past_new", axis=0)
    env["probs_shape"] = g.op(
        "Concat", [batch, kvh_c, g.op("Mul", [grp_c, q_len], f"{tag}.shape.gq2"), keys],
        f"{tag}.shape.probs", axis=0,
    )  # fmt: skip
    env["flat_shape"] = g.op(
        "Concat", [env["tokens"], g.ints("c.qd", [cfg.num_heads * d])], f"{tag}.shape.flat",
        axis=0,
    )  # fmt: skip
    env["rows3_shape"] = g.op(
        "Concat", [batch, q_len, g.ints("c.h", [cfg.hidden_size])], f"{tag}.shape.rows3", axis=0
    )
    env["last"] = g.op(
        "Squeeze", [g.op("Sub", [q_len, one], f"{tag}.shape.last1")], f"{tag}.shape.last"
    )  # a scalar index: Gather drops the query axis
    if cfg.sliding_layers:
        env["mask5_sliding"] = _sliding_mask(g, cfg, inputs, batch, past)
    return env


def _sliding_mask(g: Graph, cfg: LlamaConfig, inputs: GroupInputs, batch: str, past: str) -> str:
    """The group's mask [b, 1, 1, q, past + q] for the local layers: its attention mask,
    and every key `sliding_window` or more positions before the query masked too (llama.cpp's
    and Hugging Face's rule). Past slot t holds position t (the block table's order), a new
    key its own position; a query always sees itself, so no row is masked whole."""
    tag = inputs.tag
    slots = g.op(
        "Range",
        [g.const("c.0s", 0, np.int64), g.op("Squeeze", [past], f"{tag}.shape.past_s"),
         g.const("c.1s", 1, np.int64)],
        f"{tag}.window.slots",
    )  # fmt: skip
    slots2 = g.op("Unsqueeze", [slots, g.ints("axes.0", [0])], f"{tag}.window.slots2")
    shape = g.op("Concat", [batch, past], f"{tag}.window.shape", axis=0)
    rows = g.op("Expand", [slots2, shape], f"{tag}.window.past")
    keys = g.op("Concat", [rows, inputs.positions], f"{tag}.window.keys", axis=1)
    back = g.op(
        "Sub",
        [g.op("Unsqueeze", [inputs.positions, g.ints("axes.2", [2])], f"{tag}.window.q3"),
         g.op("Unsqueeze", [keys, g.ints("axes.1", [1])], f"{tag}.window.k3")],
        f"{tag}.window.back",
    )  # fmt: skip
    far = g.op("GreaterOrEqual", [back, g.const("window", cfg.sliding_window, np.int64)],
               f"{tag}.window.far")  # fmt: skip
    outside = g.op("Where", [far, g.const("window.masked", -1e9), g.const("window.open", 0.0)],
                   f"{tag}.window.outside")  # fmt: skip
    mask = g.op("Add", [inputs.attention_mask, outside], f"{tag}.window.mask")
    return g.op("Unsqueeze", [mask, g.ints("axes.1_2", [1, 2])], f"{tag}.mask5_sliding")
