"""A generative model's settings, read from its config.pbtxt parameters.

Every setting the engine cannot honour fails the load with the reason, so a model that
loads can serve every request its limits admit. The files a parameter names are
resolved inside the version folder (backends/paths.py), never outside the model folder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ge_serve.protos import model_config_pb2

from ..onnx_io import within_thread_bound
from ..paths import resolve_inside
from ..text_bool import parse_bool

BATCHING_MODES = ("iteration", "request", "none")
# vLLM's --scheduling-policy: `fcfs` (arrival order; a request's priority is ignored) or
# `priority` (the waiting queue by (priority, arrival), lowest first; scheduler/genplan.py).
SCHEDULING_POLICIES = ("fcfs", "priority")

# Engine parameters and their defaults (strings, as config.pbtxt carries them).
DEFAULTS: dict[str, str] = {
    "step_model": "model.onnx",
    "tokenizer": "tokenizer.json",
    "chat_template": "",
    "eos_token_ids": "",
    "bos_token": "",
    "eos_token": "",
    "max_model_len": "2048",
    "kv_cache_blocks": "512",
    "kv_block_size": "16",
    "max_num_seqs": "32",
    "max_num_batched_tokens": "256",
    "batching": "iteration",
    "scheduling_policy": "fcfs",
    "enable_prefix_caching": "true",
    "intra_op_thread_count": "0",
    "allow_spinning": "true",
    "default_max_tokens": "256",
    "default_temperature": "1.0",
    "default_top_p": "1.0",
    "default_top_k": "0",
    "max_logprobs": "20",
    "placement": "cpu",
    "npu_batch_gears": "",
    "npu_chunk_gears": "",
    "npu_block_gears": "",
}
PLACEMENTS = ("cpu", "npu")
# Parameters an llm model's config may carry that nothing here reads: Triton's
# EXECUTION_ENV_PATH (checked to stay in the model folder, server/models/config_paths.py)
# and Triton's vLLM backend's own (its model.py reads REPORT_CUSTOM_METRICS, which
# server/observability/genmetrics.py honours, and ENABLE_VLLM_HEALTH_CHECK), which its
# users' configs carry over. The batcher's adaptive_* and bucket_* parameters and the
# front end's chat_template_source are not among them: a generative model has neither a
# batcher nor a template but its own `chat_template`, so they would be silently unused.
SERVER_KEYS = frozenset(("EXECUTION_ENV_PATH", "REPORT_CUSTOM_METRICS", "ENABLE_VLLM_HEALTH_CHECK"))
# Of those, the vLLM backend's switches: a value that is not a boolean fails the load, where
# the vLLM backend reads anything but "true" as off and ge-serve's metrics default is on,
# so a typo such as "flase" would mean opposite things on the two servers.
SWITCHES = ("REPORT_CUSTOM_METRICS", "ENABLE_VLLM_HEALTH_CHECK")


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request that says nothing gets unless configured: vLLM's temperature,
    top_p and top_k, but 256 tokens where vLLM's SamplingParams default to 16 (the
    `default_max_tokens` parameter; a request gets at most what its prompt leaves)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int


@dataclass(frozen=True, slots=True)
class EngineSettings:
    step_model: Path
    tokenizer: Path
    # None when the model names no chat template.
    chat_template: Path | None
    eos_token_ids: tuple[int, ...]
    bos_token: str
    eos_token: str
    # Prompt plus generated tokens of one sequence, at most.
    max_model_len: int
    # Usable KV blocks (the pool holds one more: block 0, the padding block).
    kv_cache_blocks: int
    kv_block_size: int
    # Sequences that hold KV blocks at once (running plus being prefilled).
    max_num_seqs: int
    # Prompt tokens one iteration prefills, at most, counted padded (rows x longest chunk).
    max_num_batched_tokens: int
    batching: str
    intra_op_threads: int
    defaults: SamplingDefaults
    # onnxruntime's intra-op threads spin between a step's parallel ops rather than sleep
    # (the onnxruntime backend's `allow_spinning`, off there: its slots share the cores).
    # A step is thousands of small ops, each handed to the threads: waking a sleeping one
    # for each cost SmolLM2 a sixth of its one-stream speed, and llama.cpp's threads spin.
    allow_spinning: bool
    # cpu: onnxruntime on the host; npu: the GE backend (an NPU or the simulated one).
    placement: str = "cpu"
    # The step graph's ND gears on the NPU (ge_runner.StepGears).
    npu_batch_gears: tuple[int, ...] = ()
    npu_chunk_gears: tuple[int, ...] = ()
    npu_block_gears: tuple[int, ...] = ()
    # New sequences share the held full blocks of their prompt's prefix (vLLM's name).
    enable_prefix_caching: bool = True
    # vLLM's --max-logprobs: the most `logprobs` a request may ask (-1: the vocabulary).
    max_logprobs: int = 20
    # vLLM's --scheduling-policy (SCHEDULING_POLICIES).
    scheduling_policy: str = "fcfs"

    @property
    def blocks_per_sequence(self) -> int:
        return -(-self.max_model_len // self.kv_block_size)


def parse_settings(
    config: model_config_pb2.ModelConfig, model_dir: Path, version: int
) -> EngineSettings:
    """The engine settings of one version; ValueError names the first one that is wrong."""
    raw = dict(DEFAULTS)
    for key, value in config.parameters.items():
        raw[key] = str(value.string_value)
    _refuse_unknown(config)
    for key in SWITCHES:
        if key in raw:
            _flag(raw, key)
    under = str(version)

    def path(key: str) -> Path:
        value = raw[key]
        found = resolve_inside(model_dir, value, f"parameter {key} {value!r}", under=under)
        if not found.is_file():
            raise ValueError(
                f"parameter {key}: file '{value}' not found in version folder {version}"
            )
        return found

    template = path("chat_template") if raw["chat_template"] else None
    settings = EngineSettings(
        step_model=path("step_model"),
        tokenizer=path("tokenizer"),
        chat_template=template,
        eos_token_ids=_token_ids(raw["eos_token_ids"]),
        bos_token=raw["bos_token"],
        eos_token=raw["eos_token"],
        max_model_len=_positive(raw, "max_model_len"),
        kv_cache_blocks=_positive(raw, "kv_cache_blocks"),
        kv_block_size=_positive(raw, "kv_block_size"),
        max_num_seqs=_positive(raw, "max_num_seqs"),
        max_num_batched_tokens=_positive(raw, "max_num_batched_tokens"),
        batching=raw["batching"],
        intra_op_threads=_threads(raw),
        allow_spinning=_flag(raw, "allow_spinning"),
        defaults=SamplingDefaults(
            max_tokens=_positive(raw, "default_max_tokens"),
            temperature=_number(raw, "default_temperature", 0.0, None),
            top_p=_number(raw, "default_top_p", 0.0, 1.0),
            top_k=_integer(raw, "default_top_k", 0),
        ),
        placement=raw["placement"],
        enable_prefix_caching=_flag(raw, "enable_prefix_caching"),
        max_logprobs=_integer(raw, "max_logprobs", -1),
        scheduling_policy=raw["scheduling_policy"],
    )
    settings = _with_gears(settings, raw)
    _check(settings)
    return settings


def _refuse_unknown(config: model_config_pb2.ModelConfig) -> None:
    """A parameter nothing reads is a typo (`max_num_seq`) that would silently leave the
    default in place: refused, as vLLM's engine refuses an unknown argument."""
    unknown = sorted(
        key for key in config.parameters if key not in DEFAULTS and key not in SERVER_KEYS
    )
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown}: the llm backend's parameters are {sorted(DEFAULTS)}"
        )


def _with_gears(settings: EngineSettings, raw: dict[str, str]) -> EngineSettings:
    """The NPU gears: as configured, or powers of two up to what the limits need."""
    if settings.placement != "npu":
        return settings
    batch = _gears(raw, "npu_batch_gears", settings.max_num_seqs)
    chunks = _gears(raw, "npu_chunk_gears", settings.max_num_batched_tokens, start=16)
    blocks = _gears(raw, "npu_block_gears", settings.blocks_per_sequence)
    for key, gears, need, what in (
        ("npu_batch_gears", batch, settings.max_num_seqs, "max_num_seqs"),
        ("npu_chunk_gears", chunks, settings.max_num_batched_tokens, "max_num_batched_tokens"),
        ("npu_block_gears", blocks, settings.blocks_per_sequence, "max_model_len's blocks"),
    ):
        if max(gears) < need:
            raise ValueError(
                f"parameter {key}: the largest gear {max(gears)} is below {what} ({need})"
            )
    return replace(settings, npu_batch_gears=batch, npu_chunk_gears=chunks,
                   npu_block_gears=blocks)  # fmt: skip


def _gears(raw: dict[str, str], key: str, need: int, start: int = 1) -> tuple[int, ...]:
    text = raw[key].strip()
    if text:
        try:
            values = sorted({int(part) for part in text.split(",") if part.strip()})
        except ValueError:
            raise ValueError(f"parameter {key}: {text!r} is not a comma-separated list") from None
        if not values or values[0] < 1:
            raise ValueError(f"parameter {key}: gears are positive integers")
        return tuple(values)
    found = []
    gear = min(start, need)
    while gear < need:
        found.append(gear)
        gear *= 2 if gear < 64 else 4
    return (*found, need)


def _check(settings: EngineSettings) -> None:
    if settings.placement not in PLACEMENTS:
        raise ValueError(
            f"parameter placement: {settings.placement!r} is not one of {', '.join(PLACEMENTS)}"
        )
    if settings.batching not in BATCHING_MODES:
        raise ValueError(
            f"parameter batching: {settings.batching!r} is not one of {', '.join(BATCHING_MODES)}"
        )
    if settings.scheduling_policy not in SCHEDULING_POLICIES:
        raise ValueError(
            f"parameter scheduling_policy: {settings.scheduling_policy!r} is not one of "
            f"{', '.join(SCHEDULING_POLICIES)}"
        )
    if settings.defaults.top_p <= 0:
        raise ValueError("parameter default_top_p must be in (0, 1]")
    if settings.kv_cache_blocks < settings.blocks_per_sequence:
        # One sequence alone must always fit, or preemption could not guarantee progress.
        raise ValueError(
            f"parameter kv_cache_blocks: {settings.kv_cache_blocks} blocks of "
            f"{settings.kv_block_size} tokens cannot hold one sequence of max_model_len "
            f"{settings.max_model_len} tokens (needs {settings.blocks_per_sequence})"
        )
    if settings.max_model_len < 2:
        raise ValueError("parameter max_model_len must be at least 2")


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(
            f"parameter eos_token_ids: {text!r} is not a comma-separated list of token ids"
        ) from None
    if any(i < 0 for i in ids):
        raise ValueError("parameter eos_token_ids: token ids are not negative")
    return ids


def _integer(raw: dict[str, str], key: str, minimum: int) -> int:
    try:
        value = int(raw[key])
    except ValueError:
        raise ValueError(f"parameter {key}: {raw[key]!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"parameter {key}: {value} is below {minimum}")
    return value


def _threads(raw: dict[str, str]) -> int:
    """0: as many as the host has cores; else bounded as on every onnxruntime backend."""
    count = _integer(raw, "intra_op_thread_count", 0)
    return within_thread_bound(count) if count else 0


def _flag(raw: dict[str, str], key: str) -> bool:
    try:
        return parse_bool(raw[key])
    except ValueError:
        raise ValueError(f"parameter {key}: {raw[key]!r} is not true or false") from None


def _positive(raw: dict[str, str], key: str) -> int:
    return _integer(raw, key, 1)


def _number(raw: dict[str, str], key: str, low: float, high: float | None) -> float:
    try:
        value = float(raw[key])
    except ValueError:
        raise ValueError(f"parameter {key}: {raw[key]!r} is not a number") from None
    if value != value or value < low or (high is not None and value > high):
        limit = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"parameter {key}: {value} is outside {limit}")
    return value
