"""The soak's command line: plan the run, start the server, drive the load, write the report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Final

from bench.lib.server import REPO_ROOT, ServerProcess

from .report import SoakReport, markdown, verdict
from .traffic import Plan, make_repository, run_soak, start_soak_server, wait_ready

EXAMPLE_MODELS: Final = REPO_ROOT / "examples" / "models"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench run soak",
        description="Soak ge-serve: mixed valid and invalid HTTP and gRPC traffic with hot "
        "reloads; reports failed valid requests, p99 and RSS growth.",
    )
    add = parser.add_argument
    add("--minutes", type=float, default=10.0, help="how long the load runs (default 10)")
    add("--http-clients", type=int, default=32)
    add("--grpc-clients", type=int, default=32)
    add("--think-ms", type=float, default=100.0, help="mean pause between a client's requests")
    add("--invalid-fraction", type=float, default=0.1)
    add(
        "--reload-every",
        type=float,
        default=None,
        metavar="S",
        help="seconds between reloads of simple (30, or a quarter of a shorter run)",
    )
    add("--rss-every", type=float, default=2.0, metavar="S")
    add("--max-rss-growth", type=float, default=5.0, metavar="PCT")
    add("--request-timeout", type=float, default=30.0, metavar="S")
    add("--seed", type=int, default=0)
    add("--models", type=Path, default=EXAMPLE_MODELS, help="where simple and simple_string are")
    add("--server-arg", action="append", default=[], help="extra ge-serve flag (repeatable)")
    add("--json", type=Path, default=None, metavar="OUT", help="write the report as JSON")
    add("--md", type=Path, default=None, metavar="OUT", help="write the report as markdown")
    add("--log", type=Path, default=None, metavar="OUT", help="keep the server log here")
    add(
        "--out",
        type=Path,
        default=None,
        metavar="PREFIX",
        help="write PREFIX.md and PREFIX.json, as the other suites do",
    )
    return parser


def plan_from(args: argparse.Namespace) -> Plan:
    duration = 60.0 * args.minutes
    reload_every = args.reload_every if args.reload_every else min(30.0, duration / 4)
    return Plan(
        duration_s=duration,
        http_clients=args.http_clients,
        grpc_clients=args.grpc_clients,
        think_s=args.think_ms / 1000.0,
        invalid_fraction=args.invalid_fraction,
        reload_every_s=reload_every,
        rss_every_s=args.rss_every,
        request_timeout_s=args.request_timeout,
        seed=args.seed,
    )


def _count_log(log: str, needle: str) -> int:
    return sum(needle in line for line in log.splitlines())


def retired_by_reloads(log: str) -> int:
    """Old `simple` versions the reloads retired: unloads logged before shutdown began."""
    before_stop = log.split("signal received", 1)[0]
    return _count_log(before_stop, "successfully unloaded 'simple' version")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = plan_from(args)

    async def soak(server: ServerProcess) -> SoakReport:
        await wait_ready(server, 120.0)
        return await run_soak(server, plan)

    with tempfile.TemporaryDirectory(prefix="ge-serve-soak-") as tmp:
        repo = make_repository(args.models, Path(tmp) / "models")
        server = start_soak_server(repo, args.server_arg)
        try:
            report = asyncio.run(soak(server))
        except (RuntimeError, TimeoutError) as exc:
            print(f"soak: {exc}", file=sys.stderr)
            return 2
        finally:
            code = server.stop()
            log = server.log()
            shutil.rmtree(server.log_path.parent, ignore_errors=True)
            if args.log is not None:
                args.log.parent.mkdir(parents=True, exist_ok=True)
                args.log.write_text(log)
    report = dataclasses.replace(
        report,
        server_exit_code=code,
        server_tracebacks=_count_log(log, "Traceback"),
        retired_versions=retired_by_reloads(log),
    )
    problems = verdict(report, args.max_rss_growth)
    text = markdown(report, problems)
    if args.out is not None:
        args.json = args.json or args.out.with_name(args.out.name + ".json")
        args.md = args.md or args.out.with_name(args.out.name + ".md")
    print(text, end="")
    if args.json is not None:
        document = {**report.to_json(), "problems": problems, "passed": not problems}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.md is not None:
        args.md.write_text(text)
    if report.server_tracebacks or problems:
        print("\nThe end of the server log:\n" + log[-4000:], file=sys.stderr)
    return 1 if problems else 0
