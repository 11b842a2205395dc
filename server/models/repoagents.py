"""The repository agents a model config names (`model_repository_agents`), run at load.

Triton loads each agent as a library (`libtritonrepoagent_<name>.so` under
`--repoagent-directory`) and runs it on the model folder before the model is read; an
agent that fails, or is not found, fails the model. ge-serve loads no agent libraries: it
has the `checksum` agent built in and fails the load for any other name, so a config that
asks for a check is never served without it.

`checksum` follows Triton's checksum_repository_agent: each parameter's key is
`<algorithm>:<path relative to the model folder>` (the algorithm read without case, MD5
the only one) and its value the expected digest, lower-case hex as `md5sum` prints it,
compared exactly. A file that does not match fails the load with Triton's words. The path
must stay inside the model folder, as every path a config names (backends/paths.py).

`run_agents` blocks (it reads and hashes files): the load calls it on its load thread,
before anything else in the folder is read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from ge_serve.backends.paths import OutsideFolder, resolve_inside
from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError

# Read in pieces so a large model file is hashed without holding it in memory.
_CHUNK = 1 << 20


def run_agents(config: model_config_pb2.ModelConfig, model_dir: Path) -> None:
    """Run each agent `config` names, in order, on `model_dir`; the first failure raises
    ServerError with its reason (the load's reason)."""
    for agent in config.model_repository_agents.agents:
        run = BUILT_IN.get(agent.name)
        if run is None:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"unable to find 'libtritonrepoagent_{agent.name}.so' for repo agent "
                f"'{agent.name}', searched: ge-serve's built-in agents "
                f"({', '.join(sorted(BUILT_IN))}); agent libraries are not loaded",
            )
        run(dict(agent.parameters), model_dir)


def checksum(parameters: dict[str, str], model_dir: Path) -> None:
    """Triton's checksum agent: each `MD5:<file>` must hash to its value."""
    # Triton takes the parameters in the config's map order, which text format does not
    # keep; sorted, the first failure named is the same on every load.
    for key, expected in sorted(parameters.items()):
        algorithm, colon, relative = key.partition(":")
        if not colon:
            raise ServerError(ErrorCode.INVALID_ARG, f"failed to parse key: {key}")
        if algorithm.lower() != "md5":
            raise ServerError(ErrorCode.UNSUPPORTED, f"Unsupported checksum algorithm: {algorithm}")
        try:
            path = resolve_inside(model_dir, relative, f"checksum agent parameter {key!r}")
        except OutsideFolder as exc:
            raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None
        got = _md5(path, relative)
        if got != expected:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"Mismatched MD5 hash for file {relative}, expect: {expected}, got: {got}",
            )


def _md5(path: Path, relative: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"failed to open text file for read {relative}: {exc.strerror}",
        ) from None
    return digest.hexdigest()


# The agents ge-serve has, by the name a config gives.
BUILT_IN: Final[Mapping[str, Callable[[dict[str, str], Path], None]]] = {"checksum": checksum}
