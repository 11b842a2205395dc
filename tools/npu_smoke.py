#!/usr/bin/env python3
"""Smoke-test ge-serve's pyACL path on a machine with an Ascend NPU and CANN.

Runs the flow the test suite runs against the fake pyACL, against the real `acl` module
and the real `atc`: open the device, compile small ONNX models with atc (batch gears, ND
gears, image-size gears, a shape range), load each on a stream, execute at every gear and
inside the range, compare with onnxruntime on the host, check that a shape outside the
gears or the range is refused, and release everything. Prints one line per check and a
summary; exits 0 when everything passed, 1 when a check failed, 2 when it cannot run
here (no `import acl`, no atc, or no NPU), saying why.

    source /usr/local/Ascend/ascend-toolkit/set_env.sh
    PYTHONPATH=$(tools/pyroot.sh):tests python3 tools/npu_smoke.py [--device 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=int, default=0, help="NPU id")
    parser.add_argument("--keep", type=Path, help="keep the models and OMs here")
    args = parser.parse_args()
    try:
        acl = importlib.import_module("acl")
    except ImportError as exc:
        print(f"SKIP: pyACL cannot be imported ({exc}); source CANN's set_env.sh on an NPU host")
        return 2
    if shutil.which("atc") is None:
        print("SKIP: atc is not on PATH (it comes with the CANN toolkit)")
        return 2
    import numpy as np
    import onnxruntime as ort
    from dynamic_models import det_folder, encoder_folder, rec_folder
    from ge_helpers import EXAMPLES, SIMPLE_IO, make_model, spec_for

    from ge_serve.backends.base import ShapeRejected
    from ge_serve.backends.ge.acl_real import AclReal
    from ge_serve.backends.ge.backend import GeBackend
    from ge_serve.backends.ge.compile import AtcCompiler

    work = args.keep or Path(tempfile.mkdtemp(prefix="npu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    runtime = AclReal(acl, AtcCompiler(work / "om"))
    if runtime.device_count() <= args.device:
        print(f"SKIP: pyACL reports {runtime.device_count()} NPU(s); NPU {args.device} is absent")
        runtime.shutdown()
        return 2
    print(f"pyACL: {runtime.describe()}")
    backend = GeBackend(runtime, {"device_ids": str(args.device)})
    repo = work / "repo"
    results: list[tuple[str, bool, str]] = []

    def check(name: str, body: Callable[[], None]) -> None:
        try:
            body()
            results.append((name, True, ""))
            print(f"PASS  {name}")
        except Exception as exc:
            results.append((name, False, f"{type(exc).__name__}: {exc}"))
            print(f"FAIL  {name}: {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=3)

    def same(folder: Path, feeds: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
        session = ort.InferenceSession(str(folder / "1" / "model.onnx"))
        names = [o.name for o in session.get_outputs()]
        for name, want in zip(names, session.run(names, feeds), strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-2, atol=1e-3)  # fp16 on NPU

    def refused(executor: object, feeds: dict[str, np.ndarray]) -> None:
        try:
            executor.execute(feeds)  # type: ignore[attr-defined]
        except ShapeRejected:
            return
        raise AssertionError("a shape outside the model's gears or range was accepted")

    def batch_gears() -> None:
        folder = make_model(repo, "simple", "max_batch_size: 8\n" + SIMPLE_IO,
                            EXAMPLES / "simple" / "1" / "model.onnx")  # fmt: skip
        loaded = backend.load(spec_for(folder))
        try:
            for batch in loaded.gears:
                rng = np.random.default_rng(batch)
                feeds = {n: rng.integers(-9, 9, (batch, 16), dtype=np.int32)
                         for n in ("INPUT0", "INPUT1")}  # fmt: skip
                same(folder, feeds, loaded.executors[0].execute(feeds))
        finally:
            loaded.close()

    def nd_gears() -> None:
        folder = encoder_folder(repo)
        loaded = backend.load(spec_for(folder))
        try:
            assert loaded.shape_buckets, "the OM reports no ND gears"
            for bucket in loaded.shape_buckets:
                shape = bucket.shapes["INPUT_IDS"]
                feeds = {"INPUT_IDS": np.ones(shape, np.int64),
                         "ATTENTION_MASK": np.ones(shape, np.int64)}  # fmt: skip
                same(folder, feeds, loaded.executors[0].execute(feeds))
            refused(loaded.executors[0], {"INPUT_IDS": np.ones((2, 5), np.int64),
                                          "ATTENTION_MASK": np.ones((2, 5), np.int64)})  # fmt: skip
        finally:
            loaded.close()

    def image_sizes() -> None:
        folder = det_folder(repo)
        loaded = backend.load(spec_for(folder))
        try:
            for bucket in loaded.shape_buckets:
                image = np.random.default_rng(0).random(bucket.shapes["X"], np.float32)
                same(folder, {"X": image}, loaded.executors[0].execute({"X": image}))
            refused(loaded.executors[0], {"X": np.zeros((1, 3, 50, 50), np.float32)})
        finally:
            loaded.close()

    def shape_range() -> None:
        folder = rec_folder(repo)
        loaded = backend.load(spec_for(folder))
        try:
            for batch, width in ((1, 32), (3, 100), (4, 320)):
                image = np.random.default_rng(width).random((batch, 3, 32, width), np.float32)
                same(folder, {"X": image}, loaded.executors[0].execute({"X": image}))
            refused(loaded.executors[0], {"X": np.zeros((1, 3, 32, 400), np.float32)})
        finally:
            loaded.close()

    check("batch gears (atc --dynamic_batch_size, set_dynamic_batch_size)", batch_gears)
    check("ND gears (atc --dynamic_dims --input_format=ND, set_input_dynamic_dims)", nd_gears)
    check("image-size gears (atc --dynamic_image_size, set_dynamic_hw_size)", image_sizes)
    check("shape range (atc --input_shape 1~4, tensor descs, output descs)", shape_range)
    check("release (acl.finalize)", runtime.shutdown)
    passed = sum(1 for _, ok, _ in results if ok)
    print(f"\n{passed} of {len(results)} checks passed (models and OMs in {work})")
    for name, ok, why in results:
        if not ok:
            print(f"  failed: {name}: {why}")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
