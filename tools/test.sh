#!/usr/bin/env bash
# The whole test suite on a fresh machine: install ge-serve with its test extra, then run
# pytest. pytest's exit code 5 (no tests collected) is a failure here, as it should be.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
python3 -m pytest -q "$@"
