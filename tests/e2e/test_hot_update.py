"""Hot update and unload under load: the real server, four tritonclient workers.

Acceptance: thousands of requests across 10 API swaps and several poll-mode config edits,
0 failed, and every request sent after a swap completed is served by the new version.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from polling import poll
from serverproc import running_server
from swapload import Outcome, Workers, addk_inputs, slow_inputs
from swapmodels import (
    ADDK,
    SLOW,
    addk_config,
    write_addk,
    write_addk_version,
    write_atomic,
    write_slow,
)

# Requests the workers complete between swaps, so each version serves under load.
PER_SWAP = 300


def served(client: httpclient.InferenceServerClient) -> tuple[str, float]:
    result = client.infer(ADDK, addk_inputs())
    return str(result.get_response()["model_version"]), float(result.as_numpy("OUTPUT0")[0, 0])


def check_served_after(outcomes: list[Outcome], since: float, until: float, version: str) -> None:
    """Every request sent after `since` and finished before `until` ran on `version`."""
    window = [o for o in outcomes if o.sent > since and o.done < until]
    wrong = [o for o in window if o.version != version]
    assert not wrong, f"{len(wrong)} requests after the swap to {version} ran on {wrong[0]}"


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_ten_api_swaps_under_load_fail_nothing(tmp_path: Path) -> None:
    folder = write_addk(tmp_path, [1])
    extra = ["--model-control-mode=explicit", f"--load-model={ADDK}", "--log-info=false"]
    with running_server([tmp_path], extra) as server:
        admin = httpclient.InferenceServerClient(server.http_url, network_timeout=120.0)
        workers = Workers(server.http_url, ADDK, addk_inputs, "OUTPUT0")
        workers.start()
        swaps: list[tuple[float, str]] = []
        issued: list[float] = []
        try:
            workers.wait_for_total(PER_SWAP)
            for version in range(2, 12):
                write_addk_version(folder, version)
                issued.append(time.monotonic())
                admin.load_model(ADDK)  # returns once swapped in and the old one is freed
                swaps.append((time.monotonic(), str(version)))
                assert served(admin) == (str(version), float(version))
                workers.wait_for_total(workers.total() + PER_SWAP)
        finally:
            outcomes = workers.stop()
            admin.close()
        failed = [o for o in outcomes if o.error]
        print(f"10 API swaps: {len(outcomes)} requests, {len(failed)} failed")
        assert not failed, f"{len(failed)} of {len(outcomes)} failed, first: {failed[0].error}"
        assert len(outcomes) >= 11 * PER_SWAP
        assert all(o.value == float(o.version) for o in outcomes)
        assert {o.version for o in outcomes} == {str(v) for v in range(1, 12)}
        # Per client, versions only move forward: no old version serves after a new one did.
        for results in workers.outcomes:
            versions = [int(o.version) for o in results]
            assert versions == sorted(versions)
        ends = [*issued[1:], float("inf")]
        for (since, swapped_in), until in zip(swaps, ends, strict=True):
            check_served_after(outcomes, since, until, swapped_in)
        index = admin_index(server.http_url)
        assert [r for r in index if r["name"] == ADDK] == [
            {"name": ADDK, "version": "11", "state": "READY"}
        ]


def admin_index(url: str) -> list[dict[str, str]]:
    client = httpclient.InferenceServerClient(url)
    try:
        index: list[dict[str, str]] = client.get_model_repository_index()
        return index
    finally:
        client.close()


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_poll_mode_config_edits_under_load_fail_nothing(tmp_path: Path) -> None:
    def policy(version: int) -> str:
        return f"version_policy {{ specific {{ versions: [{version}] }} }}"

    folder = write_addk(tmp_path, [1, 2, 3], policy(1))
    extra = ["--model-control-mode=poll", "--repository-poll-secs=0.2", "--log-info=false"]
    with running_server([tmp_path], extra) as server:
        admin = httpclient.InferenceServerClient(server.http_url, network_timeout=120.0)
        workers = Workers(server.http_url, ADDK, addk_inputs, "OUTPUT0")
        workers.start()
        switches: list[tuple[float, str]] = []
        edits: list[float] = []
        try:
            workers.wait_for_total(PER_SWAP)
            for version in (2, 3, 1, 3):
                edits.append(time.monotonic())
                write_atomic(folder / "config.pbtxt", addk_config(policy(version)))
                poll(
                    lambda v=version: served(admin)[0] == str(v),  # type: ignore[misc]
                    120,
                    f"the poll to switch to version {version}",
                )
                switches.append((time.monotonic(), str(version)))
                workers.wait_for_total(workers.total() + PER_SWAP)
            # A broken edit: the poll's reload fails, version 3 keeps serving.
            write_atomic(folder / "config.pbtxt", "max_batch_size: nonsense")
            poll(
                lambda: any(
                    "reload failed" in r.get("reason", "") for r in admin_index(server.http_url)
                ),
                120,
                "the failed reload to show in the index",
            )
            workers.wait_for_total(workers.total() + PER_SWAP)
        finally:
            outcomes = workers.stop()
            admin.close()
        failed = [o for o in outcomes if o.error]
        print(f"4 poll-mode edits + 1 broken: {len(outcomes)} requests, {len(failed)} failed")
        assert not failed, f"{len(failed)} of {len(outcomes)} failed, first: {failed[0].error}"
        assert len(outcomes) >= 6 * PER_SWAP
        assert all(o.value == float(o.version) for o in outcomes)
        assert {o.version for o in outcomes} == {"1", "2", "3"}
        ends = [*edits[1:], float("inf")]
        for (since, switched_to), until in zip(switches, ends, strict=True):
            check_served_after(outcomes, since, until, switched_to)
        (row,) = [r for r in admin_index(server.http_url) if r["name"] == ADDK]
        assert row["version"] == "3" and row["state"] == "READY"
        assert "failed to parse config.pbtxt" in row["reason"]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_poll_mode_adds_and_removes_models(tmp_path: Path) -> None:
    write_addk(tmp_path, [1])
    extra = ["--model-control-mode=poll", "--repository-poll-secs=0.2"]
    with running_server([tmp_path], extra) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            write_addk(tmp_path, [1, 2], name="later")
            poll(lambda: client.is_model_ready("later"), 120, "'later' to load")
            assert client.get_model_metadata("later")["versions"] == ["2"]
            for child in sorted((tmp_path / "later").rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() else child.unlink()
            (tmp_path / "later").rmdir()
            poll(
                lambda: "later" not in {r["name"] for r in client.get_model_repository_index()},
                120,
                "'later' to be unloaded",
            )
            assert not client.is_model_ready("later")
            assert client.is_server_ready() and client.is_model_ready(ADDK)
        finally:
            client.close()


CLEAN_ERROR = "Request for unknown model: 'slow' has no available versions"


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_unload_under_load_completes_in_flight_requests(tmp_path: Path) -> None:
    write_slow(tmp_path)
    extra = ["--model-control-mode=explicit", f"--load-model={SLOW}"]
    with running_server([tmp_path], extra) as server:
        admin = httpclient.InferenceServerClient(server.http_url, network_timeout=120.0)
        # One slot, four clients: at any moment one request runs and the rest queue.
        workers = Workers(server.http_url, SLOW, slow_inputs(5000), "Y", stop_on_error=True)
        workers.start()
        try:
            poll(lambda: all(len(r) >= 2 for r in workers.outcomes), 120, "warm-up")
            started = time.monotonic()
            admin.unload_model(SLOW)
            unloaded = time.monotonic()
            poll(lambda: all(r and r[-1].error for r in workers.outcomes), 120, "every client")
        finally:
            outcomes = workers.stop()
        # Requests in flight when the unload began completed successfully...
        in_flight = [o for o in outcomes if o.sent < started < o.done]
        assert any(not o.error for o in in_flight)
        # ...and the only error anyone saw is the clean one, after them.
        assert {o.error for o in outcomes if o.error} == {CLEAN_ERROR}
        assert all(o.error == CLEAN_ERROR for o in outcomes if o.sent > unloaded)
        for results in workers.outcomes:
            first_error = next(i for i, o in enumerate(results) if o.error)
            assert all(o.error for o in results[first_error:])
        assert not admin.is_model_ready(SLOW)
        assert admin.is_server_ready()
        index = admin.get_model_repository_index()
        assert {"name": SLOW, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in (
            index
        )
        admin.load_model(SLOW)
        assert admin.is_model_ready(SLOW)
        admin.close()
