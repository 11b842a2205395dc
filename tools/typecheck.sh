#!/usr/bin/env bash
# mypy cannot follow setuptools' editable import hook, so check the link tree that
# tools/pyroot.sh makes (ge_serve/server -> server, ...), which has the installed shape.
# bench/ is a package (bench.lib, bench.suites) run from the repository root; its
# server launcher shares tests/serverproc.py, hence tests/ on the path. The tests are code
# too: pytest's pythonpath puts tests/ on sys.path (the helpers import as top-level
# modules), so mypy gets it too; pyproject.toml excludes the vendored Triton examples.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(tools/pyroot.sh)"
(cd "$root" && python3 -m mypy --config-file ../pyproject.toml -p ge_serve "$@")
MYPYPATH="$root:$PWD/tests" python3 -m mypy --config-file pyproject.toml -p bench "$@"
MYPYPATH="$root:$PWD/tests" python3 -m mypy --config-file pyproject.toml tests "$@"
