"""`triton_python_backend_utils` (4/5): the model config as a model reads and completes it.

`ModelConfig` is what a model's static `auto_complete_config` receives: the config as
Triton's JSON (every field present), which the model may complete with `add_input`,
`add_output`, `set_max_batch_size`, `set_dynamic_batching` and
`set_model_transaction_policy`. Each refuses, with ValueError, to change what the config
already says differently.
"""

from __future__ import annotations

import json
from typing import Any


def _config_by_name(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(kind, []):
        if entry.get("name") == name:
            found: dict[str, Any] = entry
            return found
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    _INPUT_KEYS = ("name", "data_type", "dims", "optional")
    _OUTPUT_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("input", [])
        config.setdefault("output", [])
        config.setdefault("max_batch_size", 0)
        config.setdefault("name", "")
        self._model_config: dict[str, Any] = config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._model_config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._model_config.get(other):
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        if not self._model_config.get("dynamic_batching"):
            self._model_config["dynamic_batching"] = {}

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, self._INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, self._OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, entry: dict[str, Any], allowed: tuple[str, ...]) -> None:
        label = entry.get("name", "")
        extra = [key for key in entry if key not in allowed]
        if extra:
            listed = ", ".join(f"'{k}'" for k in allowed)
            raise ValueError(
                f"{kind} '{label}' in auto-complete-config function for model '{self._name}' "
                f"contains property other than {listed}."
            )
        for key in ("name", "data_type", "dims"):
            if key not in entry:
                what = f"{kind} '{label}'" if key != "name" else kind
                raise ValueError(
                    f"{what} in auto-complete-config function for model '{self._name}' is "
                    f"missing '{key}' property."
                )
        dims = [int(d) for d in entry["dims"]]
        for current in self._model_config[kind]:
            if current.get("name") != entry["name"]:
                continue
            configured_type = current.get("data_type", "TYPE_INVALID")
            if configured_type not in ("TYPE_INVALID", entry["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{configured_type} for {kind} '{entry['name']}', model provides "
                    f"{entry['data_type']}"
                )
            configured_dims = [int(d) for d in current.get("dims", [])]
            if configured_dims and configured_dims != dims:
                raise ValueError(
                    f"model '{self._name}', tensor '{entry['name']}': the model expects dims "
                    f"{dims} but the model configuration specifies dims {configured_dims}"
                )
            if (
                "optional" in entry
                and "optional" in current
                and bool(current["optional"]) != bool(entry["optional"])
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{entry['name']}': the model expects "
                    f"optional {entry['optional']} but the model configuration specifies "
                    f"optional {current['optional']}"
                )
            current["data_type"] = entry["data_type"]
            current["dims"] = dims
            if "optional" in entry:
                current["optional"] = bool(entry["optional"])
            return
        added = dict(entry)
        added["dims"] = dims
        self._model_config[kind].append(added)
