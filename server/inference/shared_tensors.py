"""Tensors that live in client-registered shared memory, on the request path: the one
place that maps a request's inputs and finds where its outputs go, and writes them there.

Like Triton's front ends, references are resolved before the request is counted, so a bad
region fails the request before it is queued. The input views are zero-copy and keep
their regions mapped until the request ends. Outputs are written once the response is
built, and the response's tensors then name their region instead of carrying data.

The regions a request uses are held (`Held`) until it ends: one unregistered meanwhile
stays registered until then, as in Triton. A request without shared-memory tensors holds
nothing and costs one loop over its tensors, as before.
"""

from __future__ import annotations

from ..control.sharedmemory import Held, SharedMemoryManager
from .types import InferRequest, InferResponse, SharedMemoryRef
from .wire import tensor_to_raw

# Each shared-memory output: its reference and the window it is written through.
OutputTargets = dict[str, tuple[SharedMemoryRef, memoryview]]


def map_request(manager: SharedMemoryManager, request: InferRequest, held: Held) -> OutputTargets:
    """Give inputs that live in shared memory their zero-copy views, and return where each
    shared-memory output goes (empty: none does). The regions used go into `held`, which
    the caller hands to `manager.release` when the request ends; on a refusal here they
    are released already."""
    try:
        for tensor in request.inputs:
            if tensor.shm is not None:
                tensor.data = manager.input_array(
                    tensor.shm,
                    tensor.datatype,
                    tensor.shape,
                    tensor.name,
                    request.model_name,
                    held=held,
                )
        return {
            o.name: (o.shm, manager.window(o.shm, held))
            for o in request.outputs
            if o.shm is not None
        }
    except BaseException:
        manager.release(held)
        raise


def write_outputs(response: InferResponse, targets: OutputTargets) -> None:
    for tensor in response.outputs:
        target = targets.get(tensor.name)
        if target is not None:
            ref, window = target
            SharedMemoryManager.write_output(window, tensor_to_raw(tensor), tensor.name)
            tensor.shm = ref
