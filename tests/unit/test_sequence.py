"""The sequence batcher through its public submit() only, gated by a fake stateful model."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from seqharness import GATE_S, STATE, Accumulator, batcher, config, req, send, turns, value

from ge_serve.backends.base import LoadedModel
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler import sequence_config
from ge_serve.scheduler.correlation import SequenceFlags, sequence_flags
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, FailureReason, ServerError

pytestmark = pytest.mark.timeout(30)


async def test_direct_keeps_each_sequence_on_its_row_with_controls_and_state() -> None:
    model = Accumulator(blocked=True)
    b = batcher(config(), model)
    try:
        a1 = send(b, req(1, 10, start=True))
        assert await model.started() == 1  # sequence 10 alone, on row 0
        b1 = send(b, req(100, 20, start=True))
        a2 = send(b, req(2, 10))
        await turns()
        model.allow()
        assert await value(a1) == 1
        assert await model.started() == 2  # both rows ready: one batch of two
        model.allow()
        assert (await value(a2), await value(b1)) == (3, 100)
        b2 = send(b, req(5, 20, end=True))
        assert await model.started() == 2  # only row 1 is ready: row 0 is a null request
        model.allow()
        assert await value(b2) == 105
        a3 = send(b, req(4, 10, end=True))
        model.open()
        assert await value(a3) == 7
    finally:
        model.open()
        await b.close(5.0)
    first, second, third, fourth = model.batches
    assert first == {"INPUT": [1], "START": [1], "END": [0.0], "READY": [True],
                     "CORRID": [10], "STATE_IN": [0]}  # fmt: skip
    assert second["INPUT"] == [2, 100] and second["START"] == [0, 1]
    assert second["CORRID"] == [10, 20] and second["STATE_IN"] == [1, 0]
    assert third["READY"] == [False, True] and third["END"] == [0.0, 1.0]
    assert third["CORRID"] == [0, 20] and third["STATE_IN"][1] == 100
    assert fourth == {"INPUT": [4], "START": [0], "END": [1.0], "READY": [True],
                      "CORRID": [10], "STATE_IN": [3]}  # fmt: skip


async def test_oldest_batches_the_oldest_heads_one_request_per_sequence() -> None:
    model = Accumulator(blocked=True)
    cfg = config("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }", mbs=4)
    b = batcher(cfg, model)
    try:
        blocker = send(b, req(0, 1, start=True))
        assert await model.started() == 1
        queued = [
            send(b, req(1, 2, start=True)),
            send(b, req(2, 2)),
            send(b, req(10, 3, start=True)),
            send(b, req(20, 4, start=True)),
        ]
        await turns()
        model.open()
        assert await value(blocker) == 0
        assert [await value(f) for f in queued] == [1, 3, 10, 20]
    finally:
        model.open()
        await b.close(5.0)
    # The preferred size, oldest heads first; sequence 2's second request waits its turn.
    assert [batch["CORRID"] for batch in model.batches[1:]] == [[2, 3], [2, 4]]
    assert model.batches[2]["STATE_IN"] == [1, 0]


async def test_a_full_instance_puts_new_sequences_in_the_backlog_until_a_slot_frees() -> None:
    model = Accumulator(blocked=True)
    b = batcher(config(mbs=1), model)
    try:
        a1 = send(b, req(1, 7, start=True))
        assert await model.started() == 1
        waiting = [send(b, req(5, 8, start=True)), send(b, req(6, 8, end=True))]
        a2 = send(b, req(2, 7, end=True))
        await turns()
        model.open()
        assert (await value(a1), await value(a2)) == (1, 3)
        assert [await value(f) for f in waiting] == [5, 11]
    finally:
        model.open()
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[7], [7], [8], [8]]


async def test_a_backlogged_sequence_times_out_with_its_requests_timeout() -> None:
    model = Accumulator(blocked=True)
    b = batcher(config(mbs=1), model)
    try:
        running = send(b, req(1, 7, start=True))
        assert await model.started() == 1
        late = req(5, 8, start=True)
        late.timeout_us = 20_000
        waiting = send(b, late)
        with pytest.raises(ServerError) as info:
            await asyncio.wait_for(waiting, 10)
        assert info.value.code is ErrorCode.UNAVAILABLE
        assert info.value.message == "timeout of the corresponding sequence has been expired"
        assert info.value.reason is FailureReason.REJECTED  # counted as Triton counts it
        model.open()
        assert await value(running) == 1
        assert len(model.batches) == 1  # sequence 8 never ran
    finally:
        model.open()
        await b.close(5.0)


async def test_an_idle_sequence_loses_its_slot_and_must_start_again() -> None:
    model = Accumulator()
    b = batcher(config(mbs=1, idle_us=50_000), model)
    try:
        assert await value(send(b, req(1, 5, start=True))) == 1
        backlog = send(b, req(9, 6, start=True))  # the only slot is sequence 5's
        # Within the idle time, sequence 5 keeps its slot; the newcomer waits.
        assert await value(send(b, req(2, 5))) == 3
        assert not backlog.done()
        # Once 5 has been idle for 50 ms, its slot goes to the sequence in the backlog.
        assert await value(backlog) == 9
        with pytest.raises(ServerError) as info:
            await b.submit(req(3, 5))
        assert info.value.code is ErrorCode.INVALID_ARG
        assert info.value.message == (
            "inference request for sequence 5 to model 'acc' must specify the START flag "
            "on the first request of the sequence"
        )
    finally:
        await b.close(5.0)


async def test_string_ids_and_a_model_without_batching() -> None:
    model = Accumulator()
    cfg = config(mbs=0, extra=STATE.replace("dims: [ 1 ]", "dims: [ 1 ]"))
    for control in cfg.sequence_batching.control_input:
        if control.name == "CORRID":
            control.control[0].data_type = model_config_pb2.TYPE_STRING
    cfg.input[0].dims[:] = [1, 1]
    b = batcher(cfg, model)
    try:
        first = await b.submit(req(4, "abc", start=True))
        second = await b.submit(req(6, "abc", end=True))
        assert (first["OUTPUT"].tolist(), second["OUTPUT"].tolist()) == ([[4]], [[10]])
        assert model.batches[0]["CORRID"] == [b"abc"]
        with pytest.raises(
            ServerError, match="data-type is 'UINT64', but model 'acc' expects 'BYTES'"
        ):
            await b.submit(req(1, 9, start=True))
    finally:
        await b.close(5.0)


def corrid_typed(cfg: Any, data_type: int) -> Any:
    for control in cfg.sequence_batching.control_input:
        if control.name == "CORRID":
            control.control[0].data_type = data_type
    return cfg


@pytest.mark.parametrize(
    ("data_type", "sequence_id", "seen"),
    [
        # The low bytes of the uint64 ID, read as the CORRID type, as Triton copies them.
        (model_config_pb2.TYPE_INT32, 2**33 + 5, 5),
        (model_config_pb2.TYPE_INT32, 2**31, -(2**31)),
        (model_config_pb2.TYPE_INT32, 2**64 - 1, -1),
        (model_config_pb2.TYPE_UINT32, 2**64 - 1, 2**32 - 1),
        (model_config_pb2.TYPE_INT64, 2**64 - 1, -1),
        (model_config_pb2.TYPE_UINT64, 2**64 - 1, 2**64 - 1),
        (model_config_pb2.TYPE_STRING, "s" * 128, b"s" * 128),
    ],
)
async def test_an_id_wider_than_the_corrid_type_runs_with_its_low_bytes(
    data_type: int, sequence_id: int | str, seen: int | bytes
) -> None:
    model = Accumulator()
    # One slot: a sequence that kept it would keep the next one waiting.
    b = batcher(corrid_typed(config(mbs=1), data_type), model)
    follower: int | str = "next" if isinstance(sequence_id, str) else 7
    try:
        answer = await asyncio.wait_for(b.submit(req(4, sequence_id, True, True)), GATE_S)
        assert answer["OUTPUT"].tolist() == [[4]]
        answer = await asyncio.wait_for(b.submit(req(6, follower, True, True)), GATE_S)
        assert answer["OUTPUT"].tolist() == [[6]]
    finally:
        await b.close(5.0)
    assert model.batches[0]["CORRID"] == [seen]
    assert len(model.batches) == 2


async def test_a_request_that_cannot_be_launched_fails_alone_and_frees_its_sequence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing = {13, 15}
    real_corrid = sequence_config.ControlTensor.corrid

    def corrid(control: sequence_config.ControlTensor, correlation_id: int | str) -> Any:
        if correlation_id in failing:  # a fault injected where the CORRID tensor is made
            raise RuntimeError(f"no controls for {correlation_id}")
        return real_corrid(control, correlation_id)

    monkeypatch.setattr(sequence_config.ControlTensor, "corrid", corrid)
    model = Accumulator()
    b = batcher(config(mbs=1), model)
    try:
        with pytest.raises(ServerError) as info:
            await asyncio.wait_for(b.submit(req(1, 13, True, True)), GATE_S)
        assert info.value.code is ErrorCode.INTERNAL
        assert info.value.message == (
            "the control and state inputs of sequence 13 for model 'acc' could not be set: "
            "RuntimeError: no controls for 13"
        )
        # The only slot is free again: sequence 13 ended.
        assert await value(send(b, req(2, 14, True, True))) == 2
        # A sequence whose START failed is not left running: its next request runs.
        with pytest.raises(ServerError, match="sequence 15 for model 'acc'"):
            await asyncio.wait_for(b.submit(req(3, 15, start=True)), GATE_S)
        failing.discard(15)
        assert await value(send(b, req(4, 15, end=True))) == 4
    finally:
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[14], [15]]

    # In a batch, the others run, each on its own row; the failed one's row is a null.
    model = Accumulator(blocked=True)
    b = batcher(config(mbs=2), model)
    try:
        first = send(b, req(1, 1, start=True))
        assert await model.started() == 1
        failing.add(1)
        other = send(b, req(5, 2, start=True, end=True))
        doomed = send(b, req(2, 1, end=True))
        await turns()
        model.open()
        assert await value(first) == 1
        assert await value(other) == 5
        with pytest.raises(ServerError, match="sequence 1 for model 'acc'"):
            await asyncio.wait_for(doomed, GATE_S)
    finally:
        model.open()
        await b.close(5.0)
    assert model.batches[1]["READY"] == [False, True] and model.batches[1]["CORRID"] == [0, 2]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            WorkItem(inputs={"INPUT": np.zeros((1, 1), np.int32)}, batch_size=1),
            "inference request to model 'acc' must specify a non-zero or non-empty correlation ID",
        ),
        (
            req(1, 0, start=True),
            "inference request to model 'acc' must specify a non-zero or non-empty correlation ID",
        ),
        (
            WorkItem(
                inputs={"INPUT": np.zeros((2, 1), np.int32)},
                batch_size=2,
                sequence=SequenceFlags(3, True),
            ),
            "inference request to model 'acc' must specify batch-size 1 due to "
            "requirements of sequence batcher",
        ),
        (
            req(1, 42),
            "inference request for sequence 42 to model 'acc' must specify the START flag "
            "on the first request of the sequence",
        ),
        (
            req(1, "s", start=True),
            "sequence batching control 'CORRID' data-type is 'BYTES', but model 'acc' "
            "expects 'UINT64'",
        ),
    ],
)
async def test_requests_the_sequence_batcher_refuses(item: WorkItem, message: str) -> None:
    model = Accumulator()
    b = batcher(config(), model)
    try:
        with pytest.raises(ServerError) as info:
            await b.submit(item)
        assert info.value.code is ErrorCode.INVALID_ARG
        assert info.value.message == message
        assert model.batches == []
    finally:
        await b.close(5.0)


async def test_a_request_after_the_end_of_its_sequence_is_refused() -> None:
    model = Accumulator()
    b = batcher(config(), model)
    try:
        await b.submit(req(1, 3, start=True, end=True))
        with pytest.raises(ServerError, match="must specify the START flag"):
            await b.submit(req(1, 3))
    finally:
        await b.close(5.0)


def test_sequence_parameters_are_read_with_their_types() -> None:
    assert sequence_flags({}) is None
    flags = sequence_flags({"sequence_id": 2**64 - 1, "sequence_start": True})
    assert flags == SequenceFlags(2**64 - 1, True, False)
    assert sequence_flags({"sequence_id": "x", "sequence_end": True}) == SequenceFlags(
        "x", end=True
    )
    for bad, message in (
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": -1}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 1, "sequence_start": 1}, "Unable to parse 'sequence_start'"),
        ({"sequence_id": "x" * 129}, "cannot be longer than 128 characters"),
    ):
        with pytest.raises(ServerError, match=message):
            sequence_flags(bad)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c.sequence_batching.control_input[0].control[0].int32_false_true.append(2),
            "sequence batching control 'int32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_START for acc",
        ),
        (
            lambda c: c.sequence_batching.control_input[3].control[0].__setattr__("data_type", 11),
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for acc",
        ),
        (
            lambda c: c.sequence_batching.__setattr__("iterative_sequence", True),
            "'iterative_sequence' is not supported",
        ),
        (
            lambda c: c.response_cache.__setattr__("enable", True),
            "Response Cache does not currently support model acc with sequence batching",
        ),
        (
            lambda c: c.sequence_batching.oldest.preferred_batch_size.append(9),
            "sequence batching preferred batch size must be <= max batch size for acc",
        ),
        (
            lambda c: c.parameters["bucket_sizes"].__setattr__("string_value", "4"),
            "shape buckets cannot be combined with sequence batching",
        ),
        (
            lambda c: c.sequence_batching.oldest.__setattr__("preserve_ordering", True),
            "'oldest.preserve_ordering' is not supported",
        ),
        (
            lambda c: c.model_transaction_policy.__setattr__("decoupled", True),
            "implicit state needs the model's one response per request",
        ),
        (
            lambda c: c.input.add(name="START", data_type=model_config_pb2.TYPE_INT32, dims=[1]),
            "control input 'START' is also a request input",
        ),
        (
            lambda c: c.sequence_batching.state[0].initial_state.add(
                data_type=model_config_pb2.TYPE_INT32, dims=[1], name="i", data_file="f"
            ),
            "initial_state 'data_file' of state 'STATE_IN' is not supported",
        ),
    ],
)
def test_sequence_blocks_that_cannot_be_honoured_fail_the_load(edit: Any, message: str) -> None:
    cfg = config()
    edit(cfg)
    if cfg.sequence_batching.HasField("oldest"):
        cfg.sequence_batching.oldest.max_candidate_sequences = 2
    with pytest.raises(ServerError) as info:
        build_scheduler(cfg, LoadedModel(executors=[]), SchedulerOptions())
    assert info.value.code is ErrorCode.INVALID_ARG
    assert message in info.value.message


@pytest.mark.parametrize(("mbs", "slots"), [(4, 4), (0, 1)])
def test_oldest_without_max_candidate_sequences_takes_max_batch_size_slots(
    mbs: int, slots: int
) -> None:
    # Triton's sequence batcher: max(1, max_batch_size) candidate sequences per instance
    # when the config names no positive count (sequence_batch_scheduler.cc).
    policy = sequence_config.SequencePolicy.from_config(config("oldest { }", mbs=mbs))
    assert policy.slots_per_instance == slots
