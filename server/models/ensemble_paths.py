"""Which ensembles are decoupled, and the decoupled data flows an ensemble may have.

As Triton's ensemble_utils.cc: every tensor has an origin, 0 for the ensemble's inputs and
a new one for the outputs of each decoupled step (any number of responses, each a new set
of them); a step that is not decoupled passes its inputs' origin on. A step must read
tensors of one origin, since it runs once per set of them; Triton's message otherwise. The
ensemble is decoupled when any step is.

ge-serve also asks the ensemble's outputs to share one origin, since a response carries
one set of them: Triton pairs outputs of different origins by arrival order (the first
response of one with the only value of the other), which ge-serve refuses at load rather
than guess.
"""

from __future__ import annotations

from collections.abc import Sequence

from ge_serve.scheduler.ensemble import EnsembleStep

from ..errors import ErrorCode, ServerError


def check_decoupled_paths(
    ensemble: str, steps: Sequence[EnsembleStep], inputs: Sequence[str], outputs: Sequence[str]
) -> bool:
    """Whether the ensemble is decoupled; a ServerError for a step (or the outputs) fed
    from different decoupled origins. The data flow was checked already: every step
    runs, in some order, from the ensemble's inputs."""
    origin = dict.fromkeys(inputs, 0)
    origins = 0
    pending = list(range(len(steps)))
    while pending:
        runnable = [i for i in pending if all(t in origin for _, t in steps[i].inputs)]
        if not runnable:
            break
        for index in runnable:
            pending.remove(index)
            step = steps[index]
            seen = {origin[t] for _, t in step.inputs}
            if len(seen) > 1:
                raise ServerError(
                    ErrorCode.INVALID_ARG,
                    f"in ensemble {ensemble}, step of model '{step.model_name}' receives "
                    "inputs originated from different decoupled models",
                )
            own = seen.pop() if seen else 0
            if step.decoupled:
                origins += 1
                own = origins
            for _, tensor in step.outputs:
                origin[tensor] = own
    if len({origin[t] for t in outputs if t in origin}) > 1:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"in ensemble {ensemble}, the ensemble outputs originate from different decoupled "
            "models; a response carries outputs of one origin",
        )
    return origins > 0
