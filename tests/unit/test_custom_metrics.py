"""A Python model's custom metric families (pb_utils.MetricFamily) as the server keeps
them: names are checked before a family exists."""

from __future__ import annotations

import pytest

from ge_serve.backends.python.host.metrics import COUNTER, CustomMetrics


@pytest.mark.parametrize(
    "name", ["nv_inference_count", "nv_inference_exec_count", "ge_serve_x", "vllm:num_requests"]
)
def test_a_family_may_not_take_a_name_of_the_servers_own(name: str) -> None:
    # /metrics would show two TYPE lines for the name, and Prometheus drops such a scrape.
    with pytest.raises(ValueError, match=f"'{name}' is reserved"):
        CustomMetrics().family(object(), name, "shadows a built-in", COUNTER)


def test_a_family_of_its_own_name_is_made() -> None:
    metrics = CustomMetrics()
    owner = object()
    first = metrics.family(owner, "my_requests", "requests", COUNTER)
    assert metrics.family(owner, "my_requests", "requests", COUNTER) == first
