"""Model namespacing (`--model-namespacing`): which model a name means.

With namespacing on, each `--model-repository` folder is a namespace and the same model
name may be in several of them, as in Triton. Inside the server a model is known by its
key: its plain name where it has no namespace (namespacing off, or a model loaded from
`file:` overrides), else `<namespace>/<name>`, the path of its folder (a model name
holds no '/', so the name is always the last part of its key).

- A client names a model by its name only. A name that several namespaces hold is
  refused with Triton's message; so are all its statistics, metadata and readiness
  queries. Load and unload act on every namespace that holds the name, as Triton's
  repository manager does.
- An ensemble's step names a model in the ensemble's own namespace first; failing that,
  the one model of that name anywhere, if there is exactly one.
"""

from __future__ import annotations

from collections.abc import Iterable

from ge_serve.protos.model_config_pb2 import ModelConfig

from ..inference.error_texts import ambiguous_model


def model_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def model_name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def namespace_of(key: str) -> str:
    head, _, _ = key.rpartition("/")
    return head


def resolve(name: str, keys: Iterable[str]) -> str:
    """The key a client's `name` means among `keys`; `name` itself where no key carries
    that name (a key, or an unknown model: the caller's lookup tells which). Raises
    Triton's error where several do."""
    matches = [key for key in keys if model_name(key) == name]
    if len(matches) > 1:
        raise ambiguous_model(name, len(matches))
    return matches[0] if matches else name


def step_key(ensemble: str, step: str, keys: Iterable[str]) -> str | None:
    """The key of the model an ensemble's step names: the one in the ensemble's own
    namespace, else the only one of that name; None where there is none or several."""
    known = set(keys)
    preferred = model_key(namespace_of(ensemble), step)
    if preferred in known:
        return preferred
    matches = [key for key in known if model_name(key) == step]
    return matches[0] if len(matches) == 1 else None


def qualify_steps(ensemble: str, config: ModelConfig, keys: Iterable[str]) -> ModelConfig:
    """A copy of an ensemble's config whose steps name their models by key, so that the
    ensemble's requests reach the models its namespace means (a step that resolves to no
    single model keeps its name, and the plan's own check refuses it)."""
    known = list(keys)
    qualified = ModelConfig()
    qualified.CopyFrom(config)
    for step in qualified.ensemble_scheduling.step:
        step.model_name = step_key(ensemble, step.model_name, known) or step.model_name
    return qualified
