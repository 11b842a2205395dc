"""The efficientnet bench suite's timing: the default profile slowed down, every modelled
time in proportion (docs/npu.md, "A real model on a small host")."""

from __future__ import annotations

from bench.suites import efficientnet
from ge_serve.backends.ge.sim_cost import DEFAULT_PROFILE, PROFILES, parse_sim_cost


def test_the_slowed_profile_keeps_the_default_s_proportions() -> None:
    default = PROFILES[DEFAULT_PROFILE]
    slowed = parse_sim_cost(efficientnet.sim_cost(64))
    assert slowed is not None
    for rows in (1, 2, 8, 32):
        assert abs(slowed.duration_ns(rows) - 64 * default.duration_ns(rows)) <= 1000
    # The default slowdown puts batch 32 at 1.54 s and batch 1 at 335 ms.
    assert 1.5e9 < slowed.duration_ns(32) < 1.6e9
    assert 330e6 < slowed.duration_ns(1) < 340e6


def test_the_suite_defaults_to_the_slowed_profile() -> None:
    args = efficientnet.parse(["--out", "/tmp/e"])
    assert args.slowdown == efficientnet.SLOWDOWN and args.sim_cost is None


def test_the_host_s_share_is_what_executions_took_past_their_device_time() -> None:
    cost = parse_sim_cost("launch_us=1000,per_sample_us=100")
    assert cost is not None
    # 10 executions of 3 (gear 4: 1.4 ms each) that took 15.4 ms, one of 1 (1.1 ms) that
    # took 1.1 ms: 1.4 ms past 15.1 ms modelled.
    before = {3: (5, 7_000_000)}
    after = {3: (15, 22_400_000), 1: (1, 1_100_000)}
    share = efficientnet.host_share(before, after, cost)
    assert share is not None and abs(share - 1.4 / 15.1) < 1e-9
    assert efficientnet.host_share(after, after, cost) is None
