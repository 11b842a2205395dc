#!/usr/bin/env bash
# Make perf_analyzer runnable on this machine class (Debian 12, glibc 2.36) and print how to
# run it. Idempotent: everything is cached under bench/.cache/perf_analyzer/.
#
# Why this way (see shared design bench.md): the PyPI `perf-analyzer` wheel needs glibc 2.38,
# but the manylinux1 x86_64 wheel of tritonclient 2.51.0 carries a perf_analyzer binary (at
# tritonclient-2.51.0.data/data/bin/perf_analyzer inside the wheel) that needs only glibc 2.34.
# It links libb64.so.0d (Debian: libb64-0d) and libcudart.so.12 (PyPI:
# nvidia-cuda-runtime-cu12; only loaded, no GPU is used).
# Known in this build: --warmup-request-count below the concurrency never ends (the
# warmup's concurrency is not clamped; fixed upstream in perf_analyzer's #112). Nothing
# here passes it; genai-perf users of this binary should leave it at 0 or >= concurrency.
#
# Output on success (stdout, eval-able, and nothing else on stdout):
#   PERF_ANALYZER=/abs/path/perf_analyzer
#   PERF_ANALYZER_LD_LIBRARY_PATH=/dir1:/dir2
# Progress and errors go to stderr. Exit 0 on success, 1 with a clear message otherwise.
#
# Usage: eval "$(bench/setup_perf_analyzer.sh)" && \
#        LD_LIBRARY_PATH=$PERF_ANALYZER_LD_LIBRARY_PATH $PERF_ANALYZER -m simple ...
# Env: PYTHON (default python3), TRITONCLIENT_VERSION (default 2.51.0),
#      PERF_ANALYZER_NO_INSTALL=1 to never run pip/apt-get (only use what is cached).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="$here/.cache/perf_analyzer"
python="${PYTHON:-python3}"
version="${TRITONCLIENT_VERSION:-2.51.0}"
no_install="${PERF_ANALYZER_NO_INSTALL:-0}"
binary="$cache/tritonclient-$version/perf_analyzer"

say() { echo "setup_perf_analyzer: $*" >&2; }
fail() {
    say "ERROR: $*"
    say "perf_analyzer is not available; bench scripts that need it will skip it."
    exit 1
}

mkdir -p "$cache"

# 1. The binary, from the manylinux wheel of tritonclient.
if [[ ! -x "$binary" ]]; then
    wheel="$(ls "$cache"/tritonclient-"$version"-*manylinux*x86_64*.whl 2>/dev/null | head -n1 || true)"
    if [[ -z "$wheel" ]]; then
        [[ "$no_install" == 1 ]] && fail "no cached tritonclient wheel and PERF_ANALYZER_NO_INSTALL=1"
        for platform in manylinux1_x86_64 manylinux2014_x86_64 manylinux_2_17_x86_64 \
            manylinux_2_28_x86_64 manylinux_2_34_x86_64; do
            say "downloading tritonclient==$version for $platform"
            if "$python" -m pip download --quiet --no-deps --only-binary=:all: \
                --platform "$platform" --python-version 3.11 \
                "tritonclient==$version" -d "$cache" >&2; then
                wheel="$(ls "$cache"/tritonclient-"$version"-*manylinux*x86_64*.whl 2>/dev/null | head -n1 || true)"
                [[ -n "$wheel" ]] && break
            fi
        done
        [[ -n "$wheel" ]] || fail "could not download a manylinux x86_64 wheel of tritonclient==$version"
    fi
    member="$("$python" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
hits = [n for n in names if n.endswith("/bin/perf_analyzer")]
print(hits[0] if hits else "")
EOF
)"
    [[ -n "$member" ]] || fail "wheel $wheel has no bin/perf_analyzer"
    say "extracting $member"
    "$python" - "$wheel" "$member" "$binary" <<'EOF'
import os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
os.makedirs(os.path.dirname(dest), exist_ok=True)
tmp = dest + ".tmp"
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
EOF
fi

# 2. libb64.so.0d from Debian's libb64-0d.
find_b64() {
    ldconfig -p 2>/dev/null | awk '/libb64\.so\.0d/ {print $NF; exit}'
}
b64="$(find_b64 || true)"
if [[ -z "$b64" ]]; then
    for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib; do
        [[ -e "$d/libb64.so.0d" ]] && b64="$d/libb64.so.0d" && break
    done
fi
if [[ -z "$b64" ]]; then
    [[ "$no_install" == 1 ]] && fail "libb64.so.0d missing (apt-get install -y libb64-0d)"
    command -v apt-get >/dev/null || fail "libb64.so.0d missing and no apt-get to install libb64-0d"
    say "installing libb64-0d"
    if ! apt-get install -y -q libb64-0d >&2; then
        apt-get update -q >&2 || true
        apt-get install -y -q libb64-0d >&2 || fail "apt-get install libb64-0d failed"
    fi
    b64="$(find_b64 || true)"
    [[ -n "$b64" ]] || b64=/usr/lib/x86_64-linux-gnu/libb64.so.0d
    [[ -e "$b64" ]] || fail "libb64-0d installed but libb64.so.0d not found"
fi
b64_dir="$(dirname "$b64")"

# 3. libcudart.so.12 from nvidia-cuda-runtime-cu12.
cudart_dir() {
    "$python" - <<'EOF'
import os
try:
    import nvidia.cuda_runtime as m
except ImportError:
    raise SystemExit(0)
for base in m.__path__:
    lib = os.path.join(base, "lib")
    if os.path.exists(os.path.join(lib, "libcudart.so.12")):
        print(lib)
        break
EOF
}
cuda_dir="$(cudart_dir)"
if [[ -z "$cuda_dir" ]]; then
    [[ "$no_install" == 1 ]] && fail "libcudart.so.12 missing (pip install nvidia-cuda-runtime-cu12)"
    say "installing nvidia-cuda-runtime-cu12"
    "$python" -m pip install --quiet "nvidia-cuda-runtime-cu12" >&2 \
        || fail "pip install nvidia-cuda-runtime-cu12 failed"
    cuda_dir="$(cudart_dir)"
    [[ -n "$cuda_dir" ]] || fail "nvidia-cuda-runtime-cu12 has no lib/libcudart.so.12"
fi

ld_path="$cuda_dir:$b64_dir"

# 4. Prove it runs (cheap: --version prints and exits).
if ! out="$(LD_LIBRARY_PATH="$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$binary" --version 2>&1)"; then
    fail "perf_analyzer does not start: $out"
fi
say "ok: $(echo "$out" | head -n1)"

echo "PERF_ANALYZER=$binary"
echo "PERF_ANALYZER_LD_LIBRARY_PATH=$ld_path"
