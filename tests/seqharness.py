"""The sequence batcher's test harness: a fake stateful model the test gates, and
requests sent through the batcher's public submit() only."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
from fake_executor import GATE_TIMEOUT_S, Gate
from google.protobuf import text_format

from ge_serve.backends.base import LoadedModel, SlotInfo
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.correlation import SequenceFlags
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler
from ge_serve.scheduler.sequence import SequenceBatcher
from ge_serve.scheduler.work import WorkItem

GATE_S = GATE_TIMEOUT_S

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""
STATE = """
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


class Accumulator(Gate):
    """OUTPUT = the sum of a sequence's inputs so far, from the implicit state when the
    config has one (else 0 + INPUT); records every batch's control rows. Each execution
    waits for the test's permission unless the gate is open."""

    def __init__(self, blocked: bool = False) -> None:
        super().__init__(blocked)
        self.slot = SlotInfo(name="acc", device="cpu")
        self.batches: list[dict[str, list[Any]]] = []

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = {k: v.reshape(v.shape[0], -1)[:, 0].tolist() for k, v in inputs.items()}
        self.batches.append(rows)
        self.enter(len(rows["INPUT"]))
        value = inputs["INPUT"].astype(np.int32)
        state = inputs.get("STATE_IN", np.zeros_like(value)).astype(np.int32)
        start = inputs["START"].astype(bool)
        ready = inputs["READY"].astype(bool)
        total = np.where(start, value, state + value)
        total = np.where(ready, total, 0).astype(np.int32)
        return {"OUTPUT": total, "STATE_OUT": total}

    def close(self) -> None:
        pass


def config(strategy: str = "direct {}", mbs: int = 2, extra: str = STATE, idle_us: int = 0) -> Any:
    text = f"""
name: "acc"
max_batch_size: {mbs}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  {CONTROLS}
  {extra}
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def batcher(
    cfg: Any, *executors: Accumulator, options: SchedulerOptions | None = None
) -> SequenceBatcher:
    loaded = LoadedModel(executors=list(executors))
    scheduler = build_scheduler(cfg, loaded, options or SchedulerOptions())
    assert isinstance(scheduler, SequenceBatcher)
    return scheduler


def req(value: int, seq: int | str, start: bool = False, end: bool = False) -> WorkItem:
    return WorkItem(
        inputs={"INPUT": np.array([[value]], dtype=np.int32)},
        batch_size=1,
        sequence=SequenceFlags(seq, start, end),
    )


def send(b: SequenceBatcher, item: WorkItem) -> asyncio.Future[dict[str, np.ndarray]]:
    return asyncio.ensure_future(b.submit(item))


async def value(future: asyncio.Future[dict[str, np.ndarray]]) -> int:
    result = await asyncio.wait_for(future, GATE_S)
    assert set(result) == {"OUTPUT"}  # the state output is not the client's
    return int(result["OUTPUT"][0][0])


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)
