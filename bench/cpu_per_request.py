"""The server's CPU time per request, per protocol, from one closed-loop client.

Throughput on a shared 2-core machine swings by 2x within minutes, but the CPU time a
server spends on a request moves far less: this starts ge-serve on `simple` (INT32
[-1,16] x2, dynamic batching with no delay, as the peer comparison serves it), sends a
fixed number of requests from one client at concurrency 1 (or more), and reads the
server's CPU time from /proc before and after: the sum over its threads
(`/proc/PID/task/*/schedstat`, in ns), and each thread name's share. The protocols run in
rounds (ABCABC...) and each figure is the median over rounds.

    python -m bench run cpu-threads                      # grpc, http, json; 3 rounds
    python -m bench run cpu-threads --protocols grpc --requests 2000 --rounds 5
    python -m bench run cpu-threads --flags "--adaptive-batching true" --concurrency 4
    python -m bench run cpu-threads --against /tmp/base   # and another checkout's code
    python -m bench run cpu-threads --against . --flags "--grpc-workers 1" --against-flags ""

With `--against ROOT` a second server runs the checkout at ROOT (its `tools/pyroot.sh`),
with the same flags, up at the same time; each round measures both, one after the other,
so the ratio between them is taken in the same minutes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench.lib.models import Batching, make_repo
from bench.lib.server import ServerProcess, serve

PROTOCOLS = ("grpc", "http", "json")


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time so far per thread name, summed over the process and its children (the
    front-end workers, when there are any)."""
    totals: dict[str, int] = defaultdict(int)
    for proc in [pid, *_children(pid)]:
        task_dir = Path(f"/proc/{proc}/task")
        try:
            tasks = list(task_dir.iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                name = (task / "comm").read_text().strip()
                ran = int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            if task.name == str(proc):
                name = "main"  # the event loop's thread
            prefix = "" if proc == pid else "worker:"
            totals[prefix + _family(name)] += ran
    return dict(totals)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            found.extend(int(child) for child in text)
    except FileNotFoundError:
        return found
    for child in list(found):
        found.extend(_children(child))
    return found


def _family(name: str) -> str:
    """Thread names without their numbers, so that pools read as one line."""
    return name.rstrip("0123456789_-") or name


def _grpc_client(server: ServerProcess) -> Callable[[], None]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = _triton_inputs(grpcclient)
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]
    return lambda: _check(client.infer("simple", inputs, outputs=outputs).as_numpy("OUTPUT0"))


def _http_client(server: ServerProcess) -> Callable[[], None]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    inputs = _triton_inputs(httpclient)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
    ]
    return lambda: _check(client.infer("simple", inputs, outputs=outputs).as_numpy("OUTPUT0"))


def _json_client(server: ServerProcess) -> Callable[[], None]:
    values = list(range(16))
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": values}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port)
    headers = {"Content-Type": "application/json"}

    def call() -> None:
        conn.request("POST", "/v2/models/simple/infer", body, headers)
        answer = conn.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}: {data[:200]!r}")

    return call


def _triton_inputs(module: object) -> list[object]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    made = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(a)
        made.append(tensor)
    return made


def _check(out: object) -> None:
    if out is None:
        raise RuntimeError("no OUTPUT0 in the response")


CLIENTS = {"grpc": _grpc_client, "http": _http_client, "json": _json_client}


def drive(server: ServerProcess, protocol: str, requests: int, concurrency: int) -> None:
    """`requests` requests in total from `concurrency` closed-loop clients."""
    calls = [CLIENTS[protocol](server) for _ in range(concurrency)]
    share = requests // concurrency
    errors: list[BaseException] = []

    def loop(call: Callable[[], None]) -> None:
        try:
            for _ in range(share):
                call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def measure(
    server: ServerProcess,
    protocol: str,
    requests: int,
    concurrency: int,
    profile: Path | None = None,
) -> tuple[float, dict[str, float]]:
    """Server CPU µs per request, in total and per thread family (and "req/s", the rate
    the client saw); `profile`: record the
    server with py-spy meanwhile (raw collapsed stacks, one line per stack)."""
    drive(server, protocol, max(requests // 10, concurrency), concurrency)  # warm up
    pid = server.process.pid
    spy = None
    if profile is not None:
        command = ["py-spy", "record", "-p", str(pid), "-f", "raw", "-r", "250", "-t"]
        if os.environ.get("PY_SPY_NATIVE"):
            command.append("--native")
        spy = subprocess.Popen([*command, "-s", "-o", str(profile)], stdout=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches before the requests start
    before = thread_cpu_ns(pid)
    started = time.monotonic()
    drive(server, protocol, requests, concurrency)
    elapsed = time.monotonic() - started
    after = thread_cpu_ns(pid)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    count = (requests // concurrency) * concurrency
    per = {k: (after[k] - before.get(k, 0)) / count / 1000 for k in after}
    per["req/s"] = count / elapsed
    return sum(v for k, v in per.items() if k != "req/s"), per


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench run cpu-threads")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--flags", default="", help="extra ge-serve flags, one string")
    parser.add_argument("--against", type=Path, metavar="ROOT", help="also measure this checkout")
    parser.add_argument(
        "--against-flags", help="the flags of the --against server (default: --flags)"
    )
    parser.add_argument("--json", type=Path, help="write the medians here")
    parser.add_argument(
        "--py-spy", type=Path, metavar="PREFIX", help="first profile into PREFIX_PROTOCOL.txt"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cpu-per-request-") as tmp, ExitStack() as stack:
        repo = make_repo(Path(tmp) / "repo", "simple", batching=Batching())
        flags = ["--log-verbose", "0", *shlex.split(args.flags)]
        servers = {"this": stack.enter_context(serve(repo, flags))}
        if args.against is not None:
            root = subprocess.run(
                ["bash", str(args.against / "tools" / "pyroot.sh")],
                check=True, capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
            env = {"PYTHONPATH": root}
            other = flags
            if args.against_flags is not None:
                other = ["--log-verbose", "0", *shlex.split(args.against_flags)]
            servers["against"] = stack.enter_context(serve(repo, other, env=env))
        totals: dict[tuple[str, str], list[float]] = defaultdict(list)
        threads: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        if args.py_spy is not None:  # a pass of its own: py-spy's sampling costs time
            for protocol in args.protocols:
                profile = Path(f"{args.py_spy}_{protocol}.txt")
                measure(servers["this"], protocol, args.requests, args.concurrency, profile)
        for round_index in range(args.rounds):
            order = list(servers.items())
            if round_index % 2:
                order.reverse()  # ABBA: neither is always measured first
            for protocol in args.protocols:
                for label, server in order:
                    total, per = measure(server, protocol, args.requests, args.concurrency)
                    totals[label, protocol].append(total)
                    for name, value in per.items():
                        threads[label, protocol][name].append(value)
    rows: dict[str, dict[str, object]] = {}
    print(f"server CPU µs per request (median of {args.rounds}), c={args.concurrency}")
    for protocol in args.protocols:
        for label in servers:
            values = totals[label, protocol]
            median = statistics.median(values)
            parts = {
                name: statistics.median(v)
                for name, v in threads[label, protocol].items()
                if statistics.median(v) >= 1.0
            }
            rows[f"{label}/{protocol}"] = {"total_us": median, "threads_us": parts}
            rate = parts.pop("req/s")
            detail = ", ".join(
                f"{n} {v:.0f}" for n, v in sorted(parts.items(), key=lambda i: -i[1])
            )
            detail += f"; {rate:.0f} req/s"
            spread = f"{min(values):.0f}-{max(values):.0f}"
            print(f"  {protocol:<5} {label:<8} {median:6.0f}  ({spread})  {detail}")
        if "against" in servers:
            ratios = [
                a / b
                for a, b in zip(totals["this", protocol], totals["against", protocol], strict=True)
            ]
            print(
                f"  {protocol:<5} this÷against {statistics.median(ratios):.2f} (median of rounds)"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
