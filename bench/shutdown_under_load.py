"""SIGTERM under load: a stopping ge-serve answers every request it took in, and refuses the
rest in a way a client can retry.

    export PYTHONPATH=$(tools/pyroot.sh)
    python -m bench run shutdown [--json OUT]      # or: python3 bench/shutdown_under_load.py

Starts ge-serve (`python -m ge_serve.server.cli --model-repository examples/models`) on free
loopback ports. 4 HTTP clients (httpx) and 4 gRPC clients (tritonclient.grpc, sync) call
`simple` back to back; after `--load-s` seconds the server gets SIGTERM, and the clients go
on until it has exited. Every call ends as one of:

- completed: answered, with the right outputs (`answered after SIGTERM`: those of them
  still in flight at the signal, or sent after it);
- refused: gRPC UNAVAILABLE, HTTP 503, or a connection the server did not accept; the
  request never ran, so the client may send it again (here or elsewhere);
- cancelled: gRPC CANCELLED, which a client cannot tell from a real cancellation;
- disconnected: an HTTP connection closed with no answer, which leaves the client unsure
  whether the request ran;
- other: anything else (a wrong answer, another status).

`--on-refused stop` (the default) has a refused client stop sending, as one behind a
balancer sends elsewhere; `--on-refused retry` has it back off `--backoff-s` and send again,
here, until the server is gone. Such a client keeps the server lingering to its bound (see
server/control/stopping.py), and a call it sends as the gRPC connections finally close can still end
CANCELLED: grpc core ends so a call that no handler has picked up yet.
Exit status 0 when nothing was cancelled, disconnected or other and the server exited 0.
Bounded: the server is killed if it has not exited `--exit-timeout-secs` + 15 s after the
signal. Imports nothing from its bench/ siblings; the server starts through the tests'
launcher (tests/serverproc.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parent.parent
# The server starts as the tests start it (tests/serverproc.py); tests/ is not a package,
# so it goes on the path, as pytest puts it there.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))

from serverproc import start_server, wait_for  # noqa: E402

PROG = "python -m bench run shutdown"
OUTCOMES = ("completed", "refused", "cancelled", "disconnected", "other")
# Log lines that mean the exit was not clean.
BAD_LOG_MARKS = ("Traceback", "exiting without waiting", "_poll_wrapper", "grpc-aio-poller")


@dataclass
class Tally:
    """One client's outcomes; only its own thread writes to it."""

    protocol: str
    counts: Counter[str] = field(default_factory=Counter)
    answered_after_signal: int = 0
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        if detail and outcome != "completed":
            self.examples.setdefault(outcome, detail[:160])


@dataclass
class Run:
    signalled: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    signal_at: float = 0.0


def sample(seed: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, (1, 16), dtype=np.int32)
    b = rng.integers(0, 100, (1, 16), dtype=np.int32)
    return a, b


def http_client(url: str, index: int, run: Run, args: argparse.Namespace, tally: Tally) -> None:
    a, b = sample(index)
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()},
        ]
    }
    expected = (a + b).ravel().tolist()
    with httpx.Client(base_url=url, timeout=args.exit_timeout_secs + 10) as client:

        def call() -> tuple[str, str]:
            try:
                response = client.post("/v2/models/simple/infer", json=body)
            except httpx.ConnectError as exc:
                return "refused", f"connect: {exc}"
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                return "disconnected", f"{type(exc).__name__}: {exc}"
            except httpx.HTTPError as exc:
                return "other", f"{type(exc).__name__}: {exc}"
            if response.status_code == 503:
                return "refused", response.text
            if response.status_code != 200:
                return "other", f"{response.status_code}: {response.text}"
            outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
            if outputs.get("OUTPUT0") != expected:
                return "other", "wrong OUTPUT0"
            return "completed", ""

        loop(call, run, args, tally)


def grpc_client(url: str, index: int, run: Run, args: argparse.Namespace, tally: Tally) -> None:
    a, b = sample(100 + index)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    client = grpcclient.InferenceServerClient(url)

    def call() -> tuple[str, str]:
        try:
            result = client.infer("simple", inputs, client_timeout=args.exit_timeout_secs + 10)
        except InferenceServerException as exc:
            status = str(exc.status())
            if status == "StatusCode.UNAVAILABLE":
                return "refused", str(exc)
            if status == "StatusCode.CANCELLED":
                return "cancelled", str(exc)
            return "other", str(exc)
        if not np.array_equal(result.as_numpy("OUTPUT0"), a + b):
            return "other", "wrong OUTPUT0"
        return "completed", ""

    try:
        loop(call, run, args, tally)
    finally:
        client.close()


def loop(
    call: Callable[[], tuple[str, str]], run: Run, args: argparse.Namespace, tally: Tally
) -> None:
    """Call back to back until the server has exited (or, refused, stop or back off)."""
    while not run.exited.is_set():
        sent_after = run.signalled.is_set()
        outcome, detail = call()
        tally.add(outcome, detail)
        if outcome == "completed" and (sent_after or run.signalled.is_set()):
            tally.answered_after_signal += 1
        if outcome == "refused":
            if args.on_refused == "stop":
                return
            run.exited.wait(args.backoff_s)
        elif outcome != "completed":
            run.exited.wait(args.backoff_s)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    run = Run()
    tallies = [Tally("http") for _ in range(args.http_clients)]
    tallies += [Tally("grpc") for _ in range(args.grpc_clients)]
    flags = ["--exit-timeout-secs", str(args.exit_timeout_secs)]
    server = start_server([args.model_repository], flags, wait_ready=False)
    process = server.process
    try:
        wait_for(server, "/v2/health/ready", 60.0)
        threads = []
        for i, tally in enumerate(tallies):
            target = http_client if tally.protocol == "http" else grpc_client
            url = server.base_url if tally.protocol == "http" else server.grpc_url
            threads.append(
                threading.Thread(target=target, args=(url, i, run, args, tally), daemon=True)
            )
        for thread in threads:
            thread.start()
        time.sleep(args.load_s)
        run.signal_at = time.monotonic()
        run.signalled.set()
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(args.exit_timeout_secs + 15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            code = None
        exit_s = time.monotonic() - run.signal_at
        run.exited.set()
        for thread in threads:
            thread.join(args.exit_timeout_secs + 15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log = server.log()
        shutil.rmtree(server.log_path.parent, ignore_errors=True)
    rows = []
    for protocol in ("http", "grpc"):
        mine = [t for t in tallies if t.protocol == protocol]
        if not mine:
            continue
        counts: Counter[str] = Counter()
        examples: dict[str, str] = {}
        for tally in mine:
            counts.update(tally.counts)
            for key, value in tally.examples.items():
                examples.setdefault(key, value)
        row: dict[str, Any] = {"protocol": protocol, "clients": len(mine)}
        row.update({outcome: counts[outcome] for outcome in OUTCOMES})
        row["answered_after_sigterm"] = sum(t.answered_after_signal for t in mine)
        row["examples"] = examples
        rows.append(row)
    return {
        "rows": rows,
        "server_exit_code": code,
        "sigterm_to_exit_s": round(exit_s, 3),
        "bad_log_lines": [
            line for line in log.splitlines() if any(m in line for m in BAD_LOG_MARKS)
        ],
        "log_tail": log.splitlines()[-8:],
        "command": server.args,
        "settings": {
            "load_s": args.load_s,
            "exit_timeout_secs": args.exit_timeout_secs,
            "on_refused": args.on_refused,
            "backoff_s": args.backoff_s,
        },
    }


def table(result: dict[str, Any]) -> str:
    columns = ["protocol", "clients", *OUTCOMES, "answered_after_sigterm"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in result["rows"]:
        lines.append("| " + " | ".join(str(row[c]) for c in columns) + " |")
    lines.append("")
    lines.append(
        f"server exit code: {result['server_exit_code']}, "
        f"SIGTERM to exit: {result['sigterm_to_exit_s']} s, "
        f"clients on refusal: {result['settings']['on_refused']}"
    )
    for row in result["rows"]:
        for outcome, example in row["examples"].items():
            lines.append(f"{row['protocol']} {outcome}, e.g.: {example}")
    for line in result["bad_log_lines"]:
        lines.append(f"server log: {line}")
    return "\n".join(lines)


def clean(result: dict[str, Any]) -> bool:
    bad = sum(row[k] for row in result["rows"] for k in ("cancelled", "disconnected", "other"))
    return bad == 0 and result["server_exit_code"] == 0 and not result["bad_log_lines"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "examples" / "models")
    parser.add_argument("--http-clients", type=int, default=4)
    parser.add_argument("--grpc-clients", type=int, default=4)
    parser.add_argument("--load-s", type=float, default=3.0, help="load before the SIGTERM")
    parser.add_argument("--exit-timeout-secs", type=float, default=10.0)
    parser.add_argument("--on-refused", choices=["stop", "retry"], default="stop")
    parser.add_argument("--backoff-s", type=float, default=0.1)
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument(
        "--out", type=Path, metavar="PREFIX", help="write PREFIX.md and PREFIX.json"
    )
    args = parser.parse_args(argv)
    result = measure(args)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_name(args.out.name + ".md").write_text(table(result) + "\n")
        args.json = args.json or args.out.with_name(args.out.name + ".json")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if clean(result) else 1


if __name__ == "__main__":
    sys.exit(main())
