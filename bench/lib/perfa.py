"""Run perf_analyzer (from tritonclient 2.51.0's wheel, see bench/setup_perf_analyzer.sh) and
parse its CSV into a dict.

    path, env = find_perf_analyzer()            # raises PerfAnalyzerUnavailable
    row = run_perf_analyzer("simple", "127.0.0.1:8000", "http", concurrency=8,
                            input_data=Path("simple.json"))
    row["throughput"], row["p50_us"], row["p99_us"], row["server_queue_us"]

shared_memory="system" makes perf_analyzer pass every input and output through system shared
memory (Triton's extension) instead of the socket; the server must allow it
(`server_flags(shared_memory)`: --allow-client-shm=true, off by default as in Triton).

Latencies are microseconds, throughput is infer/s. Server-side columns (queue, compute
input/infer/output) are present only when the server has the `statistics` extension.
"""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
SETUP_SCRIPT = BENCH / "setup_perf_analyzer.sh"

# perf_analyzer CSV header -> our key. Verbose CSV (with server statistics) has the
# Server* columns; without statistics it has "request/response" and "response wait".
CSV_KEYS: dict[str, str] = {
    "Concurrency": "concurrency",
    "Request Rate": "request_rate",
    "Inferences/Second": "throughput",
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_us",
    "Server Queue": "server_queue_us",
    "Server Compute Pre": "server_compute_input_us",
    "Server Compute Input": "server_compute_input_us",
    "Server Compute Infer": "server_compute_infer_us",
    "Server Compute Post": "server_compute_output_us",
    "Server Compute Output": "server_compute_output_us",
    "Client Recv": "client_recv_us",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Avg latency": "avg_us",
    "request/response": "request_response_us",
    "response wait": "response_wait_us",
}

UNSTABLE_MARK = "Failed to obtain stable measurement"

# perf_analyzer's --shared-memory kinds that ge-serve serves (it has no CUDA devices).
SHARED_MEMORY_KINDS = ("none", "system")


def server_flags(shared_memory: str) -> list[str]:
    """The ge-serve flags a run with perf_analyzer's `shared_memory` kind needs."""
    return [] if shared_memory == "none" else ["--allow-client-shm=true"]


class PerfAnalyzerUnavailable(RuntimeError):
    """perf_analyzer cannot be set up on this machine; the message says why."""


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer ran and failed; the message holds its command and output tail."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def find_perf_analyzer(install: bool = True) -> tuple[str, dict[str, str]]:
    """(binary path, full environment to run it with). Runs setup_perf_analyzer.sh (cached
    after the first call: ~0.1 s). install=False never runs pip/apt-get."""
    env = dict(os.environ)
    if not install:
        env["PERF_ANALYZER_NO_INSTALL"] = "1"
    try:
        proc = subprocess.run(
            ["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, env=env, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PerfAnalyzerUnavailable(f"setup_perf_analyzer.sh did not run: {exc}") from exc
    if proc.returncode != 0:
        raise PerfAnalyzerUnavailable(proc.stderr.strip() or "setup_perf_analyzer.sh failed")
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    path = values.get("PERF_ANALYZER", "")
    if not path:
        raise PerfAnalyzerUnavailable(f"setup_perf_analyzer.sh printed no path: {proc.stdout}")
    run_env = dict(os.environ)
    ld = values.get("PERF_ANALYZER_LD_LIBRARY_PATH", "")
    old = run_env.get("LD_LIBRARY_PATH", "")
    run_env["LD_LIBRARY_PATH"] = f"{ld}:{old}" if old else ld
    run_env.setdefault("GLIBC_TUNABLES", LOADGEN_MALLOC)
    return path, run_env


# perf_analyzer copies each request's input into a fresh heap buffer, and glibc hands the
# freed memory straight back to the kernel (heap trim), so with large tensors every request
# faults in and zeroes new pages: most of perf_analyzer's CPU with the CNN's inputs, taken
# from the server on a machine with few cores (bench/RESULTS.md, "Method"). Keeping freed
# memory mapped avoids it. Only the load generator's allocator changes; the server is
# untouched, and every configuration in a comparison runs with the same setting.
LOADGEN_MALLOC = (
    "glibc.malloc.trim_threshold=268435456"
    ":glibc.malloc.mmap_threshold=33554432"
    ":glibc.malloc.top_pad=67108864"
)


def _brief(output: str, limit: int = 3000) -> str:
    """The useful part of perf_analyzer's output: its usage dump follows the error line."""
    head = output.split("Usage:", 1)[0].strip()
    if len(head) <= limit:
        return head
    return head[: limit // 2] + "\n...\n" + head[-limit // 2 :]


def _number(text: str) -> float | str:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_csv(text: str) -> list[dict[str, float | str]]:
    """Rows of perf_analyzer's `-f` CSV, with our key names (unknown columns kept as-is).
    Stops at the first blank line (later blocks, e.g. metrics, are ignored)."""
    lines: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            break
        lines.append(line)
    rows: list[dict[str, float | str]] = []
    for record in csv.DictReader(lines):
        row: dict[str, float | str] = {}
        for header, value in record.items():
            if header is None or value is None:
                continue
            row[CSV_KEYS.get(header.strip(), header.strip())] = _number(value.strip())
        rows.append(row)
    return rows


def build_command(
    binary: str,
    model: str,
    url: str,
    protocol: str,
    concurrency: int | None,
    csv_path: Path,
    input_data: Path | str | None = None,
    extra_args: Sequence[str] = (),
    measurement_interval_ms: int = 3000,
    max_trials: int = 6,
    stability_percentage: float = 20,
    batch_size: int = 1,
    request_rate: float | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    use_async: bool = False,
    verbose_csv: bool = True,
    shared_memory: str = "none",
    output_shared_memory_size: int | None = None,
) -> list[str]:
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
    if shared_memory not in SHARED_MEMORY_KINDS:
        raise ValueError(
            f"shared_memory must be one of {SHARED_MEMORY_KINDS}, not {shared_memory!r}"
        )
    cmd = [
        binary, "-m", model, "-u", url, "-i", protocol, "-b", str(batch_size),
        "--measurement-interval", str(measurement_interval_ms),
        "--max-trials", str(max_trials),
        "--stability-percentage", str(stability_percentage),
        "-f", str(csv_path),
    ]  # fmt: skip
    if request_rate is not None:
        cmd += ["--request-rate-range", f"{request_rate}:{request_rate}:1"]
    elif concurrency is not None:
        cmd += ["--concurrency-range", f"{concurrency}:{concurrency}:1"]
    if verbose_csv:
        cmd.append("--verbose-csv")
    if use_async:
        cmd.append("--async")
    if input_data is not None:
        # perf_analyzer runs in a temporary folder: make file paths absolute.
        data = str(input_data)
        if data not in ("zero", "random"):
            data = str(Path(data).resolve())
        cmd += ["--input-data", data]
    for name, shape in (shapes or {}).items():
        cmd += ["--shape", f"{name}:{','.join(str(d) for d in shape)}"]
    if shared_memory != "none":
        cmd += ["--shared-memory", shared_memory]
        # Only needed for outputs whose size the metadata cannot tell (BYTES, -1 dims).
        if output_shared_memory_size is not None:
            cmd += ["--output-shared-memory-size", str(output_shared_memory_size)]
    return cmd + list(extra_args)


def run_perf_analyzer(
    model: str,
    url: str,
    protocol: str = "http",
    concurrency: int | None = 1,
    input_data: Path | str | None = None,
    extra_args: Sequence[str] = (),
    *,
    measurement_interval_ms: int = 3000,
    max_trials: int = 6,
    stability_percentage: float = 20,
    batch_size: int = 1,
    request_rate: float | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    use_async: bool = False,
    shared_memory: str = "none",
    output_shared_memory_size: int | None = None,
    on_unstable: str = "rerun",
    timeout_s: float | None = None,
    perf_analyzer: tuple[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """One perf_analyzer measurement (one concurrency, or one request rate when
    `request_rate` is set). Returns the parsed CSV row plus model/protocol/batch_size/stable/
    command keys.

    On an unstable measurement perf_analyzer exits 2 and writes no CSV. on_unstable="rerun"
    (default) then measures again with the stability check effectively off (the average of
    3 windows) and returns stable=False; "error" raises PerfAnalyzerError.
    url is host:port (HTTP or gRPC port to match `protocol`)."""
    binary, env = perf_analyzer or find_perf_analyzer()
    if timeout_s is None:
        # Each trial is one window plus slack; a rerun adds 3 more windows.
        timeout_s = 60 + (max_trials + 4) * measurement_interval_ms / 1000 * 3
    with tempfile.TemporaryDirectory(prefix="perfa-") as tmp:
        csv_path = Path(tmp) / "out.csv"
        trials, stability = max_trials, stability_percentage
        stable = True
        for attempt in range(2):
            cmd = build_command(
                binary, model, url, protocol, concurrency, csv_path, input_data, extra_args,
                batch_size=batch_size, request_rate=request_rate, shapes=shapes,
                measurement_interval_ms=measurement_interval_ms, max_trials=trials,
                stability_percentage=stability, use_async=use_async,
                shared_memory=shared_memory, output_shared_memory_size=output_shared_memory_size,
            )  # fmt: skip
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout_s
                )
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else ""
                message = f"timed out after {timeout_s}s: {' '.join(cmd)}"
                raise PerfAnalyzerError(message, out) from exc
            output = proc.stdout + proc.stderr
            if proc.returncode == 0 and csv_path.exists():
                break
            if UNSTABLE_MARK in output and on_unstable == "rerun" and attempt == 0:
                stable = False
                trials, stability = 3, 1000
                continue
            raise PerfAnalyzerError(
                f"perf_analyzer exited {proc.returncode}: {' '.join(cmd)}\n{_brief(output)}",
                output,
            )
        rows = parse_csv(csv_path.read_text())
    if not rows:
        raise PerfAnalyzerError(f"perf_analyzer wrote an empty CSV: {' '.join(cmd)}", output)
    result: dict[str, Any] = {
        "model": model,
        "protocol": protocol,
        "batch_size": batch_size,
        "stable": stable,
        "shared_memory": shared_memory,
    }
    result.update(rows[-1])
    result["command"] = " ".join(cmd)
    return result


def run_sweep(
    model: str,
    url: str,
    protocol: str,
    concurrencies: Sequence[int],
    input_data: Path | str | None = None,
    extra_args: Sequence[str] = (),
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """run_perf_analyzer at each concurrency (separate processes, so an unstable level is
    retried alone). kwargs are run_perf_analyzer's keyword options."""
    pa = find_perf_analyzer()
    return [
        run_perf_analyzer(
            model,
            url,
            protocol,
            c,
            input_data,
            extra_args,
            perf_analyzer=pa,
            **kwargs,
        )
        for c in concurrencies
    ]
