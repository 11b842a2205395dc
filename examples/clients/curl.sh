#!/usr/bin/env bash
# Talk to the server with plain curl: health, metadata, and a JSON inference on `simple`.
#
#   examples/clients/curl.sh --url localhost:8000
set -euo pipefail

URL="localhost:8000"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -u | --url) URL="$2"; shift 2 ;;
    --url=*) URL="${1#*=}"; shift ;;
    -h | --help) echo "usage: $0 [--url host:port]"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ "$URL" == http://* || "$URL" == https://* ]] || URL="http://$URL"
URL="${URL%/}"

echo "== health"
# Health endpoints answer 200 ({"ready": true}); -f makes curl fail on anything else.
curl -sSf -o /dev/null -w "live:  HTTP %{http_code}\n" "$URL/v2/health/live"
curl -sSf -o /dev/null -w "ready: HTTP %{http_code}\n" "$URL/v2/health/ready"
curl -sSf -o /dev/null -w "simple ready: HTTP %{http_code}\n" "$URL/v2/models/simple/ready"

echo "== server metadata"
curl -sSf "$URL/v2"; echo

echo "== model metadata"
curl -sSf "$URL/v2/models/simple"; echo

echo "== model config"
curl -sSf "$URL/v2/models/simple/config"; echo

echo "== JSON inference on simple"
curl -sSf -X POST "$URL/v2/models/simple/infer" \
  -H "Content-Type: application/json" \
  -d '{
    "id": "curl-1",
    "inputs": [
      {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
       "data": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]},
      {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
       "data": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}
    ],
    "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]
  }'
echo
