#!/usr/bin/env bash
# Make .pyroot/ge_serve/{server,scheduler,backends,link,protos} as links to this checkout's
# folders and print the path. `PYTHONPATH=$(tools/pyroot.sh)` then imports ge_serve from
# this checkout (e.g. a git worktree) ahead of any editable install elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .pyroot/ge_serve
for d in server scheduler backends link protos; do ln -sfn "../../$d" ".pyroot/ge_serve/$d"; done
echo "$PWD/.pyroot"
