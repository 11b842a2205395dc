"""Config fields ge-serve does not honour: one warning naming each on load, or a refusal
where ignoring it would change results (server/models/unhonoured.py)."""

from __future__ import annotations

import logging

import pytest
from google.protobuf import text_format

from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import ServerError
from ge_serve.server.models import autocomplete, unhonoured

BASE = """
name: "m"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

# One config fragment per listed field, setting it and nothing else the list names.
SETTING = {
    "optimization": "optimization { input_pinned_memory { enable: true } }",
    "instance_group.passive": "instance_group [ { count: 1 kind: KIND_CPU passive: true } ]",
    "instance_group.host_policy": 'instance_group [ { count: 1 host_policy: "numa0" } ]',
    "instance_group.secondary_devices": (
        "instance_group [ { count: 1 secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]"
    ),
    "instance_group.profile": 'instance_group [ { count: 1 profile: "0" } ]',
    "model_metrics": (
        "model_metrics { metric_control [ { metric_identifier { family: "
        '"nv_inference_request_duration" } histogram_options { buckets: [ 1, 2 ] } } ] }'
    ),
    "metric_tags": 'metric_tags { key: "team" value: "cv" }',
    "model_operations": 'model_operations { op_library_filename: "libops.so" }',
    "ensemble_scheduling.max_inflight_requests": (
        "ensemble_scheduling { max_inflight_requests: 8 }"
    ),
    "input.is_non_linear_format_io": (
        'input [ { name: "z" data_type: TYPE_FP32 dims: [ 1 ] is_non_linear_format_io: true } ]'
    ),
    "output.is_non_linear_format_io": (
        'output [ { name: "w" data_type: TYPE_FP32 dims: [ 1 ] is_non_linear_format_io: true } ]'
    ),
    "sequence_batching.state.use_same_buffer_for_input_output": (
        'sequence_batching { state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 '
        "dims: [ 1 ] use_same_buffer_for_input_output: true } ] }"
    ),
    "sequence_batching.state.use_growable_memory": (
        'sequence_batching { state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 '
        "dims: [ 1 ] use_growable_memory: true } ] }"
    ),
    "input.is_shape_tensor": (
        'input [ { name: "z" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true } ]'
    ),
    "output.is_shape_tensor": (
        'output [ { name: "w" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true } ]'
    ),
    "ensemble_scheduling.step.model_namespace": (
        'ensemble_scheduling { step [ { model_name: "a" model_version: -1 '
        'model_namespace: "other" } ] }'
    ),
}


def config(fragment: str = "") -> model_config_pb2.ModelConfig:
    return text_format.Parse(BASE + fragment, model_config_pb2.ModelConfig())


def test_every_listed_field_has_a_case_here_and_is_a_field_of_the_proto() -> None:
    assert set(SETTING) == set(unhonoured.WARNED) | set(unhonoured.REFUSED)
    assert not set(unhonoured.WARNED) & set(unhonoured.REFUSED)
    for path in SETTING:
        *parents, name = path.split(".")
        descriptor = model_config_pb2.ModelConfig.DESCRIPTOR
        for part in parents:
            inner = descriptor.fields_by_name[part].message_type  # KeyError: not a field
            assert inner is not None, f"{path}: {part} is not a message"
            descriptor = inner
        assert name in descriptor.fields_by_name, f"{path}: not a field"


@pytest.mark.parametrize("path", sorted(unhonoured.WARNED))
def test_an_ignored_field_warns_naming_it(path: str) -> None:
    warnings = unhonoured.check(config(SETTING[path]))
    field = path.split(".")[-1]
    assert len(warnings) == 1, warnings
    assert "model 'm': config field '" in warnings[0]
    assert field in warnings[0] and "not honoured" in warnings[0], warnings


@pytest.mark.parametrize("path", sorted(unhonoured.REFUSED))
def test_a_field_whose_absence_changes_results_fails_the_load(path: str) -> None:
    with pytest.raises(ServerError) as raised:
        unhonoured.check(config(SETTING[path]))
    assert path.split(".")[-1] in str(raised.value) and "not supported" in str(raised.value)


def test_a_plain_config_and_default_values_say_nothing() -> None:
    assert unhonoured.check(config()) == []
    quiet = "instance_group [ { count: 2 kind: KIND_CPU passive: false } ]"
    assert unhonoured.check(config(quiet)) == []


def test_a_warning_names_the_entry_of_a_repeated_field() -> None:
    groups = 'instance_group [ { count: 1 }, { count: 1 passive: true host_policy: "n" } ]'
    warnings = unhonoured.check(config(groups))
    assert any("'instance_group[1].passive'" in w for w in warnings), warnings
    assert any("'instance_group[1].host_policy'" in w for w in warnings), warnings
    assert len(warnings) == 2


def test_an_empty_optimization_block_still_warns() -> None:
    (warning,) = unhonoured.check(config("optimization { }"))
    assert "'optimization'" in warning


def test_the_config_apis_own_optimization_defaults_do_not_warn() -> None:
    # GET .../config shows them (Triton's defaults); loading that config back asks for
    # nothing ge-serve leaves undone.
    pinned = (
        "optimization {{ input_pinned_memory {{ enable: {} }} "
        "output_pinned_memory {{ enable: true }} }}"
    )
    assert unhonoured.check(config(pinned.format("true"))) == []
    assert len(unhonoured.check(config(pinned.format("false")))) == 1


def test_the_load_time_check_logs_each_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ge_serve.server.models.autocomplete"):
        autocomplete.check(config(SETTING["instance_group.passive"] + SETTING["optimization"]))
    text = caplog.text
    assert "'instance_group[0].passive'" in text and "'optimization'" in text, text
