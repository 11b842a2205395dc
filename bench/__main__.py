"""`python -m bench list` and `python -m bench run SUITE [options]`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench.suites import SUITES, SuiteMissing, entry, find

USAGE = """python -m bench list
       python -m bench run SUITE [options]    (python -m bench run SUITE --help)"""


def list_suites() -> str:
    width = max(len(s.name) for s in SUITES)
    return "\n".join(f"{s.name:<{width}}  {s.summary}" for s in SUITES)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        usage=USAGE,
        description="ge-serve's benchmark suites.",
        epilog="suites:\n" + list_suites(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["list", "run"])
    if not args or args[0] not in ("list", "run"):
        parser.parse_args(args)  # prints usage (or help) and exits
        return 2
    if args[0] == "list":
        parser.parse_args(args)
        print(list_suites())
        return 0
    if len(args) < 2 or args[1].startswith("-"):
        parser.error("run needs a suite: " + ", ".join(s.name for s in SUITES))
    try:
        suite = find(args[1])
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    try:
        suite_main = entry(suite)
    except SuiteMissing as exc:
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 2
    return suite_main(args[2:])


if __name__ == "__main__":
    raise SystemExit(main())
