"""Triton's rate limiter (`--rate-limit execution_count`): an instance runs only while the
resources its `instance_group.rate_limiter` names are free.

Resources are counted per device, or server-wide when the config marks them `global`.
How many of each exist is `--rate-limit-resource <name>:<count>[:<device>]`, or else the
most that any one instance asks for, as in Triton. Once any limit is given, a resource
no limit names counts as none, and a model with an instance that asks for more than its
limit fails to load (Triton's rule and message) instead of reading as ready while its
requests wait forever. A resource is global or per device, never both: a model whose
instances would use one name both ways, counting the loaded models' instances, fails to
load (Triton's ValidateMaxResources and message).

When resources come back, the pools waiting for them are served by the rank of the
instance each would run next: Triton's scaled priority, the instance's executions times
its `rate_limiter.priority` (0 counts as 1), lowest first (core rate_limiter.cc,
ScaledPriority), then priority, then oldest first. So priority is a weight, not an
order: an instance of priority 2 gets half the turns of one of priority 1, and neither
starves. A pool whose instance just gave its resources back competes for them again
when it has callers waiting, as Triton stages a released instance again (OnRelease).

The limiter is one object for the whole server, on the event loop like the pools it
steers, so its counts need no lock. Each `SlotPool` asks it whether a slot may run
(`allows`), takes and gives back the slot's resources, and waits its turn when none of
its idle slots may run.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import invalid_arg

# The device key of a global resource.
_GLOBAL = -1


def resource_limit(text: str) -> tuple[str, int, int]:
    """`name:count[:device]` as (name, count, device or -1), Triton's format."""
    parts = text.split(":")
    message = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(message)
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(message) from None
    if numbers[0] < 0:
        raise ValueError(message)
    return parts[0].lower(), numbers[0], numbers[1] if len(numbers) == 2 else _GLOBAL


@dataclass(frozen=True, slots=True)
class SlotNeeds:
    """What one instance must hold to run: {(resource, device or -1): count}."""

    resources: tuple[tuple[tuple[str, int], int], ...]
    priority: int = 1


class Waiter(Protocol):
    def serve_waiters(self) -> None:
        """Hand idle slots to the callers waiting for them, if any may run now."""

    def rank(self) -> tuple[int, int]:
        """(scaled priority, priority) of the instance it would run next; lowest first."""
        ...


def needs_of(
    config: model_config_pb2.ModelConfig, device_ids: Sequence[int]
) -> list[SlotNeeds | None]:
    """Each executor's needs, the executors taken group by group (`count` each, as the
    backends build them); None for an instance without a rate_limiter."""
    groups = list(config.instance_group)
    per_slot: list[model_config_pb2.ModelInstanceGroup | None] = []
    for group in groups:
        per_slot.extend([group] * max(group.count, 1))
    if len(per_slot) != len(device_ids):
        first = groups[0] if groups else None
        per_slot = [first] * len(device_ids)
    found: list[SlotNeeds | None] = []
    for entry, device in zip(per_slot, device_ids, strict=True):
        if entry is None or not entry.HasField("rate_limiter"):
            found.append(None)
            continue
        limiter = entry.rate_limiter
        resources = tuple(
            ((r.name.lower(), _GLOBAL if getattr(r, "global") else device), int(r.count))
            for r in limiter.resources
        )
        found.append(SlotNeeds(resources, max(int(limiter.priority), 1)))
    return found


class RateLimiter:
    def __init__(self, limits: Sequence[tuple[str, int, int]] = ()) -> None:
        # Explicit limits: (resource, device or -1) -> count; -1 device: every device.
        self._limits = {(name.lower(), device): count for name, count, device in limits}
        self._free: dict[tuple[str, int], int] = {}
        self._total: dict[tuple[str, int], int] = {}
        self._waiting: dict[int, tuple[int, Waiter]] = {}  # id -> (arrival, pool)
        # Registered instances per (resource, global): a name is used one way only.
        self._scopes: collections.Counter[tuple[str, bool]] = collections.Counter()
        self._order = itertools.count()

    def _explicit(self, key: tuple[str, int]) -> int:
        """The supply `--rate-limit-resource` gives: as in Triton, once any limit is given,
        a resource that none names is unavailable. A global resource takes the largest
        limit given for its name; a per-device one its device's, or every device's."""
        name, device = key
        if device == _GLOBAL:
            return max((c for (n, _), c in self._limits.items() if n == name), default=0)
        return max(self._limits.get((name, device), 0), self._limits.get((name, _GLOBAL), 0))

    def _capacity(self, key: tuple[str, int], asked: int) -> int:
        if self._limits:
            return self._explicit(key)
        return max(asked, self._total.get(key, 0))

    def check(self, needs: Sequence[SlotNeeds | None]) -> None:
        """Refuse, before anything is registered, instances that could never run: one that
        asks for more than its limit would wait forever while its model reads as ready;
        and a resource that these instances, or the registered ones, use both globally
        and per device."""
        if self._limits:
            self._check_limits(needs)
        scopes = {key for key, count in self._scopes.items() if count > 0}
        for entry in needs:
            for (name, device), _ in entry.resources if entry is not None else ():
                scopes.add((name, device == _GLOBAL))
                if (name, device != _GLOBAL) in scopes:
                    raise invalid_arg(
                        f'Resource "{name}" is present as both global and device-specific '
                        "resource in the model configuration."
                    )

    def _check_limits(self, needs: Sequence[SlotNeeds | None]) -> None:
        for entry in needs:
            for key, count in entry.resources if entry is not None else ():
                supply = self._explicit(key)
                if supply < count:
                    raise invalid_arg(
                        f'Resource count for "{key[0]}" is limited to {supply} which will '
                        "prevent scheduling of one or more model instances, the minimum "
                        f"required count is {count}"
                    )

    def register(self, needs: SlotNeeds) -> None:
        """An instance that will ask for `needs` (`check`ed first); sizes the resources it
        names."""
        for key, count in needs.resources:
            self._scopes[key[0], key[1] == _GLOBAL] += 1
            total = self._capacity(key, count)
            self._free[key] = self._free.get(key, 0) + total - self._total.get(key, 0)
            self._total[key] = total

    def unregister(self, needs: SlotNeeds) -> None:
        """A registered instance is gone (its model unloaded): the way it used each
        resource no longer binds other models. (The supply stays as it was sized.)"""
        for (name, device), _ in needs.resources:
            self._scopes[name, device == _GLOBAL] -= 1

    def allows(self, needs: SlotNeeds | None) -> bool:
        if needs is None:
            return True
        return all(self._free.get(key, 0) >= count for key, count in needs.resources)

    def take(self, needs: SlotNeeds | None) -> None:
        if needs is not None:
            for key, count in needs.resources:
                self._free[key] -= count

    def give(self, needs: SlotNeeds | None) -> None:
        """Resources back: the pools waiting for them get their turn, by priority."""
        if needs is None:
            return
        for key, count in needs.resources:
            self._free[key] += count
        waiting = self._waiting
        # Ranked now: executions change while pools wait.
        ranked = sorted(waiting, key=lambda k: (*waiting[k][1].rank(), waiting[k][0]))
        for pool_id in ranked:
            entry = waiting.pop(pool_id, None)
            if entry is not None:
                entry[1].serve_waiters()

    def wait(self, pool: Waiter) -> None:
        """`pool` has callers waiting that no resources let run yet."""
        if id(pool) not in self._waiting:
            self._waiting[id(pool)] = (next(self._order), pool)

    def free(self, resource: str, device: int = _GLOBAL) -> int:
        """How many of a resource are free now (for tests and logs)."""
        return self._free.get((resource.lower(), device), 0)
