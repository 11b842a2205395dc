"""The core's records as the KServe v2 HTTP protocol prints them.

Each function returns the JSON document as plain dicts and lists, keys in the order
Triton prints them; `codec.encode_json` serializes it. Every integer is a JSON number,
even the 64-bit ones that protobuf's JSON mapping would print as strings, and the model
config carries every field, set or not, as Triton's `/config` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ge_serve.protos import model_config_pb2
from ge_serve.server.records import (
    BatchStatistics,
    InferStatistics,
    MemoryUsage,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
    StatisticDuration,
    TensorMetadata,
)

# --- metadata ---------------------------------------------------------------------------


def server_metadata(meta: ServerMetadata) -> dict[str, Any]:
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": [str(v) for v in meta.versions],
        "platform": meta.platform,
        "inputs": [_tensor(t) for t in meta.inputs],
        "outputs": [_tensor(t) for t in meta.outputs],
    }


def _tensor(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype.value, "shape": list(tensor.shape)}


# --- statistics -------------------------------------------------------------------------


def statistics(stats: Iterable[ModelStatistics]) -> dict[str, Any]:
    """`{"model_stats": [...]}`, with grpc_service.proto's field names."""
    return {"model_stats": [_model_statistics(s) for s in stats]}


def _model_statistics(stats: ModelStatistics) -> dict[str, Any]:
    return {
        "name": stats.name,
        "version": str(stats.version),
        "last_inference": stats.last_inference,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": _infer_statistics(stats.inference_stats),
        "response_stats": {},
        "batch_stats": [_batch_statistics(b) for b in stats.batch_stats],
        "memory_usage": [_memory_usage(m) for m in stats.memory_usage],
    }


def _infer_statistics(stats: InferStatistics) -> dict[str, Any]:
    return {
        "success": _duration(stats.success),
        "fail": _duration(stats.fail),
        "queue": _duration(stats.queue),
        "compute_input": _duration(stats.compute_input),
        "compute_infer": _duration(stats.compute_infer),
        "compute_output": _duration(stats.compute_output),
        "cache_hit": _duration(stats.cache_hit),
        "cache_miss": _duration(stats.cache_miss),
    }


def _batch_statistics(batch: BatchStatistics) -> dict[str, Any]:
    return {
        "batch_size": batch.batch_size,
        "compute_input": _duration(batch.compute_input),
        "compute_infer": _duration(batch.compute_infer),
        "compute_output": _duration(batch.compute_output),
    }


def _memory_usage(usage: MemoryUsage) -> dict[str, Any]:
    return {"type": usage.type, "id": usage.id, "byte_size": usage.byte_size}


def _duration(duration: StatisticDuration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


# --- repository -------------------------------------------------------------------------


def repository_index(entries: Iterable[RepositoryEntry]) -> list[dict[str, str]]:
    """Every row has all four keys; what a row does not have is an empty string."""
    return [
        {
            "name": entry.name,
            "version": "" if entry.version is None else str(entry.version),
            "state": "" if entry.state is None else entry.state.value,
            "reason": entry.reason,
        }
        for entry in entries
    ]


# --- model config -----------------------------------------------------------------------


def config_to_json(config: model_config_pb2.ModelConfig) -> dict[str, Any]:
    """The config as Triton prints it: proto field names, every field, ints as numbers."""
    data: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        including_default_value_fields=True,
    )
    _ints_as_numbers(config, data)
    return data


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _ints_as_numbers(message: Message, data: dict[str, Any]) -> None:
    """json_format prints 64-bit integers as strings; Triton prints them as numbers."""
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = getattr(message, field.name)
        if field.type in _INT64_TYPES:
            if field.label == FieldDescriptor.LABEL_REPEATED:
                data[field.name] = [int(v) for v in value]
            else:
                data[field.name] = int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    for key, sub in value.items():
                        _ints_as_numbers(sub, data[field.name][str(key)])
                elif value_field.type in _INT64_TYPES:
                    data[field.name] = {k: int(v) for k, v in data[field.name].items()}
            elif field.label == FieldDescriptor.LABEL_REPEATED:
                for sub, sub_data in zip(value, data[field.name], strict=True):
                    _ints_as_numbers(sub, sub_data)
            else:
                _ints_as_numbers(value, data[field.name])
