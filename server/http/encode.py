"""The core's records as the KServe v2 HTTP protocol prints them.

Each function returns the JSON document as plain dicts and lists, keys in the order
Triton prints them; `codec.encode_json` serializes it. Every integer is a JSON number,
even the 64-bit ones that protobuf's JSON mapping would print as strings, and the model
config carries every field, set or not, as Triton's `/config` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The config as Triton prints it (proto field names, every field, ints as numbers): one
# function for every reader, since a Python model gets the same JSON in `initialize`.
from ge_serve.backends.config_json import config_to_json as config_to_json
from ge_serve.server.inference.reports import (
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
    """Triton's rows (TRITONSERVER_ServerModelIndex): a model never loaded is its name
    alone; others have a state, a version unless the row is for no one version (a model
    in several repositories), and a reason only when there is one."""
    rows = []
    for entry in entries:
        row = {"name": entry.name}
        if entry.version is not None:
            row["version"] = str(entry.version)
        if entry.state is not None:
            row["state"] = entry.state.value
        if entry.reason:
            row["reason"] = entry.reason
        rows.append(row)
    return rows
