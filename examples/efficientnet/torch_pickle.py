"""Reading a PyTorch state dict saved in torch's old (pre-1.6) file format, without torch.

Why not ``torch.load``: this example must build on a machine without torch (ge-serve never
installs it), and unpickling an arbitrary file runs whatever callables it names. The
reader is a restricted unpickler: the only globals it resolves are ``OrderedDict``,
torch's tensor-rebuild function and the typed storage classes, each mapped to a numpy
stand-in; any other global fails the read (``UnsafePickle``).

The old format is five things back to back: three small pickles (a magic number, the
protocol version and the host's type sizes), the state dict's own pickle (whose tensors
point at storages by persistent id), a pickle listing the storage keys, and then each
storage's raw bytes in that order, each after its element count as a little-endian int64.
The newer zip format (``archive/data.pkl`` and ``archive/data/<key>``) is read as well.
"""

from __future__ import annotations

import collections
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
STORAGE_DTYPES: dict[str, npt.DTypeLike] = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": np.uint16,  # raw bits; no model here uses it
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class UnsafePickle(ValueError):
    """The file names a global outside what a state dict of tensors needs."""


@dataclass(frozen=True, slots=True)
class StorageType:
    name: str

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(STORAGE_DTYPES[self.name])


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor as the pickle describes it; its storage's bytes come later in the file."""

    key: str
    dtype: np.dtype[Any]
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def materialise(self, storage: npt.NDArray[Any]) -> npt.NDArray[Any]:
        item = storage.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage[self.offset :],
            shape=self.shape,
            strides=tuple(s * item for s in self.stride),
            writeable=False,
        )
        return np.array(view)  # a compact copy, independent of the storage


@dataclass(frozen=True, slots=True)
class _StorageRef:
    key: str
    dtype: np.dtype[Any]


def _rebuild_tensor_v2(
    storage: _StorageRef, offset: int, size: Any, stride: Any, *_: Any
) -> TensorRef:
    return TensorRef(storage.key, storage.dtype, int(offset), tuple(size), tuple(stride))


def _rebuild_parameter(data: TensorRef, *_: Any) -> TensorRef:
    return data


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed: dict[tuple[str, str], Callable[..., Any] | StorageType] = {
            ("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        }
        if (module, name) in allowed:
            return allowed[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(name)
        raise UnsafePickle(f"the file names {module}.{name}, which a state dict never needs")

    def persistent_load(self, pid: Any) -> _StorageRef:
        # ("storage", storage type, key, location, numel[, view metadata])
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise UnsafePickle(f"unexpected persistent id {pid!r}")
        kind = pid[1]
        if not isinstance(kind, StorageType):
            raise UnsafePickle(f"unexpected storage type {kind!r}")
        return _StorageRef(str(pid[2]), kind.dtype)


def _tensors(state: Any, storages: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    if not isinstance(state, dict):
        raise UnsafePickle("the file holds no state dict")
    found = {}
    for name, value in state.items():
        if not isinstance(value, TensorRef):
            raise UnsafePickle(f"'{name}' is not a tensor")
        found[str(name)] = value.materialise(storages[value.key])
    return found


def _read_legacy(f: IO[bytes]) -> dict[str, npt.NDArray[Any]]:
    if pickle.load(f) != LEGACY_MAGIC:
        raise UnsafePickle("not a PyTorch file (wrong magic number)")
    pickle.load(f)  # protocol version
    info = pickle.load(f)
    if isinstance(info, dict) and not info.get("little_endian", True):
        raise UnsafePickle("big-endian files are not supported")
    state = _Restricted(f).load()
    keys = pickle.load(f)
    refs = {v.key: v.dtype for v in state.values() if isinstance(v, TensorRef)}
    storages = {}
    for key in keys:
        (count,) = struct.unpack("<q", f.read(8))
        dtype = refs[str(key)]
        data = f.read(count * dtype.itemsize)
        storages[str(key)] = np.frombuffer(data, dtype=dtype)
    return _tensors(state, storages)


def _read_zip(path: Path) -> dict[str, npt.NDArray[Any]]:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pkl = next(n for n in names if n.endswith("/data.pkl"))
        root = pkl[: -len("data.pkl")]
        with archive.open(pkl) as f:
            state = _Restricted(f).load()
        storages = {}
        for value in state.values():
            if isinstance(value, TensorRef) and value.key not in storages:
                raw = archive.read(f"{root}data/{value.key}")
                storages[value.key] = np.frombuffer(raw, dtype=value.dtype)
    return _tensors(state, storages)


def load_state_dict(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Every tensor of the state dict at `path`, by name, as numpy arrays."""
    if zipfile.is_zipfile(path):
        return _read_zip(path)
    with path.open("rb") as f:
        return _read_legacy(f)
