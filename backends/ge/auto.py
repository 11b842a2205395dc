"""Choosing the ACL shim implementation: `--device auto|npu|sim`.

`auto` takes real pyACL when `import acl` works and it reports at least one device, and the
simulated device otherwise; the choice and its reason are returned for the log.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .acl import AclRuntime
from .acl_real import AclReal
from .acl_sim import SimRuntime
from .compile import AtcCompiler
from .sim_cost import SimCost


class DeviceUnavailable(RuntimeError):
    """The device runtime asked for cannot start (no usable NPU for `--device npu`, or
    simulated devices that cannot exist)."""


@dataclass(frozen=True, slots=True)
class RuntimeChoice:
    runtime: AclRuntime
    reason: str


def _import_acl() -> ModuleType:
    return importlib.import_module("acl")


def select_runtime(
    device: str,
    sim_devices: int = 1,
    sim_memory: int = 16 * 1024**3,
    atc_cache_dir: str = "",
    import_acl: Callable[[], ModuleType] = _import_acl,
    sim_cost: SimCost | None = None,
    sim_perturb: float = 0.0,
) -> RuntimeChoice:
    """The runtime for `device`; `sim_cost` models the simulated NPU's timing (a real NPU
    ignores it, and says so in the reason)."""

    def sim() -> SimRuntime:
        return SimRuntime(sim_devices, sim_memory, cost=sim_cost, perturb=sim_perturb)

    if device not in ("auto", "npu", "sim"):
        raise DeviceUnavailable(f"--device must be auto, npu or sim, not '{device}'")
    if sim_devices < 1:
        raise DeviceUnavailable(f"--sim-devices must be at least 1, not {sim_devices}")
    if sim_memory < 1:
        raise DeviceUnavailable(f"--sim-device-memory must be positive, not {sim_memory}")
    if device == "sim":
        return RuntimeChoice(sim(), "--device sim")
    try:
        acl = import_acl()
    except ImportError as exc:
        if device == "npu":
            raise DeviceUnavailable(
                f"--device npu: pyACL cannot be imported ({exc}); install CANN and source "
                "/usr/local/Ascend/ascend-toolkit/set_env.sh, or use --device sim"
            ) from None
        return RuntimeChoice(
            sim(),
            f"--device auto: pyACL is not available (import acl: {exc})",
        )
    compiler = AtcCompiler(Path(atc_cache_dir) if atc_cache_dir else None)
    real: AclReal | None = None
    try:
        real = AclReal(acl, compiler)
        count = real.device_count()
    except Exception as exc:
        if real is not None:
            with contextlib.suppress(Exception):
                real.shutdown()
        if device == "npu":
            raise DeviceUnavailable(f"--device npu: pyACL failed to start: {exc}") from None
        return RuntimeChoice(
            sim(),
            f"--device auto: pyACL is installed but failed to start ({exc})",
        )
    if count < 1:
        real.shutdown()
        if device == "npu":
            raise DeviceUnavailable("--device npu: pyACL reports no NPU device")
        return RuntimeChoice(
            sim(),
            "--device auto: pyACL is installed but reports no NPU device",
        )
    reason = f"--device {device}: pyACL reports {count} NPU device(s)"
    if sim_cost is not None:
        reason += " (--sim-cost applies to the simulated NPU only and is ignored)"
    return RuntimeChoice(real, reason)
