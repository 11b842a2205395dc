"""What the scheduler costs the event loop per request, in process, without transport.

Closed-loop clients call `submit()` on a scheduler whose executor echoes its input back
(a `simple`-shaped model: INT32 [-1,16], max batch 8), so nearly all the time is spent on
the event loop: scheduling, futures, and the client tasks themselves. Reported per
configuration: requests/s, the event loop thread's CPU time per request (thread_time,
which leaves out the slot thread), and the mean batch size. The figure to compare is the
CPU time, which the machine's speed swings move far less than throughput; the
configurations still alternate in rounds (ABAB...) and each figure is the median of its
rounds. One process, no servers: the time-shared runner does not apply. `--profile` runs
the first configuration once under cProfile instead.

    python -m bench run scheduler-overhead --out bench/results/scheduler_overhead
    python -m bench run scheduler-overhead --rounds 1 --seconds 0.2             # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import uvloop

from ge_serve.backends.base import LoadedModel, SlotInfo
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler
from ge_serve.scheduler.work import WorkItem

Array = npt.NDArray[Any]

PROG = "python -m bench run scheduler-overhead"
CONFIGS = ("off", "static0", "static", "static3ms", "adaptive")


class EchoExecutor:
    """Returns its inputs as outputs: an execution of a few microseconds."""

    def __init__(self) -> None:
        self.slot = SlotInfo(name="echo", device="cpu")
        self.executions = 0

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.executions += 1
        return {"OUTPUT0": inputs["INPUT0"], "OUTPUT1": inputs["INPUT1"]}

    def close(self) -> None:
        pass


def config_for(name: str) -> model_config_pb2.ModelConfig:
    """The batching settings of `simple` (bench/lib/variants.py), as configs."""
    config = model_config_pb2.ModelConfig(name="simple", max_batch_size=8)
    if name == "off":
        return config
    dyn = config.dynamic_batching
    dyn.SetInParent()
    if name == "static":
        dyn.max_queue_delay_microseconds = 100
        dyn.preferred_batch_size.extend([4, 8])
    if name == "static3ms":
        dyn.max_queue_delay_microseconds = 3000
        dyn.preferred_batch_size.append(8)
    if name == "adaptive":
        config.parameters["adaptive_batching"].string_value = "true"
    return config


async def one_round(name: str, concurrency: int, seconds: float) -> dict[str, float]:
    executor = EchoExecutor()
    loaded = LoadedModel(executors=[executor], thread_free=True)
    scheduler: Scheduler = build_scheduler(
        config_for(name),
        loaded,
        SchedulerOptions(),
    )
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    stop = False
    done = 0

    async def client() -> None:
        nonlocal done
        while not stop:
            item = WorkItem(inputs={"INPUT0": a, "INPUT1": a}, batch_size=1)
            await scheduler.submit(item)
            done += 1
            # A request that ran inline completes without yielding; a real one comes
            # and goes through the loop's I/O, so yield as a transport would.
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
    await asyncio.sleep(min(0.2, seconds / 2))  # warm-up: cost model, rate estimates
    start_done, start_wall, start_cpu = done, time.perf_counter(), time.thread_time()
    start_runs = executor.executions
    await asyncio.sleep(seconds)
    count, wall = done - start_done, time.perf_counter() - start_wall
    runs = executor.executions - start_runs
    cpu = time.thread_time() - start_cpu
    stop = True
    await asyncio.gather(*tasks)
    await scheduler.close(5.0)
    return {
        "per_s": count / wall,
        "loop_cpu_us": cpu / max(count, 1) * 1e6,
        "batch": count / max(runs, 1),
    }


async def measure(
    configs: Sequence[str], concurrencies: Sequence[int], rounds: int, seconds: float
) -> list[dict[str, Any]]:
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(rounds):
        for concurrency in concurrencies:
            for name in configs:
                result = await one_round(name, concurrency, seconds)
                samples.setdefault((name, concurrency), []).append(result)
    rows = []
    for (name, concurrency), results in samples.items():
        rows.append(
            {
                "config": name,
                "concurrency": concurrency,
                "per_s": round(statistics.median(r["per_s"] for r in results), 1),
                "loop_cpu_us": round(statistics.median(r["loop_cpu_us"] for r in results), 2),
                "batch": round(statistics.median(r["batch"] for r in results), 2),
                "rounds": len(results),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="also write the rows to OUT.json")
    parser.add_argument("--profile", action="store_true", help="profile one round instead")
    args = parser.parse_args(argv)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        uvloop.run(one_round(args.configs[0], args.concurrency[-1], args.seconds))
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return 0
    rows = uvloop.run(measure(args.configs, args.concurrency, args.rounds, args.seconds))
    print("| config | concurrency | requests/s | loop CPU µs/request | mean batch |")
    print("|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["concurrency"], CONFIGS.index(r["config"]))):
        print(
            f"| {row['config']} | {row['concurrency']} | {row['per_s']:.0f} "
            f"| {row['loop_cpu_us']} | {row['batch']} |"
        )
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0
