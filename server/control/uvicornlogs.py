"""vLLM's uvicorn log flags, applied to the uvicorn that serves every HTTP listener here:
`--uvicorn-log-level`, `--disable-uvicorn-access-log` and
`--disable-access-log-for-endpoints` (read by server/startup/vllmserve.py).

uvicorn is told nothing of logging (http/embedded.py's `front_end_config`): its loggers
are set here, once per process, and their lines go to the server's own log handler
(logsettings.py), in Triton's format, to `--log-file` where one is set, and follow the
logging extension's settings (`log_info`...). The level is that of uvicorn's loggers, as
vLLM's flag sets it; ge-serve's default is `warning` (vLLM's: `info`), so uvicorn says
only what goes wrong, as before.

The access log is uvicorn's, one line per answer at `info`, as vLLM's: on where the level
is `info` or lower (so never by default: Triton's HTTP server has none) and
`--disable-uvicorn-access-log` is not given, without the paths
`--disable-access-log-for-endpoints` names (compared without the query, exactly). Off,
the access logger has no handler, so uvicorn's connections never build a line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

# vLLM's choices, least to most said, and the logging levels they are (uvicorn's TRACE).
LEVELS: Final = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": 5,
}
# The loggers uvicorn's own --log-level sets.
_LOGGERS: Final = ("uvicorn.error", "uvicorn.access", "uvicorn.asgi")
_ACCESS: Final = "uvicorn.access"


@dataclass(frozen=True, slots=True)
class UvicornLogs:
    level: str = "warning"
    # False: --disable-uvicorn-access-log.
    access_log: bool = True
    # --disable-access-log-for-endpoints: paths whose answers get no access line.
    excluded: tuple[str, ...] = ()

    @property
    def access(self) -> bool:
        """Whether the access log is on."""
        return self.access_log and LEVELS[self.level] <= logging.INFO

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "access_log": self.access_log, "excluded": self.excluded}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UvicornLogs:
        return cls(str(data["level"]), bool(data["access_log"]), tuple(data["excluded"]))


class _Excluded(logging.Filter):
    """Drops the access lines of some paths: uvicorn's line has the path (and query) as
    its third argument."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        super().__init__()
        self.paths = frozenset(paths)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].partition("?")[0] not in self.paths
        return True


def install(logs: UvicornLogs, access: bool = True) -> None:
    """Set uvicorn's loggers as `logs` says, before its servers start (uvicorn decides per
    connection whether it writes access lines); `access` false: this process writes none
    (the server's, whose HTTP workers write them)."""
    logging.addLevelName(LEVELS["trace"], "TRACE")
    # uvicorn's own handlers, were they ever set (its default log config): none.
    root = logging.getLogger("uvicorn")
    root.handlers, root.propagate = [], True
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(LEVELS[logs.level])
    logger = logging.getLogger(_ACCESS)
    # Without a handler of its own or a parent's, uvicorn's connections skip the line.
    logger.handlers, logger.propagate = [], access and logs.access
    for found in [f for f in logger.filters if isinstance(f, _Excluded)]:
        logger.removeFilter(found)
    if logs.excluded:
        logger.addFilter(_Excluded(logs.excluded))
