"""The core's records as grpc_service.proto messages.

Every sub-message of a statistics record is set, even when its counts are zero, so a
client can tell "nothing happened" from "not reported" (`HasField` is true), as it can
from the HTTP document, which always carries every key.
"""

from __future__ import annotations

from collections.abc import Iterable

from ge_serve.protos import grpc_service_pb2 as pb
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


def server_metadata(meta: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=meta.extensions
    )


def model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=[str(v) for v in meta.versions],
        platform=meta.platform,
        inputs=[_tensor(t) for t in meta.inputs],
        outputs=[_tensor(t) for t in meta.outputs],
    )


def _tensor(tensor: TensorMetadata) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype.value, shape=tensor.shape
    )


# --- statistics -------------------------------------------------------------------------


def statistics(stats: Iterable[ModelStatistics]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[_model_statistics(s) for s in stats])


def _model_statistics(stats: ModelStatistics) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=stats.name,
        version=str(stats.version),
        last_inference=stats.last_inference,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=_infer_statistics(stats.inference_stats),
        batch_stats=[_batch_statistics(b) for b in stats.batch_stats],
        memory_usage=[_memory_usage(m) for m in stats.memory_usage],
    )


def _infer_statistics(stats: InferStatistics) -> pb.InferStatistics:
    return pb.InferStatistics(
        success=_duration(stats.success),
        fail=_duration(stats.fail),
        queue=_duration(stats.queue),
        compute_input=_duration(stats.compute_input),
        compute_infer=_duration(stats.compute_infer),
        compute_output=_duration(stats.compute_output),
        cache_hit=_duration(stats.cache_hit),
        cache_miss=_duration(stats.cache_miss),
    )


def _batch_statistics(batch: BatchStatistics) -> pb.InferBatchStatistics:
    return pb.InferBatchStatistics(
        batch_size=batch.batch_size,
        compute_input=_duration(batch.compute_input),
        compute_infer=_duration(batch.compute_infer),
        compute_output=_duration(batch.compute_output),
    )


def _memory_usage(usage: MemoryUsage) -> pb.MemoryUsage:
    return pb.MemoryUsage(type=usage.type, id=usage.id, byte_size=usage.byte_size)


def _duration(duration: StatisticDuration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)


# --- repository -------------------------------------------------------------------------


def repository_index(entries: Iterable[RepositoryEntry]) -> pb.RepositoryIndexResponse:
    """What a row does not have is left unset (the empty string)."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=entry.name,
                version="" if entry.version is None else str(entry.version),
                state="" if entry.state is None else entry.state.value,
                reason=entry.reason,
            )
            for entry in entries
        ]
    )
