#!/usr/bin/env bash
# The whole test suite on a fresh machine: install ge-serve with its test extra, then run
# pytest. pytest's exit code 5 (no tests collected) is a failure here, as it should be.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
# perf_analyzer drives the server in a few end-to-end tests. Its binary ships in
# tritonclient's manylinux wheel and needs libb64 and libcudart; the script fetches and
# caches them. Best effort: without it those tests skip and say why.
bash bench/setup_perf_analyzer.sh >/dev/null \
    || echo "tools/test.sh: perf_analyzer could not be set up; its tests will be skipped"
python3 -m pytest -q "$@"
