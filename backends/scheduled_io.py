"""The model inputs and outputs that the scheduler, not the client, feeds and keeps.

A sequence model's control inputs (START, END, READY, CORRID) and implicit-state inputs,
and a ragged model's `batch_input` tensors, are model inputs that no request carries: the
scheduler fills them per batch. An implicit state's output goes back to the scheduler
and reaches a client only when the config lists it. Backends read this when they check a
config against the model file, or fill one in from it, so that these tensors are neither
demanded from clients nor refused as missing.
"""

from __future__ import annotations

from ge_serve.protos import model_config_pb2


def fed_inputs(config: model_config_pb2.ModelConfig) -> set[str]:
    """Model inputs the scheduler fills: sequence controls, state inputs, batch inputs."""
    names = {control.name for control in config.sequence_batching.control_input}
    names.update(state.input_name for state in config.sequence_batching.state)
    for batch_input in config.batch_input:
        names.update(batch_input.target_name)
    return names


def kept_outputs(config: model_config_pb2.ModelConfig) -> set[str]:
    """Model outputs the scheduler takes back: implicit-state outputs."""
    return {state.output_name for state in config.sequence_batching.state}
