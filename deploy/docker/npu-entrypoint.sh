#!/usr/bin/env bash
# Entry point of the NPU image: load CANN's environment (pyACL, ATC, the runtime's library
# paths), then run ge-serve with the container's arguments. CANN's set_env.sh scripts set
# PATH, LD_LIBRARY_PATH, PYTHONPATH and ASCEND_* variables that `import acl` needs.
set -eo pipefail
for env in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
    # shellcheck disable=SC1090
    if [ -f "$env" ]; then source "$env"; fi
done
# The host's driver libraries, mounted at run time (see Dockerfile.npu).
export LD_LIBRARY_PATH="/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/common:/usr/local/Ascend/driver/lib64/driver:${LD_LIBRARY_PATH:-}"
exec ge-serve "$@"
