"""protos/ must stay wire-compatible with Triton's protobufs (as in tritonclient 2.73.0).

Our .proto files are registered under Triton's own file names with descriptors equal to
tritonclient's, so ge_serve.protos and tritonclient.grpc can be imported into one process.
To keep each check independent of that property, tritonclient's side of the wire checks runs
in a child interpreter that never imports ge_serve.protos.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.message import Message

from ge_serve.protos import grpc_service_pb2, model_config_pb2

REPO = Path(__file__).resolve().parents[2]
PROTOS = REPO / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def build_samples(svc: Any, mc: Any) -> dict[str, Message]:
    """Sample messages, built identically from either pair of generated modules.

    This function also runs in the child interpreter, so it must be self-contained.
    """
    import struct

    req = svc.ModelInferRequest(model_name="simple", model_version="1", id="req-7")
    req.parameters["sequence_id"].int64_param = 42
    req.parameters["sequence_start"].bool_param = True
    req.parameters["tag"].string_param = "abc"
    req.parameters["scale"].double_param = 0.25
    req.parameters["big"].uint64_param = 2**63 + 5
    in0 = req.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 3])
    in0.parameters["binary_data_size"].int64_param = 24
    req.inputs.add(name="INPUT1", datatype="BYTES", shape=[1])
    out0 = req.outputs.add(name="OUTPUT0")
    out0.parameters["classification"].int64_param = 2
    req.outputs.add(name="OUTPUT1")
    req.raw_input_contents.append(struct.pack("<6f", 0.0, 1.5, -2.0, 3.25, 4.0, 5.5))
    req.raw_input_contents.append(struct.pack("<I", 5) + b"hello")

    resp = svc.ModelInferResponse(model_name="simple", model_version="1", id="req-7")
    resp.parameters["triton_final_response"].bool_param = True
    o = resp.outputs.add(name="OUTPUT0", datatype="INT32", shape=[3])
    o.contents.int_contents.extend([-1, 0, 7])
    o.parameters["binary_data_size"].int64_param = 12
    resp.raw_output_contents.append(struct.pack("<3i", -1, 0, 7))
    stream = svc.ModelStreamInferResponse(error_message="", infer_response=resp)
    stream_err = svc.ModelStreamInferResponse(error_message="Exceeds maximum queue size")

    cfg = mc.ModelConfig(name="simple", platform="onnxruntime_onnx", backend="onnxruntime")
    cfg.max_batch_size = 8
    cfg.version_policy.specific.versions.extend([1, 3])
    cfg.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1, 16], optional=True)
    cfg.input[0].reshape.shape.extend([16])
    cfg.output.add(name="OUTPUT0", data_type=mc.TYPE_BF16, dims=[4], label_filename="labels.txt")
    db = cfg.dynamic_batching
    db.preferred_batch_size.extend([4, 8])
    db.max_queue_delay_microseconds = 100
    db.preserve_ordering = True
    db.priority_levels = 2
    db.default_priority_level = 1
    db.default_queue_policy.max_queue_size = 16
    db.priority_queue_policy[1].timeout_action = mc.ModelQueuePolicy.DELAY
    db.priority_queue_policy[1].default_timeout_microseconds = 5000
    grp = cfg.instance_group.add(name="g0", kind=mc.ModelInstanceGroup.KIND_GPU, count=2)
    grp.gpus.extend([0, 1])
    grp.rate_limiter.resources.add(name="R1", count=4)
    grp.secondary_devices.add(device_id=1)
    cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1, passive=True)
    cfg.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env"
    cfg.cc_model_filenames["7.5"] = "model_75.plan"
    cfg.metric_tags["team"] = "ge"
    warm = cfg.model_warmup.add(name="w", batch_size=2, count=3)
    warm.inputs["INPUT0"].data_type = mc.TYPE_FP32
    warm.inputs["INPUT0"].dims.extend([16])
    warm.inputs["INPUT0"].random_data = True
    cfg.optimization.cuda.graphs = True
    spec = cfg.optimization.cuda.graph_spec.add(batch_size=4)
    spec.input["INPUT0"].dim.extend([4, 16])
    spec.graph_lower_bound.input["INPUT0"].dim.extend([1, 16])
    accel = cfg.optimization.execution_accelerators.cpu_execution_accelerator.add(name="openvino")
    accel.parameters["precision"] = "FP16"
    cfg.optimization.input_pinned_memory.enable = True
    cfg.model_transaction_policy.decoupled = True
    cfg.response_cache.enable = True
    cfg.model_repository_agents.agents.add(name="checksum").parameters["MD5:x"] = "abc"

    seq = mc.ModelConfig(name="stateful", backend="python", max_batch_size=4)
    sb = seq.sequence_batching
    sb.max_sequence_idle_microseconds = 1_000_000
    sb.oldest.max_candidate_sequences = 4
    sb.oldest.preferred_batch_size.append(2)
    ctl = sb.control_input.add(name="START")
    ctl.control.add(kind=mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START)
    ctl.control[0].int32_false_true.extend([0, 1])
    st = sb.state.add(input_name="IN_STATE", output_name="OUT_STATE", data_type=mc.TYPE_INT32)
    st.dims.append(1)
    st.initial_state.add(name="init", data_type=mc.TYPE_INT32, dims=[1], zero_data=True)

    ens = mc.ModelConfig(name="pipeline", platform="ensemble", max_batch_size=1)
    step = ens.ensemble_scheduling.step.add(model_name="simple", model_version=-1)
    step.input_map["INPUT0"] = "RAW"
    step.output_map["OUTPUT0"] = "SCORES"

    stats = svc.ModelStatisticsResponse()
    ms = stats.model_stats.add(name="simple", version="1", last_inference=1700000000000)
    ms.inference_count = 10
    ms.execution_count = 4
    ms.inference_stats.success.count = 10
    ms.inference_stats.success.ns = 123456
    ms.inference_stats.queue.ns = 42
    ms.inference_stats.cache_miss.count = 1
    ms.batch_stats.add(batch_size=4).compute_infer.ns = 999
    ms.memory_usage.add(type="GPU", id=0, byte_size=1 << 20)
    ms.response_stats["0"].success.count = 3
    ms.response_stats["0"].empty_response.count = 1

    index = svc.RepositoryIndexResponse()
    index.models.add(name="simple", version="1", state="READY")
    index.models.add(name="broken", version="2", state="UNAVAILABLE", reason="failed to load")

    load = svc.RepositoryModelLoadRequest(model_name="simple")
    load.parameters["config"].string_param = '{"max_batch_size": 4}'
    load.parameters["file:1/model.onnx"].bytes_param = b"\x00\x01onnx"

    shm = svc.SystemSharedMemoryStatusResponse()
    region = shm.regions["r0"]
    region.name, region.key, region.offset, region.byte_size = "r0", "/shm0", 0, 64

    logs = svc.LogSettingsRequest()
    logs.settings["log_verbose_level"].uint32_param = 1
    logs.settings["log_info"].bool_param = True
    logs.settings["log_format"].string_param = "ISO8601"

    trace = svc.TraceSettingRequest(model_name="simple")
    trace.settings["trace_level"].value.extend(["TIMESTAMPS", "TENSORS"])

    meta = svc.ModelMetadataResponse(name="simple", versions=["1"], platform="onnxruntime_onnx")
    meta.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 16])

    return {
        "ModelInferRequest": req,
        "ModelStreamInferResponse": stream,
        "ModelStreamInferResponse(error)": stream_err,
        "ModelConfig(dynamic_batching)": cfg,
        "ModelConfig(sequence_batching)": seq,
        "ModelConfig(ensemble)": ens,
        "ModelConfigResponse": svc.ModelConfigResponse(config=cfg),
        "ModelStatisticsResponse": stats,
        "RepositoryIndexResponse": index,
        "RepositoryModelLoadRequest": load,
        "SystemSharedMemoryStatusResponse": shm,
        "LogSettingsRequest": logs,
        "TraceSettingRequest": trace,
        "ModelMetadataResponse": meta,
    }


def _tritonclient_child() -> None:
    """Runs in the child: build/parse with tritonclient's classes; report as JSON."""
    import json
    import sys

    from google.protobuf import descriptor_pb2, text_format
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.grpc import service_pb2 as svc

    ours = json.load(sys.stdin)
    built = build_samples(svc, mc)
    result: dict[str, dict[str, Any]] = {"built": {}, "parsed": {}, "files": {}}
    for key, msg in built.items():
        result["built"][key] = {
            "type": msg.DESCRIPTOR.full_name,
            "wire": msg.SerializeToString(deterministic=True).hex(),
            "text": text_format.MessageToString(msg),
        }
    for key, item in ours.items():
        module = mc if item["type"] == "inference.ModelConfig" else svc
        msg = getattr(module, item["type"].rsplit(".", 1)[1])()
        msg.ParseFromString(bytes.fromhex(item["wire"]))
        result["parsed"][key] = text_format.MessageToString(msg)
    for module in (mc, svc):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        result["files"][proto.name] = proto.SerializeToString().hex()
    json.dump(result, sys.stdout)


def _run_python(source: str, stdin: str = "") -> str:
    proc = subprocess.run(
        [sys.executable, "-c", source],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def ours_samples() -> dict[str, Message]:
    return build_samples(grpc_service_pb2, model_config_pb2)


@pytest.fixture(scope="module")
def triton(ours_samples: dict[str, Message]) -> dict[str, Any]:
    """tritonclient's samples, its parse of ours, and its file descriptors."""
    source = "\n".join(
        [
            "from __future__ import annotations",
            inspect.getsource(build_samples),
            inspect.getsource(_tritonclient_child),
            "_tritonclient_child()",
        ]
    )
    ours = {
        key: {
            "type": msg.DESCRIPTOR.full_name,
            "wire": msg.SerializeToString(deterministic=True).hex(),
        }
        for key, msg in ours_samples.items()
    }
    result: dict[str, Any] = json.loads(_run_python(source, json.dumps(ours)))
    return result


def _our_file(name: str) -> descriptor_pb2.FileDescriptorProto:
    module = {"model_config.proto": model_config_pb2, "grpc_service.proto": grpc_service_pb2}
    proto = descriptor_pb2.FileDescriptorProto()
    module[name].DESCRIPTOR.CopyToProto(proto)
    return proto


def _their_file(triton: dict[str, Any], name: str) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(bytes.fromhex(triton["files"][name]))


def _flatten(
    file: descriptor_pb2.FileDescriptorProto,
) -> tuple[dict[str, set[tuple[Any, ...]]], dict[str, set[tuple[str, int]]]]:
    """Every message (nested and map entries included) -> its fields; every enum -> values."""
    messages: dict[str, set[tuple[Any, ...]]] = {}
    enums: dict[str, set[tuple[str, int]]] = {}

    def add_enums(prefix: str, items: Any) -> None:
        for enum in items:
            enums[f"{prefix}.{enum.name}"] = {(v.name, v.number) for v in enum.value}

    def walk(prefix: str, msg: descriptor_pb2.DescriptorProto) -> None:
        full = f"{prefix}.{msg.name}"
        oneofs = [o.name for o in msg.oneof_decl]
        messages[full] = {
            (
                f.name,
                f.number,
                f.type,
                f.label,
                f.type_name,
                oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
            )
            for f in msg.field
        }
        if msg.options.map_entry:
            messages[full].add(("<map_entry>", 0, 0, 0, "", None))
        add_enums(full, msg.enum_type)
        for nested in msg.nested_type:
            walk(full, nested)

    add_enums(file.package, file.enum_type)
    for msg in file.message_type:
        walk(file.package, msg)
    return messages, enums


@pytest.mark.parametrize("name", ["model_config.proto", "grpc_service.proto"])
def test_messages_and_fields_match_tritonclient(triton: dict[str, Any], name: str) -> None:
    ours, our_enums = _flatten(_our_file(name))
    theirs, their_enums = _flatten(_their_file(triton, name))
    assert sorted(ours) == sorted(theirs), "message sets differ"
    for full in theirs:
        assert ours[full] == theirs[full], (
            f"{full}: only ours {sorted(ours[full] - theirs[full])}, "
            f"only Triton's {sorted(theirs[full] - ours[full])}"
        )
    assert our_enums == their_enums


@pytest.mark.parametrize("name", ["model_config.proto", "grpc_service.proto"])
def test_file_descriptor_identical_to_tritonclient(triton: dict[str, Any], name: str) -> None:
    # Equal serialized descriptors under the same file name are what lets the protobuf
    # runtime accept both ge_serve.protos and tritonclient.grpc in one process.
    ours, theirs = _our_file(name), _their_file(triton, name)
    assert ours.name == theirs.name == name
    assert list(ours.dependency) == list(theirs.dependency)
    assert text_format.MessageToString(ours) == text_format.MessageToString(theirs)
    assert ours.SerializeToString() == theirs.SerializeToString()


def test_every_tritonclient_rpc_exists(triton: dict[str, Any]) -> None:
    (theirs,) = _their_file(triton, "grpc_service.proto").service
    (ours,) = _our_file("grpc_service.proto").service
    assert ours.name == theirs.name == "GRPCInferenceService"
    our_methods = {m.name: m for m in ours.method}
    for method in theirs.method:
        assert method.name in our_methods, f"missing RPC {method.name}"
        mine = our_methods[method.name]
        assert (mine.input_type, mine.output_type) == (method.input_type, method.output_type)
        assert (mine.client_streaming, mine.server_streaming) == (
            method.client_streaming,
            method.server_streaming,
        )


def test_tritonclient_bytes_parse_with_ours(
    triton: dict[str, Any], ours_samples: dict[str, Message]
) -> None:
    assert sorted(triton["built"]) == sorted(ours_samples)
    for key, item in triton["built"].items():
        module = model_config_pb2 if item["type"] == "inference.ModelConfig" else grpc_service_pb2
        msg = getattr(module, item["type"].rsplit(".", 1)[1])()
        msg.ParseFromString(bytes.fromhex(item["wire"]))
        assert text_format.MessageToString(msg) == item["text"], key
        assert msg.SerializeToString(deterministic=True).hex() == item["wire"], key


def test_our_bytes_parse_with_tritonclient(
    triton: dict[str, Any], ours_samples: dict[str, Message]
) -> None:
    for key, msg in ours_samples.items():
        text = text_format.MessageToString(msg)
        assert text, key
        assert triton["parsed"][key] == text, key
        assert triton["built"][key]["text"] == text, key


def test_tritonclient_and_ours_share_one_process() -> None:
    # Either import order must work; the runtime then hands out the same classes.
    both = (
        "import tritonclient.grpc as tc\n"
        "from ge_serve.protos import grpc_service_pb2 as g, model_config_pb2 as m\n"
    )
    check = (
        "assert g.ModelInferRequest is tc.service_pb2.ModelInferRequest\n"
        "assert m.ModelConfig is tc.model_config_pb2.ModelConfig\n"
    )
    lines = both.splitlines(keepends=True)
    _run_python(both + check)
    _run_python(lines[1] + lines[0] + check)


def test_health_proto_matches_grpc_health() -> None:
    from grpc_health.v1 import health_pb2 as reference

    # Ours cannot share a process with grpc_health (same symbols, other file name).
    source = (
        "from google.protobuf import descriptor_pb2\n"
        "from ge_serve.protos import health_pb2, health_pb2_grpc\n"
        "assert hasattr(health_pb2_grpc, 'HealthServicer')\n"
        "p = descriptor_pb2.FileDescriptorProto()\n"
        "health_pb2.DESCRIPTOR.CopyToProto(p)\n"
        "print(p.SerializeToString().hex())\n"
    )
    ours = descriptor_pb2.FileDescriptorProto.FromString(bytes.fromhex(_run_python(source)))
    theirs = descriptor_pb2.FileDescriptorProto()
    reference.DESCRIPTOR.CopyToProto(theirs)
    assert ours.name == "health.proto"
    assert ours.package == theirs.package == "grpc.health.v1"
    assert list(ours.message_type) == list(theirs.message_type)
    assert list(ours.service) == list(theirs.service)


def test_generated_files_are_fresh(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(PROTOS / "generate.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    fresh = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in PROTOS.iterdir() if p.name.endswith(GENERATED_SUFFIXES))
    assert fresh == committed, "run protos/generate.sh"
    assert len(fresh) == 9
    for name in fresh:
        assert (tmp_path / name).read_bytes() == (PROTOS / name).read_bytes(), (
            f"protos/{name} is stale: run protos/generate.sh"
        )
