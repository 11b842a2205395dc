"""The one check that every path a model config names stays inside the model folder.

A load runs it right after the config is read, before anything the config names is
opened: the model file, labels, warmup data or a backend's files. The folder is the
model's folder in the repository, or the private `file:` override folder for a load API
call that sent files. Each reader resolves its own path again through the same helper
(ge_serve.backends.paths) and opens what that returns, so a reader never trusts the text.

Covered: `default_model_filename` and `cc_model_filenames` (in each version folder),
`label_filename`, warmup `input_data_file` (under `warmup/`), `EXECUTION_ENV_PATH`, and
the GE options and atc flags that name files. A backend's default model file (for a
Python backend `model.py`) is resolved where the backend is known (autocomplete).
`--backend-config` values are the operator's, not the model's, and are not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ge_serve.backends.ge.options import file_parameters, parameter_path
from ge_serve.backends.paths import execution_env_path, resolve_inside
from ge_serve.backends.warmup import data_file, warmup_label
from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError
from .autocomplete import resolve_model_file
from .repository import label_file

EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"


def check_config_paths(
    config: model_config_pb2.ModelConfig, model_dir: Path, versions: Sequence[int]
) -> None:
    """Refuse (INVALID_ARG, naming the field) any path of `config` that leaves `model_dir`.

    Nothing outside the folder is opened or stat'ed, so the reason never depends on
    whether a file outside exists.
    """
    try:
        _check(config, model_dir, versions)
    except ValueError as exc:  # OutsideFolder, or a malformed atc flag name
        raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None


def _check(config: model_config_pb2.ModelConfig, model_dir: Path, versions: Sequence[int]) -> None:
    for version in versions:
        if config.default_model_filename:
            resolve_model_file(model_dir, str(version), config.default_model_filename)
        for target, filename in sorted(config.cc_model_filenames.items()):
            what = f"cc_model_filenames {filename!r} of {target!r}"
            resolve_inside(model_dir, filename, what, under=str(version))
    for output in config.output:
        if output.label_filename:
            label_file(model_dir, output)
    for index, warmup in enumerate(config.model_warmup):
        label = warmup_label(warmup, index)
        for name, spec in sorted(warmup.inputs.items()):
            if spec.WhichOneof("input_data_type") == "input_data_file":
                data_file(model_dir, label, name, spec.input_data_file)
    params = {key: str(p.string_value) for key, p in config.parameters.items()}
    if params.get(EXECUTION_ENV_PATH):
        execution_env_path(model_dir, params[EXECUTION_ENV_PATH])
    for key, value in file_parameters(params):
        parameter_path(model_dir, key, value)
