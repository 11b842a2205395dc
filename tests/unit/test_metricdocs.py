"""tests/metricdocs.py, which the e2e tests use to hold every exported metric family to the
documents: it reads real names out of the tables, and it can find a family missing."""

from __future__ import annotations

from deployfiles import DEPLOY
from metricdocs import documented, expand, undocumented
from promtext import Exposition, parse
from serverproc import REPO_ROOT


def test_documented_names_are_read_as_names() -> None:
    names = documented(DEPLOY / "README.md", REPO_ROOT / "docs" / "npu.md")
    # Brace choices expanded, label selectors dropped: the e2e checks compare real names.
    for name in (
        "nv_inference_queue_duration_us",
        "nv_inference_queue_summary_us",
        "nv_inference_request_failure",
        "nv_cache_miss_duration_per_model",
        "ge_serve_device_pool_bytes",
        "ge_serve_device_simulated_timing",
    ):
        assert name in names
    assert not {name for name in names if "{" in name or "," in name or "=" in name}


def test_expand() -> None:
    assert expand("a_{b,c}_d") == {"a_b_d", "a_c_d"}
    assert expand("x_{p,q}_{r,s}") == {"x_p_r", "x_p_s", "x_q_r", "x_q_s"}
    assert expand("name{reason}") == {"name"}
    assert expand('name{device="npu0",profile=...}') == {"name"}


def test_a_family_the_documents_do_not_name_is_found() -> None:
    names = documented(DEPLOY / "README.md")
    exposition = Exposition(types={"nv_inference_count": "counter", "ge_serve_bogus": "gauge"})
    assert undocumented(exposition, names) == ["ge_serve_bogus"]


def test_a_counter_exported_without_its_documented_total_is_found() -> None:
    # The server's counters always carry samples (the finish reasons start at 0, as in
    # vLLM), so an exported name without its documented `_total` is a real mismatch,
    # whether it has samples yet or not.
    names = {"documented_count_total"}
    for text in (
        "# HELP documented_count x\n# TYPE documented_count counter\ndocumented_count 1\n",
        "# HELP documented_count x\n# TYPE documented_count counter\n",
    ):
        assert undocumented(parse(text), names) == ["documented_count"]
