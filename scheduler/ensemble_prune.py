"""Which steps of an ensemble a request needs, given the outputs it asks for.

Triton prunes an ensemble request whose client asks for some of its outputs only: a
step none of whose tensors reach a requested output is not run (core
ensemble_scheduler.cc, the backward traversal in EnsembleContext's constructor). Its
model then neither computes nor counts the request. A step that writes a tensor no step
reads and the ensemble does not answer with is kept, as Triton keeps it (its traversal
only starts from ensemble outputs).

Triton's traversal walks back from each unrequested output and prunes the step that
wrote it once all that step's tensors are unwanted, even when another step still reads
the tensor; this walks forward from what is wanted instead, so a tensor a kept step
reads always keeps its writer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class _Step(Protocol):
    @property
    def inputs(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]: ...


def needed_steps(
    steps: Sequence[_Step],
    outputs: Iterable[str],
    readers: dict[str, tuple[int, ...]],
    requested: Iterable[str],
) -> tuple[bool, ...]:
    """For each step, whether a request asking for `requested` runs it."""
    answered = set(outputs)
    writer = {tensor: index for index, step in enumerate(steps) for _, tensor in step.outputs}
    needed = [False] * len(steps)
    wanted: set[str] = set()
    todo = list(requested)
    for kept, step in enumerate(steps):
        if any(t not in answered and t not in readers for _, t in step.outputs):
            needed[kept] = True
            todo.extend(tensor for _, tensor in step.inputs)
    while todo:
        tensor = todo.pop()
        if tensor in wanted:
            continue
        wanted.add(tensor)
        found = writer.get(tensor)
        if found is not None and not needed[found]:
            needed[found] = True
            todo.extend(t for _, t in steps[found].inputs)
    return tuple(needed)


def runs(needed: tuple[bool, ...] | None, index: int) -> bool:
    """Whether a request with `needed` (None: every step) runs step `index`."""
    return needed is None or needed[index]
