"""Client threads that send requests without pause and record every outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.http as httpclient
from polling import poll
from swapmodels import WIDTH
from tritonclient.utils import InferenceServerException


@dataclass(slots=True)
class Outcome:
    sent: float
    done: float
    version: str = ""
    value: float = 0.0
    error: str = ""


def addk_inputs() -> list[httpclient.InferInput]:
    data = np.zeros((1, WIDTH), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, WIDTH], "FP32")]
    inputs[0].set_data_from_numpy(data)
    return inputs


def slow_inputs(iters: int) -> Callable[[], list[httpclient.InferInput]]:
    def make() -> list[httpclient.InferInput]:
        x = httpclient.InferInput("X", [1, 256], "FP32")
        x.set_data_from_numpy(np.ones((1, 256), np.float32))
        n = httpclient.InferInput("ITERS", [1], "INT64")
        n.set_data_from_numpy(np.array([iters], np.int64))
        return [x, n]

    return make


@dataclass
class Workers:
    """`count` threads, each with its own client, looping until stopped."""

    url: str
    model: str
    make_inputs: Callable[[], list[httpclient.InferInput]]
    output: str
    count: int = 4
    stop_on_error: bool = False
    outcomes: list[list[Outcome]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index in range(self.count):
            results: list[Outcome] = []
            self.outcomes.append(results)
            thread = threading.Thread(target=self._run, args=(results,), name=f"load-{index}")
            thread.start()
            self._threads.append(thread)

    def _run(self, results: list[Outcome]) -> None:
        client = httpclient.InferenceServerClient(
            self.url, connection_timeout=120.0, network_timeout=120.0
        )
        try:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    result = client.infer(self.model, self.make_inputs())
                except InferenceServerException as exc:
                    results.append(Outcome(sent, time.monotonic(), error=str(exc.message())))
                    if self.stop_on_error:
                        return
                    continue
                except Exception as exc:  # a transport failure is a failed request too
                    results.append(Outcome(sent, time.monotonic(), error=repr(exc)))
                    continue
                response = result.get_response()
                value = float(np.asarray(result.as_numpy(self.output)).flat[0])
                results.append(
                    Outcome(sent, time.monotonic(), str(response["model_version"]), value)
                )
        finally:
            client.close()

    def total(self) -> int:
        return sum(len(r) for r in self.outcomes)

    def wait_for_total(self, target: int, timeout: float = 120.0) -> None:
        poll(lambda: self.total() >= target, timeout, f"{target} requests")

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(180)
        assert not any(t.is_alive() for t in self._threads), "a load thread did not stop"
        return [o for results in self.outcomes for o in results]
