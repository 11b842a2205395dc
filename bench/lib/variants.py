"""Server configurations the suites measure: a `Variant` is one model's repository options,
ge-serve flags and perf_analyzer's tensor transport; `batching_variants(model)` are the
batching settings the batching, priority and latency suites compare.

The batching settings (the `config` a result names):
* `off`: no dynamic_batching (and auto-complete off, so none is added): one request, one run.
* `static0`: `dynamic_batching {}`: Triton's default, batches form from what queued while the
  slot was busy.
* `static`: a tuned static window and preferred sizes (see STATIC below).
* `static3ms` (`simple` only): a 3 ms window with preferred size 8. `simple` costs the host
  far more per execution than its compute, so over gRPC, where requests arrive spread out,
  a window fills batches that no window leaves small. At one client it waits the whole
  window every time: a setting for throughput only.
* `adaptive`: `dynamic_batching {}` plus `adaptive_batching: "true"`, budget derived.
* `static0x2`, `staticx2`, `adaptivex2` (CNN only): `static0`, `static` and `adaptive` with
  two slots, the cores split between them (intra-op threads = cores // 2), so one slot
  computes while the other is being filled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.lib.models import Batching, RepoOptions, ensure_model


@dataclass
class Variant:
    """One server configuration: the model, its repo options, and extra ge-serve flags.
    batching=None (no dynamic_batching) needs --disable-auto-complete-config to stay off."""

    name: str
    model: str = "resnet18_like"
    options: RepoOptions = field(default_factory=RepoOptions)
    flags: Sequence[str] = ()
    # perf_analyzer's --shared-memory: "system" takes the tensor transport off the socket.
    shared_memory: str = "none"


SHORT = {"simple": "simple", "resnet18_like": "cnn"}
# A tuned static setting per model: a window about a tenth of an unbatched execution on a
# modern 16-core host, and the sizes that fill a CNN's GEMMs well.
STATIC = {
    "simple": Batching(max_queue_delay_us=100, preferred=[4, 8]),
    "resnet18_like": Batching(max_queue_delay_us=2000, preferred=[8, 16, 32]),
}
# A long window for front-end-bound models, where each execution costs the host far more
# than its compute (see the list above).
LONG_WINDOW = {"simple": Batching(max_queue_delay_us=3000, preferred=[8])}
ADAPTIVE = {"adaptive_batching": "true"}
# The suffix of a setting with two slots ("adaptivex2": adaptive on two slots).
TWO_SLOTS = "x2"


def batching_variants(model: str) -> list[Variant]:
    """The batching settings for one model; names carry the model ("static0-cnn") so that
    each variant gets its own repository."""
    short = SHORT.get(model, model)
    mbs = ensure_model(model).default_max_batch_size
    plain = RepoOptions(max_batch_size=mbs)
    found = [
        Variant(f"off-{short}", model, plain, flags=["--disable-auto-complete-config"]),
        Variant(f"static0-{short}", model, RepoOptions(max_batch_size=mbs, batching=Batching())),
        Variant(
            f"static-{short}",
            model,
            RepoOptions(max_batch_size=mbs, batching=STATIC.get(model, Batching())),
        ),
        Variant(
            f"adaptive-{short}",
            model,
            RepoOptions(max_batch_size=mbs, batching=Batching(), params=ADAPTIVE),
        ),
    ]
    if model in LONG_WINDOW:
        long = RepoOptions(max_batch_size=mbs, batching=LONG_WINDOW[model])
        found.insert(3, Variant(f"static3ms-{short}", model, long))
    if model == "resnet18_like":
        tuned = STATIC[model]
        for name, batching, params in (("static0", Batching(), {}), ("static", tuned, {}),
                                       ("adaptive", Batching(), ADAPTIVE)):  # fmt: skip
            two = RepoOptions(max_batch_size=mbs, batching=batching, params=params, instances=2)
            found.append(Variant(f"{name}{TWO_SLOTS}-{short}", model, two))
    return found


def setting(variant: Variant) -> str:
    """The batching setting a variant of `batching_variants` stands for ("static0-cnn" ->
    "static0")."""
    return variant.name.removesuffix(f"-{SHORT.get(variant.model, variant.model)}")
