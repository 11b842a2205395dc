"""What an ensemble step costs: a two-step ensemble of identity models against one identity
model, on one ge-serve process.

The repository holds `ident` and `ident2` (FP32 [-1, 4] identities, one CPU slot each) and
`pipe`, an ensemble that runs `ident` then `ident2`. One sync tritonclient (concurrency 1)
sends small requests ([1, 4]) to `ident` and to `pipe` in alternating windows (ABBA
order over rounds, so drift on a shared machine falls on both). For each window it takes
the server's own statistics before and after, so the figures are server time:

- `single`: `ident`'s success time per request: one model, called directly;
- `ensemble`: `pipe`'s success time per request, and that divided by its 2 steps, the
  acceptance figure (each step under 100 us of server time for small tensors);
- `steps`: the composing models' own success time per ensemble request, so that
  `ensemble - steps` is what the ensemble adds around its steps; per step, that is the
  overhead of the ensemble machinery itself;
- client latency per request for both, and its difference: what a second model costs a
  client end to end when it is chained inside the server rather than called again.

Figures are medians over rounds, and the ratios (ensemble ÷ one model, server and client)
come from the same run. Both models are measured on one server, in alternating windows,
not time-shared by freezing (bench/lib/timeshare.py): a server frozen with a request in
flight counts the frozen time in that request's server time, which at concurrency 1 is
most of a slice's. Run it from the repository root:

    export PYTHONPATH=$(tools/pyroot.sh)
    python -m bench run ensemble-overhead      # ~15 s (or: python3 bench/ensemble_overhead.py)
    python -m bench run ensemble-overhead --rounds 20 --out bench/results/ensemble_overhead

`--out PREFIX` writes PREFIX.md (the report and the command) and PREFIX.json, as the other
suites do; `--json OUT.json` writes the JSON alone.

The server starts on free loopback ports (tests/serverproc.py, the tests' launcher) over a
repository written to a temporary folder (tests/ensemblerepo.py's models); it imports
nothing from its bench/ siblings, so it runs as a plain script too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
# tests/ is not a package: put it on the path to share its launcher and model builders.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))

from ensemblerepo import ensemble_config, step, write_ensemble, write_ident  # noqa: E402
from serverproc import ServerProcess, running_server  # noqa: E402

PROG = "python -m bench run ensemble-overhead"

STEPS = 2
LIMIT_US = 100.0
COMPOSING = ("ident", "ident2")


def write_repo(repo: Path) -> Path:
    write_ident(repo, "ident")
    write_ident(repo, "ident2")
    steps = [
        step("ident", {"INPUT": "IN"}, {"OUTPUT": "mid"}),
        step("ident2", {"INPUT": "mid"}, {"OUTPUT": "OUT"}),
    ]
    write_ensemble(repo, "pipe", ensemble_config("pipe", steps))
    return repo


class Client:
    """One sync tritonclient, and the server's success statistics of a model."""

    def __init__(self, protocol: str, srv: ServerProcess) -> None:
        self.protocol = protocol
        module: Any = httpclient if protocol == "http" else grpcclient
        url = srv.http_url if protocol == "http" else srv.grpc_url
        self.client = module.InferenceServerClient(url)
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        self.inputs = {}
        for model, name in (("ident", "INPUT"), ("pipe", "IN")):
            tensor = module.InferInput(name, [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            self.inputs[model] = [tensor]

    def infer(self, model: str) -> None:
        self.client.infer(model, self.inputs[model])

    def success(self, model: str) -> tuple[int, int]:
        """(count, ns) of the model's successful requests so far."""
        if self.protocol == "http":
            found = self.client.get_inference_statistics(model)
        else:
            found = self.client.get_inference_statistics(model, as_json=True)
        success = found["model_stats"][0]["inference_stats"]["success"]
        return int(success.get("count", 0)), int(success.get("ns", 0))

    def close(self) -> None:
        self.client.close()


def window(client: Client, model: str, seconds: float) -> dict[str, float]:
    """Requests to `model` for `seconds`; client and server time per request, in us."""
    watched = [model, *COMPOSING] if model == "pipe" else [model]
    before = {name: client.success(name) for name in watched}
    sent = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        client.infer(model)
        sent += 1
    elapsed = time.perf_counter() - started
    after = {name: client.success(name) for name in watched}
    server = {name: (after[name][1] - before[name][1]) / 1e3 / sent for name in watched}
    row = {"requests": float(sent), "client_us": elapsed * 1e6 / sent, "server_us": server[model]}
    if model == "pipe":
        row["steps_us"] = sum(server[name] for name in COMPOSING)
    return row


def measure(protocol: str, rounds: int, seconds: float, warmup: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ge-serve-ensemble-bench-") as tmp:
        repo = write_repo(Path(tmp) / "repo")
        with running_server([repo]) as srv:
            client = Client(protocol, srv)
            try:
                for _ in range(warmup):
                    client.infer("ident")
                    client.infer("pipe")
                rows: dict[str, list[dict[str, float]]] = {"ident": [], "pipe": []}
                for index in range(rounds):
                    order = ("ident", "pipe") if index % 2 == 0 else ("pipe", "ident")
                    for model in order:
                        rows[model].append(window(client, model, seconds))
            finally:
                client.close()
    return summarise(protocol, rows)


def summarise(protocol: str, rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    def median(model: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[model])

    ensemble = median("pipe", "server_us")
    steps = median("pipe", "steps_us")
    return {
        "protocol": protocol,
        "rounds": len(rows["pipe"]),
        "single_server_us": median("ident", "server_us"),
        "single_client_us": median("ident", "client_us"),
        "ensemble_server_us": ensemble,
        "ensemble_client_us": median("pipe", "client_us"),
        "ensemble_server_us_per_step": ensemble / STEPS,
        "composing_server_us": steps,
        "ensemble_overhead_us_per_step": (ensemble - steps) / STEPS,
        "client_us_added_by_second_step": median("pipe", "client_us")
        - median("ident", "client_us"),
        "ensemble_over_single_server": ensemble / median("ident", "server_us"),
        "ensemble_over_single_client": median("pipe", "client_us") / median("ident", "client_us"),
        "limit_us_per_step": LIMIT_US,
        "within_limit": ensemble / STEPS < LIMIT_US,
        "windows": rows,
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"ensemble overhead ({result['protocol']}, median of {result['rounds']} rounds, us "
        "per request)",
        f"  one identity model, server:        {result['single_server_us']:8.1f}",
        f"  two-step ensemble, server:         {result['ensemble_server_us']:8.1f}",
        f"    per step:                        {result['ensemble_server_us_per_step']:8.1f}"
        f"   (limit {LIMIT_US:.0f}: {'ok' if result['within_limit'] else 'OVER'})",
        f"    its steps' own server time:      {result['composing_server_us']:8.1f}",
        f"    ensemble overhead per step:      {result['ensemble_overhead_us_per_step']:8.1f}",
        f"  client latency, one model:         {result['single_client_us']:8.1f}",
        f"  client latency, ensemble:          {result['ensemble_client_us']:8.1f}",
        f"    added by the second step:        {result['client_us_added_by_second_step']:8.1f}",
        f"  ensemble ÷ one model, server:      {result['ensemble_over_single_server']:8.2f}",
        f"  ensemble ÷ one model, client:      {result['ensemble_over_single_client']:8.2f}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="per window")
    parser.add_argument("--warmup", type=int, default=200, help="requests to each model")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument(
        "--out", type=Path, metavar="PREFIX", help="write PREFIX.md and PREFIX.json"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = measure(args.protocol, args.rounds, args.seconds, args.warmup)
    text = report(result)
    print(text)
    if args.out is not None:
        args.json = args.json or args.out.with_name(args.out.name + ".json")
        command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_name(args.out.name + ".md").write_text(
            f"```\n{text}\n```\n\n`{command}`, {time.monotonic() - started:.0f} s.\n"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
