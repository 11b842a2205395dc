"""Shape-bucketed batching: pad requests whose non-batch dims vary up to a common bucket.

A model whose inputs vary in a non-batch dim (an NLP sequence length, an image size)
batches only requests of one exact shape, so under mixed traffic it runs at batch 1.
With buckets, each request is assigned the smallest bucket that holds it, requests of
one bucket batch together, each is padded up to the bucket's shape (with a pad value
per input), and each output is trimmed back to its own request's size. A batch is never
padded beyond its bucket, which is the bucket of its longest request.

The buckets are the backend's (`LoadedModel.shape_buckets`: GE ND gears, dynamic image
sizes), whose executors accept only those shapes; or, failing those, the model's config
`parameters`:

- `bucket_inputs`: the padded dims, `input:dim` pairs separated by commas; `dim` indexes
  the input's `dims` in the config (the batch dim not counted), e.g. `input_ids:0`;
- `bucket_sizes`: the buckets, smallest first, separated by commas: `n` pads every
  listed dim to `n`; `n1xn2...` gives one size per listed dim, in order;
- `bucket_pad_values`: `input:value` pairs (default 0 for every input);
- `bucket_trim_outputs`: `output:dim=input:dim` pairs: that output dim is trimmed back
  to the request's size of that input dim, when it has the bucket's padded size. Without
  it, each variable (-1) output dim is trimmed by the first input padded in that dim;
- `bucket_padding`: `false` runs only requests of a bucket's exact shape, refusing others
  (400) as the NPU refuses a shape that is no gear. Padding is right only for a model
  that ignores the padded positions (masked attention, a convolution trimmed back); one
  whose outputs read them (a mean, an unmasked softmax over the padded dim) needs its
  clients to send gear shapes.

Everything here is pure: the scheduler assigns buckets on the loop (`assign`), and the
slot thread pads (`merge`) and trims (`trim`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ge_serve.backends.base import ShapeBucket, gear_for
from ge_serve.backends.text_bool import parse_bool
from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import invalid_arg

from .work import Array, WorkItem

INPUTS_KEY = "bucket_inputs"
SIZES_KEY = "bucket_sizes"
PAD_KEY = "bucket_pad_values"
TRIM_KEY = "bucket_trim_outputs"
PADDING_KEY = "bucket_padding"
KEYS = (INPUTS_KEY, SIZES_KEY, PAD_KEY, TRIM_KEY, PADDING_KEY)

# (output, its dim in the executed shape, input, its dim in the executed shape)
Trim = tuple[str, int, str, int]


@dataclass(frozen=True, slots=True)
class Bucketing:
    """One model's buckets, and how requests are padded into them and trimmed back.

    `shapes[b]` maps each padded input to its non-batch dims in bucket `b` (-1: not
    padded, as the request has it). Bucket ids are 1-based: 0 means "no bucket"."""

    model: str
    shapes: tuple[Mapping[str, tuple[int, ...]], ...]
    batching: bool
    pad_values: Mapping[str, float] = field(default_factory=dict)
    trims: tuple[Trim, ...] = ()
    # Per bucket, the batch sizes the executors run it at (backend gears that fix the
    # batch dim, as ND gears do); empty: the model's batch gears, whatever the bucket.
    batch_gears: tuple[tuple[int, ...], ...] = ()
    # `bucket_padding: false`: a request runs only at a bucket's exact shape.
    exact: bool = False

    @property
    def closes_on_shape_change(self) -> bool:
        # Buckets are ge-serve's own: a request of another bucket is looked past, so that
        # each bucket's batches fill (docs/sequences-and-shapes.md).
        return False

    def max_batch(self, bucket: int) -> int:
        """The largest batch bucket `bucket` runs at; 0 when only the model limits it."""
        gears = self.batch_gears[bucket - 1] if self.batch_gears else ()
        return max(gears, default=0)

    def describe(self) -> str:
        """The buckets as a person reads them: `input_ids[16], attention_mask[16]; ...`."""
        return "; ".join(
            ", ".join(f"{name}[{','.join(map(str, dims))}]" for name, dims in shape.items())
            for shape in self.shapes
        )

    def assign(self, item: WorkItem) -> int:
        """The id of the smallest bucket that holds the request; raises INVALID_ARG,
        naming the buckets, when none does."""
        lead = 1 if self.batching else 0
        for index, shape in enumerate(self.shapes):
            largest = self.max_batch(index + 1)
            if largest and item.batch_size > largest:
                continue
            if all(
                _holds(dims, item.inputs[name].shape[lead:], self.exact)
                for name, dims in shape.items()
                if name in item.inputs
            ):
                return index + 1
        got = ", ".join(
            f"{name}[{','.join(map(str, item.inputs[name].shape))}]"
            for name in self.shapes[0]
            if name in item.inputs
        )
        fits = "matches" if self.exact else "fits"
        raise invalid_arg(
            f"request for model '{self.model}' {fits} none of its shape buckets ({got}); "
            f"the buckets are: {self.describe()}"
        )

    def key(self, item: WorkItem, bucket: int) -> tuple[object, ...]:
        """What must agree for requests to batch: the bucket, and the exact shape of
        every dim that is not padded, with the dtypes."""
        lead = 1 if self.batching else 0
        padded = self.shapes[bucket - 1]
        parts: list[object] = [bucket]
        for name, array in sorted(item.inputs.items()):
            dims = array.shape[lead:]
            target = padded.get(name)
            if target is not None:
                dims = tuple(d if t < 0 else t for d, t in zip(dims, target, strict=True))
            parts.append((name, array.dtype.str, dims))
        return tuple(parts)

    def padded_dims(self, item: WorkItem, bucket: int, name: str) -> tuple[int, ...]:
        """The non-batch dims input `name` of `item` is padded to in `bucket`."""
        lead = 1 if self.batching else 0
        dims = item.inputs[name].shape[lead:]
        target = self.shapes[bucket - 1].get(name)
        if target is None:
            return tuple(dims)
        return tuple(d if t < 0 else t for d, t in zip(dims, target, strict=True))

    def merge(
        self, items: Sequence[WorkItem], bucket: int, total: int, padded: int
    ) -> dict[str, Array]:
        """One array per input: every item's rows padded into the bucket, then padding
        rows (a copy of the last row) up to `padded`; without batching, the one item
        padded into the bucket."""
        merged: dict[str, Array] = {}
        if self.batching and self.max_batch(bucket):
            padded = gear_for(total, self.batch_gears[bucket - 1])
        for name, first in items[0].inputs.items():
            dims = self.padded_dims(items[0], bucket, name)
            if not self.batching:
                merged[name] = self._pad_one(name, first, dims)
                continue
            if len(items) == 1 and padded == first.shape[0] and first.shape[1:] == dims:
                merged[name] = first
                continue
            out = np.full((padded, *dims), self.pad_values.get(name, 0), dtype=first.dtype)
            offset = 0
            for item in items:
                array = item.inputs[name]
                rows = array.shape[0]
                out[(slice(offset, offset + rows), *map(slice, array.shape[1:]))] = array
                offset += rows
            if padded > total:
                out[total:] = out[total - 1]
            merged[name] = out
        return merged

    def _pad_one(self, name: str, array: Array, dims: tuple[int, ...]) -> Array:
        if array.shape == dims:
            return array
        out = np.full(dims, self.pad_values.get(name, 0), dtype=array.dtype)
        out[tuple(map(slice, array.shape))] = array
        return out

    def split(
        self, items: Sequence[WorkItem], bucket: int, outputs: dict[str, Array]
    ) -> list[dict[str, Array]]:
        """Each item's own outputs: its rows (when batching), trimmed back."""
        if not self.batching:
            return [self.trim(items[0], bucket, outputs)]
        results = []
        offset = 0
        for item in items:
            end = offset + item.batch_size
            rows = {name: value[offset:end] for name, value in outputs.items()}
            results.append(self.trim(item, bucket, rows))
            offset = end
        return results

    def trim(self, item: WorkItem, bucket: int, outputs: dict[str, Array]) -> dict[str, Array]:
        """The request's own outputs: each trimmed dim that has the bucket's padded size
        is cut back to the request's size."""
        if not self.trims:
            return outputs
        lead = 1 if self.batching else 0
        padded = self.shapes[bucket - 1]
        result = dict(outputs)
        for output, out_dim, source, in_dim in self.trims:
            array = result.get(output)
            dims = padded.get(source)
            if array is None or dims is None or source not in item.inputs:
                continue
            target = dims[in_dim - lead]
            if target < 0 or out_dim >= array.ndim or array.shape[out_dim] != target:
                continue
            index = [slice(None)] * array.ndim
            index[out_dim] = slice(0, item.inputs[source].shape[in_dim])
            result[output] = array[tuple(index)]
        return result


def _holds(bucket: tuple[int, ...], dims: tuple[int, ...], exact: bool = False) -> bool:
    if len(bucket) != len(dims):
        return False
    if exact:
        return all(b < 0 or d == b for b, d in zip(bucket, dims, strict=True))
    return all(b < 0 or d <= b for b, d in zip(bucket, dims, strict=True))


def bucketing_for(
    config: model_config_pb2.ModelConfig, shape_buckets: Sequence[ShapeBucket]
) -> Bucketing | None:
    """The model's buckets: the backend's, else the config's; None without either.
    Raises INVALID_ARG, naming the parameter, for a setting that cannot work."""
    params = {k: str(v.string_value) for k, v in config.parameters.items() if k in KEYS}
    name = config.name
    batching = config.max_batch_size > 0
    inputs = {tensor.name: tuple(int(d) for d in tensor.dims) for tensor in config.input}
    shapes: list[dict[str, tuple[int, ...]]]
    if shape_buckets:
        if INPUTS_KEY in params or SIZES_KEY in params:
            raise invalid_arg(
                f"model '{name}' has shape buckets from its backend (its gears); "
                f"'{INPUTS_KEY}' and '{SIZES_KEY}' cannot be set as well"
            )
        # One bucket per combination of non-batch dims, smallest first, with the batch
        # sizes its gears fix (none when a gear leaves the batch dim free, -1).
        by_dims: dict[tuple[tuple[str, tuple[int, ...]], ...], set[int]] = {}
        for bucket in shape_buckets:
            key = tuple(
                (name, tuple(dims[1:] if batching else dims))
                for name, dims in sorted(bucket.shapes.items())
            )
            batches = by_dims.setdefault(key, set())
            if batching:
                batches.update(dims[0] for dims in bucket.shapes.values())
        ordered = sorted(by_dims, key=lambda k: (sum(math.prod(d) for _, d in k), k))
        shapes = [dict(key) for key in ordered]
        batch_gears = tuple(
            () if not by_dims[key] or min(by_dims[key]) < 1 else tuple(sorted(by_dims[key]))
            for key in ordered
        )
    elif INPUTS_KEY in params or SIZES_KEY in params:
        shapes = _configured(name, params, inputs)
        batch_gears = ()
    else:
        if PAD_KEY in params or TRIM_KEY in params or PADDING_KEY in params:
            raise invalid_arg(
                f"model '{name}' sets '{PAD_KEY}', '{TRIM_KEY}' or '{PADDING_KEY}' but has "
                f"no shape buckets (set '{INPUTS_KEY}' and '{SIZES_KEY}')"
            )
        return None
    outputs = {tensor.name: tuple(int(d) for d in tensor.dims) for tensor in config.output}
    return Bucketing(
        model=name,
        shapes=tuple(shapes),
        batching=batching,
        pad_values=_pad_values(name, params.get(PAD_KEY, ""), inputs),
        trims=_trims(name, params.get(TRIM_KEY), shapes, inputs, outputs, batching),
        batch_gears=batch_gears,
        exact=not _padding(name, params.get(PADDING_KEY, "true")),
    )


def _padding(name: str, text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError:
        raise invalid_arg(
            f"parameter '{PADDING_KEY}' of model '{name}' must be true or false, got '{text}'"
        ) from None


def _pairs(name: str, key: str, text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        tensor, sep, value = part.rpartition(":")
        if not sep or not tensor or not value:
            raise invalid_arg(
                f"parameter '{key}' of model '{name}' must be 'name:value' pairs separated "
                f"by commas, got '{part}'"
            )
        pairs.append((tensor.strip(), value.strip()))
    return pairs


def _dim(name: str, key: str, tensor: str, text: str, rank: int) -> int:
    if not text.isdigit() or int(text) >= rank:
        raise invalid_arg(
            f"parameter '{key}' of model '{name}': dim '{text}' of '{tensor}' must index "
            f"its config dims [0, {rank - 1}]"
        )
    return int(text)


def _configured(
    name: str, params: Mapping[str, str], inputs: Mapping[str, tuple[int, ...]]
) -> list[dict[str, tuple[int, ...]]]:
    if INPUTS_KEY not in params or SIZES_KEY not in params:
        raise invalid_arg(f"model '{name}' must set both '{INPUTS_KEY}' and '{SIZES_KEY}'")
    padded: list[tuple[str, int]] = []
    for tensor, dim_text in _pairs(name, INPUTS_KEY, params[INPUTS_KEY]):
        if tensor not in inputs:
            raise invalid_arg(
                f"parameter '{INPUTS_KEY}' of model '{name}' names '{tensor}', which is not "
                "one of its inputs"
            )
        dim = _dim(name, INPUTS_KEY, tensor, dim_text, len(inputs[tensor]))
        if inputs[tensor][dim] != -1:
            raise invalid_arg(
                f"parameter '{INPUTS_KEY}' of model '{name}': dim {dim} of '{tensor}' is "
                f"fixed at {inputs[tensor][dim]} in the config; only a variable (-1) dim "
                "can be padded"
            )
        padded.append((tensor, dim))
    if not padded:
        raise invalid_arg(f"parameter '{INPUTS_KEY}' of model '{name}' lists no dims")
    shapes: list[dict[str, tuple[int, ...]]] = []
    for entry in filter(None, (e.strip() for e in params[SIZES_KEY].split(","))):
        sizes = entry.lower().split("x")
        if not all(s.strip().isdigit() and int(s) > 0 for s in sizes) or len(sizes) not in (
            1,
            len(padded),
        ):
            raise invalid_arg(
                f"parameter '{SIZES_KEY}' of model '{name}': bucket '{entry}' must be one "
                f"positive size, or {len(padded)} joined by 'x' (one per dim in "
                f"'{INPUTS_KEY}')"
            )
        values = [int(s) for s in sizes] * (len(padded) if len(sizes) == 1 else 1)
        shape = {tensor: [-1] * len(inputs[tensor]) for tensor, _ in padded}
        for (tensor, dim), value in zip(padded, values, strict=True):
            shape[tensor][dim] = value
        shapes.append({tensor: tuple(dims) for tensor, dims in shape.items()})
    if not shapes:
        raise invalid_arg(f"parameter '{SIZES_KEY}' of model '{name}' lists no buckets")
    return shapes


def _pad_values(name: str, text: str, inputs: Mapping[str, tuple[int, ...]]) -> dict[str, float]:
    values: dict[str, float] = {}
    for tensor, value in _pairs(name, PAD_KEY, text):
        if tensor not in inputs:
            raise invalid_arg(
                f"parameter '{PAD_KEY}' of model '{name}' names '{tensor}', which is not one "
                "of its inputs"
            )
        try:
            values[tensor] = float(value)
        except ValueError:
            raise invalid_arg(
                f"parameter '{PAD_KEY}' of model '{name}': pad value '{value}' of '{tensor}' "
                "is not a number"
            ) from None
    return values


def _trims(
    name: str,
    text: str | None,
    shapes: Sequence[Mapping[str, tuple[int, ...]]],
    inputs: Mapping[str, tuple[int, ...]],
    outputs: Mapping[str, tuple[int, ...]],
    batching: bool,
) -> tuple[Trim, ...]:
    lead = 1 if batching else 0
    if text is None:
        # Default: a variable output dim is trimmed by the first input padded in that dim.
        padded: dict[int, str] = {}
        for shape in shapes:
            for tensor, dims in shape.items():
                for dim, size in enumerate(dims):
                    if size >= 0:
                        padded.setdefault(dim, tensor)
        return tuple(
            (output, dim + lead, padded[dim], dim + lead)
            for output, dims in outputs.items()
            for dim, size in enumerate(dims)
            if dim in padded and size == -1
        )
    trims: list[Trim] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        out_text, sep, in_text = part.partition("=")
        if not sep:
            raise invalid_arg(
                f"parameter '{TRIM_KEY}' of model '{name}' must be 'output:dim=input:dim' "
                f"pairs separated by commas, got '{part}'"
            )
        ((output, out_dim),) = _pairs(name, TRIM_KEY, out_text)
        ((source, in_dim),) = _pairs(name, TRIM_KEY, in_text)
        if output not in outputs or source not in inputs:
            raise invalid_arg(
                f"parameter '{TRIM_KEY}' of model '{name}': '{part}' must name one of its "
                "outputs and one of its inputs"
            )
        trims.append(
            (
                output,
                _dim(name, TRIM_KEY, output, out_dim, len(outputs[output])) + lead,
                source,
                _dim(name, TRIM_KEY, source, in_dim, len(inputs[source])) + lead,
            )
        )
    return tuple(trims)
