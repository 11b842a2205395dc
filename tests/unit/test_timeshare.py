"""bench/lib/timeshare.py: contenders take turns, frozen in between, and their work is
counted over the time they ran; and the time-shared suites' summaries of it."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from serverproc import REPO_ROOT, ServerProcess

from bench.lib import frozen_loads, inputs, models, timeshare, timeshare_summary
from bench.lib.timeshare import Slice
from bench.suites import batching

SIMPLE = REPO_ROOT / "examples" / "models" / "simple"


class FakeContender:
    """Does `speed` work per tick of a fake clock while resumed, and checks that nobody
    else is running when it is resumed."""

    def __init__(self, name: str, speed: float, running: list[str], clock: list[float]) -> None:
        self.name, self.speed = name, speed
        self.running, self.clock = running, clock
        self.done = 0.0

    def count(self) -> float:
        assert self.running == [self.name], "counted while not the only one running"
        return self.done

    def resume(self) -> None:
        assert not self.running, f"{self.name} resumed while {self.running} ran"
        self.running.append(self.name)

    def pause(self) -> None:
        self.running.remove(self.name)


def test_contenders_take_turns_alone_each_once_a_cycle() -> None:
    running: list[str] = []
    now = [0.0]
    fakes = [FakeContender(n, s, running, now) for n, s in (("a", 10.0), ("b", 30.0))]
    order: list[str] = []

    def sleep(seconds: float) -> None:
        order.append(running[0])
        for fake in fakes:
            if fake.name in running:
                fake.done += fake.speed * seconds
        now[0] += seconds

    slices = timeshare.take_turns(fakes, cycles=40, slice_s=0.5, clock=lambda: now[0], sleep=sleep)
    cycles = ["".join(order[i : i + 2]) for i in range(0, len(order), 2)]
    assert set(cycles) == {"ab", "ba"}  # each once a cycle, in either order
    assert 10 <= cycles.count("ab") <= 30
    assert not running  # all paused on return
    assert [len(s) for s in slices.values()] == [40, 40]
    work = {name: timeshare.slice_work(found) for name, found in slices.items()}
    assert timeshare.rate(work["a"]) == pytest.approx(10.0)
    assert timeshare.rate(work["b"]) == pytest.approx(30.0)


def test_no_contender_stays_frozen_past_the_keep_alive_limit() -> None:
    # Five contenders: the first of one cycle may be the last of the next, and wait 8
    # slices. At 0.6 s that is 4.8 s, allowed; at 0.7 s, 5.6 s, refused before anything runs.
    running: list[str] = []
    fakes = [FakeContender(str(i), 1.0, running, [0.0]) for i in range(5)]
    with pytest.raises(ValueError, match=r"frozen 5\.6 s"):
        timeshare.take_turns(fakes, cycles=1, slice_s=0.7, sleep=lambda s: None)
    assert not running
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = timeshare.take_turns(fakes, cycles=50, slice_s=0.6, clock=lambda: now[0], sleep=sleep)
    waits = [b.resumed - a.paused for s in found.values() for a, b in itertools.pairwise(s)]
    assert max(waits) == pytest.approx(8 * 0.6)  # seen in 50 cycles of random orders


def test_longer_freezes_are_refused_over_http(capsys: pytest.CaptureFixture[str]) -> None:
    # gRPC connections survive a 12 s freeze; uvicorn's keep-alive does not (see timeshare).
    with pytest.raises(SystemExit) as info:
        batching.main(["--out", "/nonexistent/x", "--max-frozen-s", "20"])
    assert info.value.code == 2
    assert "needs --protocol grpc" in capsys.readouterr().err


def test_work_between_a_read_and_the_pause_counts_in_its_slice() -> None:
    # Read at 100 and 110; 4 more done before the pause, which the next slice's first
    # read (114) sees; the last slice ends at its own final read.
    slices = [Slice(0.0, 1.0, 100.0, 110.0), Slice(5.0, 6.0, 114.0, 120.0)]
    assert timeshare.slice_work(slices) == [(14.0, 1.0), (6.0, 1.0)]
    assert timeshare.rate(timeshare.slice_work(slices)) == 10.0


def test_the_interval_pairs_slices_of_a_cycle() -> None:
    # Both contenders see the machine's speed (1x or 2x) alike within a cycle: the ratio is
    # 1.5 in every cycle, so resampling cycles cannot move it however the speed swings.
    speed = [1.0, 2.0, 2.0, 1.0, 2.0, 1.0, 1.0, 1.0]
    a = [(15.0 * s, 1.0) for s in speed]
    b = [(10.0 * s, 1.0) for s in speed]
    low, high = timeshare.ratio_interval(a, b)
    assert low == pytest.approx(1.5) and high == pytest.approx(1.5)
    # Noise within cycles widens it around the point estimate.
    noisy = [(w * (1.2 if i % 2 else 0.8), t) for i, (w, t) in enumerate(a)]
    low, high = timeshare.ratio_interval(noisy, b)
    point = timeshare.rate(noisy) / timeshare.rate(b)
    assert low < point < high


def test_the_interval_keeps_a_slice_and_the_next_together() -> None:
    # Both run at 100/s throughout, but each of `a`'s slices leaves 30 of its work to its
    # next one (a batch in flight at the pause): 130, 70, 130, 70, ... The run's ratio is
    # 1; resampled one cycle at a time the interval spreads around it, in runs of two
    # cycles the shifted work stays with the slice it was shifted to.
    a = [(130.0 if i % 2 else 70.0, 1.0) for i in range(40)]
    b = [(100.0, 1.0)] * 40
    assert timeshare.rate(a) / timeshare.rate(b) == pytest.approx(1.0)
    single = timeshare.ratio_interval(a, b, block=1)
    assert single[0] < 0.95 and single[1] > 1.05
    low, high = timeshare.ratio_interval(a, b, block=2)
    assert low == pytest.approx(1.0) and high == pytest.approx(1.0)


def test_the_summary_compares_adaptive_by_throughput_at_32_and_latency_at_1() -> None:
    def steady(rate: float, cycles: int = 5) -> list[Slice]:
        return [Slice(2.0 * i, 2.0 * i + 1.0, rate * i, rate * (i + 1)) for i in range(cycles)]

    slices = {
        "static0 c32": steady(100.0),
        "adaptive c32": steady(110.0),
        "off c1": steady(50.0),
        "adaptive c1": steady(40.0),  # slower at one client: higher mean latency
        "raw b4": steady(120.0),
        "raw b8": steady(200.0),
    }
    rows = {r["contender"]: r for r in batching.summarize("m", "http", slices)}
    assert rows["adaptive c32"]["raw best"] == "raw b8"
    assert rows["static0 c32"]["÷ raw best"] == pytest.approx(0.5)
    assert rows["static0 c32"]["adaptive ÷ it"] == pytest.approx(1.1)  # throughput
    assert rows["off c1"]["adaptive ÷ it"] == pytest.approx(50.0 / 40.0)  # mean latency
    assert "adaptive ÷ it" not in rows["adaptive c32"]
    assert "÷ raw best" not in rows["raw b4"]


def _run_then_freeze(contender: frozen_loads.Contender, seconds: float) -> tuple[float, float]:
    """(work done running `seconds`, work done in the next `seconds` frozen), paused on
    entry and on return."""
    contender.resume()
    start = contender.count()
    time.sleep(seconds)
    ran = contender.count() - start
    contender.pause()
    time.sleep(seconds)
    contender.resume()
    frozen = contender.count() - start - ran
    contender.pause()
    return ran, frozen


def test_a_twin_is_a_second_server_of_the_same_setting() -> None:
    names = batching.contender_names("simple", [32], twins=["static0"])
    assert names[:2] == [("static0 c32", "static0", 32), ("static0' c32", "static0", 32)]
    assert [n for n, _, _ in names].count("adaptive c32") == 1
    slices = {"static0' c32": [Slice(0.0, 1.0, 0.0, 90.0)],
              "adaptive c32": [Slice(2.0, 3.0, 0.0, 99.0)]}  # fmt: skip
    rows = {r["contender"]: r for r in batching.summarize("m", "http", slices)}
    assert rows["static0' c32"]["adaptive ÷ it"] == pytest.approx(1.1)


def test_configs_choose_the_c32_servers_among_the_variants() -> None:
    names = batching.contender_names("resnet18_like", [32, 1], configs=["adaptivex2"])
    assert names == [("adaptivex2 c32", "adaptivex2", 32), ("off c1", "off", 1),
                     ("adaptive c1", "adaptive", 1)]  # fmt: skip
    with pytest.raises(ValueError, match="no variant"):
        batching.contender_names("simple", [32], configs=["adaptivex2"])


def test_two_slot_settings_are_compared_with_adaptive_on_two_slots() -> None:
    slices = {"static0 c32": [Slice(0.0, 1.0, 0.0, 100.0)],
              "static0x2 c32": [Slice(1.0, 2.0, 0.0, 80.0)],
              "adaptive c32": [Slice(2.0, 3.0, 0.0, 90.0)],
              "adaptivex2 c32": [Slice(3.0, 4.0, 0.0, 120.0)]}  # fmt: skip
    rows = {r["contender"]: r for r in batching.summarize("m", "grpc", slices)}
    assert rows["static0 c32"]["adaptive ÷ it"] == pytest.approx(0.9)
    assert rows["static0x2 c32"]["adaptive ÷ it"] == pytest.approx(1.5)
    assert "adaptive ÷ it" not in rows["adaptivex2 c32"]


@pytest.mark.parametrize("slots", [1, 2])
def test_a_paused_raw_worker_does_no_work(tmp_path: Path, slots: int) -> None:
    # With two slots, two sessions count into one counter, and both stop when paused.
    onnx = models.ensure_model("simple").onnx_path
    with frozen_loads.RawLoad("raw b8", onnx, 8, tmp_path, slots) as raw:
        frozen_loads.warm(raw, 0.2)  # paused on return
        ran, frozen = _run_then_freeze(raw, 0.3)
        raw.check()
    assert ran > 0
    assert frozen < ran / 4  # only the instants around the pause and the resume


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_paused_server_and_its_load_do_no_work(
    server: ServerProcess, tmp_path: Path, perf_analyzer: tuple[str, dict[str, str]]
) -> None:
    pa = perf_analyzer
    data = inputs.input_json_for(SIMPLE, tmp_path / "simple.json")
    with frozen_loads.ServerLoad("s", server, "simple", "http", 2, data, pa, tmp_path) as load:
        frozen_loads.warm(load, 1.0)
        load.mark_threads()
        ran, frozen = _run_then_freeze(load, 0.5)
        load.check()
        batch = load.mean_batch()
        assert load.threads_lost() == 0
    assert server.alive()
    assert batch is not None and batch >= 1.0
    assert ran > 0
    assert frozen < ran / 4


def _steady(rate: float, cycles: int = 5, start: float = 0.0) -> list[Slice]:
    return [
        Slice(start + 2.0 * i, start + 2.0 * i + 1.0, rate * i, rate * (i + 1))
        for i in range(cycles)
    ]


def test_the_pooled_interval_of_one_run_is_the_runs_interval() -> None:
    a = [(100.0 + (7 * i) % 13, 1.0) for i in range(40)]
    b = [(90.0 + (5 * i) % 11, 1.0) for i in range(40)]
    assert timeshare.pooled_ratio_interval([(a, b)]) == timeshare.ratio_interval(a, b)
    # Two runs of it pool to the same ratio, with no wider an interval.
    low, high = timeshare.pooled_ratio_interval([(a, b), (a, b)])
    single = timeshare.ratio_interval(a, b)
    assert low <= timeshare.rate(a) / timeshare.rate(b) <= high
    assert high - low <= single[1] - single[0] + 1e-9


def test_runs_of_one_label_in_several_files_are_pooled(tmp_path: Path) -> None:
    first = timeshare.Measured(
        {"static0 c32": _steady(100.0), "adaptive c32": _steady(110.0)},
        {"static0 c32": 8.0, "adaptive c32": 7.0},
        {"static0 c32": 0, "adaptive c32": 0},
    )
    second = timeshare.Measured(
        {"static0 c32": _steady(100.0), "adaptive c32": _steady(90.0)},
        {"static0 c32": 8.0, "adaptive c32": 5.0},
        {"static0 c32": 1, "adaptive c32": 0},
    )
    timeshare.save_runs({"m grpc": first}, tmp_path / "one_slices.json")
    timeshare.save_runs({"m grpc": second}, tmp_path / "two_slices.json")
    runs = timeshare.load_runs([tmp_path / "one_slices.json", tmp_path / "two_slices.json"])
    assert list(runs) == ["m grpc"] and len(runs["m grpc"]) == 2
    rows = {r["contender"]: r for r in batching.summarize_runs("m", "grpc", runs["m grpc"])}
    # Pooled: (110 + 90) per second over as many seconds as static0's 100 + 100.
    assert rows["static0 c32"]["adaptive ÷ it"] == pytest.approx(1.0)
    assert rows["static0 c32"]["slices"] == 10
    assert rows["adaptive c32"]["mean batch"] == "7.00 / 5.00"
    assert rows["static0 c32"]["threads lost"] == 1


def test_protocols_are_compared_with_http_at_the_same_concurrency() -> None:
    from bench.suites import protocols

    run = timeshare.Measured(
        {"http c16": _steady(100.0), "grpc c16": _steady(70.0),
         "grpc-stream c16": _steady(95.0), "raw b1": _steady(1000.0),
         "raw b8": _steady(4000.0)},
        {}, {},
    )  # fmt: skip
    rows = {r["contender"]: r for r in protocols.summarize("c16", [run])}
    assert rows["grpc c16"]["÷ http"] == pytest.approx(0.7)
    assert rows["grpc-stream c16"]["÷ raw b1"] == pytest.approx(0.095)
    assert rows["http c16"]["÷ raw best"] == pytest.approx(0.025)  # best: batch 8
    assert "÷ http" not in rows["http c16"] and "÷ http" not in rows["raw b1"]
    assert protocols.http_for("grpc-stream c1") == "http c1"


def test_two_slots_are_compared_with_one_at_the_same_concurrency() -> None:
    from bench.suites import slots

    run = timeshare.Measured(
        {"1 slot c4": _steady(60.0), "2 slots c4": _steady(70.0), "raw b1": _steady(80.0),
         "raw b1 x2": _steady(85.0)},
        {}, {},
    )  # fmt: skip
    rows = {r["contender"]: r for r in slots.summarize("resnet18_like c4", [run])}
    assert rows["2 slots c4"]["÷ 1 slot"] == pytest.approx(70.0 / 60.0)
    assert rows["2 slots c4"]["raw best"] == "raw b1 x2"
    assert rows["1 slot c4"]["model"] == "resnet18_like"
    assert "÷ 1 slot" not in rows["1 slot c4"]
    assert [c.name for c in slots.contenders("simple", 2, [1], [1, 2])[1]] == [
        "raw b1",
        "raw b1 x2",
    ]


def test_metrics_on_is_compared_with_off_and_the_control_with_its_twin() -> None:
    from bench.suites import metrics_overhead as metrics

    run = timeshare.Measured(
        {metrics.ON: _steady(95.0), metrics.OFF: _steady(100.0), metrics.TWIN: _steady(96.0)},
        {}, {},
    )  # fmt: skip
    rows = {r["contender"]: r for r in metrics.summarize("simple http c16", [run])}
    assert rows[metrics.ON]["ratio"] == pytest.approx(0.95)
    assert rows[metrics.TWIN]["versus"] == metrics.ON
    assert rows[metrics.TWIN]["ratio"] == pytest.approx(96.0 / 95.0)
    assert "ratio" not in rows[metrics.OFF]
    names = [c.name for c in metrics.contenders(16, control=False, data=Path("d.json"))]
    assert names == [metrics.ON, metrics.OFF]


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_short_run_takes_turns_with_a_server_and_raw_onnxruntime(
    tmp_path: Path, perf_analyzer: tuple[str, dict[str, str]]
) -> None:
    # The whole runner, briefly: a server of its own with its perf_analyzer, and a raw
    # worker, each counted over the slices it ran; every process ends with the run.
    data = inputs.input_json_for(SIMPLE, tmp_path / "simple.json")
    flags = ("--model-control-mode", "explicit", "--load-model", "simple")
    server = timeshare.ServerContender("s", SIMPLE.parent, flags, "simple", "http", 2, data)
    raw = timeshare.RawContender("raw b8", models.ensure_model("simple").onnx_path, 8)
    found = timeshare.run_contenders([server], [raw], cycles=3, slice_s=0.3, warmup_s=0.6)
    assert [len(found.slices[n]) for n in ("s", "raw b8")] == [3, 3]
    assert found.threads_lost == {"s": 0}
    rows = {r["contender"]: r for r in timeshare_summary.versus_rows([found], lambda n: None, "x")}
    assert rows["s"]["infer/s"] > 0 and rows["raw b8"]["infer/s"] > 0
    assert rows["s"]["raw best"] == "raw b8"
    assert (found.mean_batch["s"] or 0) >= 1.0
