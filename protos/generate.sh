#!/usr/bin/env bash
# Regenerate the Python modules (*_pb2.py, *_pb2_grpc.py, *_pb2.pyi) from the
# .proto files in this folder.
#
#   protos/generate.sh [OUTPUT_DIR]      (default: this folder)
#
# The .proto files are compiled under their own names ("model_config.proto",
# "grpc_service.proto", "health.proto"), exactly as Triton and tritonclient
# register them, so the serialized descriptors equal tritonclient's and both
# can be loaded in one process. protoc then writes top-level imports
# ("import model_config_pb2"); they are rewritten to the installed package,
# "from ge_serve.protos import model_config_pb2", as tritonclient does for its
# own copies. Output is deterministic for the pinned grpcio-tools version.
set -euo pipefail

GRPC_TOOLS_VERSION="1.80.1"   # keep in sync with pyproject.toml
PACKAGE="ge_serve.protos"
PROTOS=(model_config.proto grpc_service.proto health.proto)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
python="${PYTHON:-python3}"

have="$("$python" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)"
if [[ "$have" != "$GRPC_TOOLS_VERSION" ]]; then
  echo "generate.sh: need grpcio-tools==$GRPC_TOOLS_VERSION (found: ${have:-none})" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Compile from a private copy so that nothing else on disk is seen by protoc.
mkdir "$tmp/src" "$tmp/gen"
for p in "${PROTOS[@]}"; do
  cp "$here/$p" "$tmp/src/$p"
done
(
  cd "$tmp/src"
  "$python" -m grpc_tools.protoc -I. \
    --python_out=../gen --pyi_out=../gen --grpc_python_out=../gen \
    "${PROTOS[@]}"
)

# Point the cross-module imports at the package.
modules=""
for p in "${PROTOS[@]}"; do
  modules="${modules:+$modules|}${p%.proto}_pb2"
done
for f in "$tmp"/gen/*_pb2.py "$tmp"/gen/*_pb2_grpc.py "$tmp"/gen/*_pb2.pyi; do
  sed -E -i "s/^import ($modules) as /from $PACKAGE import \\1 as /" "$f"
  if grep -Eq "^import ($modules)( |$)" "$f"; then
    echo "generate.sh: unrewritten import in $(basename "$f")" >&2
    exit 1
  fi
  cp "$f" "$out/$(basename "$f")"
done
