"""The model repository on disk: Triton's layout, `config.pbtxt` and version policy."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from google.protobuf import text_format

from ge_serve.backends.paths import OutsideFolder, resolve_inside
from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError
from .namespaces import model_key
from .registered import RegisteredRepositories

log = logging.getLogger(__name__)

CONFIG_FILENAME = "config.pbtxt"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model folder found in one of the repositories."""

    name: str
    path: Path
    # --model-config-name: read configs/<config_name>.pbtxt where the model has it.
    config_name: str = ""
    # The repository folder it is in, with --model-namespacing; else "".
    namespace: str = ""
    # Served under a registered mapping's name (registered.py): its config takes it.
    mapped: bool = False

    @property
    def key(self) -> str:
        return model_key(self.namespace, self.name)


@dataclass(slots=True)
class ModelFiles:
    """What was read from a model folder: its config and the versions to serve."""

    config: model_config_pb2.ModelConfig
    versions: list[int]
    labels: dict[str, list[str]] = field(default_factory=dict)


def not_unique(name: str) -> str:
    """Triton's log line for a model name found in more than one repository."""
    return f"failed to poll model '{name}': not unique across all model repositories"


# Triton's repository-index reason for such a name (MODEL_READY_REASON_DUPLICATE).
DUPLICATE_REASON = "model appears in two or more repositories"


@dataclass(frozen=True, slots=True)
class Scan:
    """What a scan found: the models by key, and the names found in more than one
    repository, which are none of them served (Triton marks them deleted)."""

    models: dict[str, ModelSource]
    duplicates: frozenset[str] = frozenset()


class ModelRepository:
    """One or more repository folders; a model name must be unique across them, unless
    `namespacing` makes each folder a namespace of its own."""

    def __init__(self, paths: list[Path], config_name: str = "", namespacing: bool = False):
        self.paths = paths
        self.config_name = config_name
        self.namespacing = namespacing
        self.registered = RegisteredRepositories()

    def check_paths(self) -> None:
        """ServerError naming the first repository path that is not a folder."""
        for root in self.paths:
            if not root.is_dir():
                raise ServerError(
                    ErrorCode.INVALID_ARG, f"model repository path '{root}' is not a folder"
                )

    def scan(self) -> dict[str, ModelSource]:
        """Every model folder whose key is unique, by its key (namespaces.py)."""
        return self.scan_all().models

    def scan_all(self) -> Scan:
        """Every model folder by its key, and the keys of those in several repositories
        (left out of `models`: which one to serve is not for the server to guess)."""
        found: dict[str, ModelSource] = {}
        duplicates: set[str] = set()
        self.check_paths()
        roots: list[tuple[Path, dict[str, str]]] = [(root, {}) for root in self.paths]
        for root, mapped in roots + self.registered.items():
            for entry in sorted(root.iterdir()) if root.is_dir() else ():
                if not entry.is_dir() or entry.name.startswith("."):
                    continue
                namespace = str(root) if self.namespacing else ""
                name = mapped.get(entry.name, entry.name)
                source = ModelSource(name, entry, self.config_name, namespace, entry.name in mapped)
                if source.key in found:
                    duplicates.add(source.key)
                found.setdefault(source.key, source)
        for key in duplicates:
            del found[key]
        return Scan(found, frozenset(duplicates))


def read_config(
    source: ModelSource,
    config_text: str | None = None,
    override: model_config_pb2.ModelConfig | None = None,
) -> model_config_pb2.ModelConfig:
    """Parse `config.pbtxt` (or an override text or message), or start empty when there is
    none.

    A missing file is fine: auto-complete fills the config from the model file; a folder
    or anything else that is not a regular file in its place fails the load. An
    override replaces `config.pbtxt` entirely, as the load API's `config` does in Triton.
    """
    config = model_config_pb2.ModelConfig()
    if override is not None:
        config.CopyFrom(override)
    elif config_text is None:
        try:
            path = config_path(source)
        except OutsideFolder as exc:
            raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None
        if path.is_file():
            # Triton's TextFormat reads bytes: a Latin-1 byte in a comment is fine there.
            # Undecodable bytes become lone surrogates, which comments skip; in a string
            # value protobuf refuses them with a ParseError, as a str field must be UTF-8.
            config_text = path.read_bytes().decode("utf-8", "surrogateescape")
        elif path.exists():
            # A folder (or a device) in its place is a broken deploy, not "no config":
            # auto-completing one would serve a config nobody wrote.
            raise ServerError(
                ErrorCode.INVALID_ARG, f"{path.name} exists but is not a regular file"
            )
    if override is None and config_text is not None:
        try:
            text_format.Parse(config_text, config)
        except text_format.ParseError as exc:
            why = str(exc)
            if "surrogates not allowed" in why:
                why = f"{exc.GetLine()}:{exc.GetColumn()} : a string value is not valid UTF-8"
            # Other messages may quote a line: its undecodable bytes read as U+FFFD, since
            # a lone surrogate cannot be sent as UTF-8.
            why = why.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise ServerError(
                ErrorCode.INVALID_ARG, f"failed to parse {CONFIG_FILENAME}: {why}"
            ) from None
    if not config.name or source.mapped:
        config.name = source.name
    elif config.name != source.name:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"model name in {CONFIG_FILENAME} ('{config.name}') does not match "
            f"the model folder name ('{source.name}')",
        )
    return config


def config_path(source: ModelSource) -> Path:
    """`configs/<--model-config-name>.pbtxt` when the model has one, as in Triton, else
    `config.pbtxt`; OutsideFolder for either that leads out of the model folder."""
    if source.config_name:
        custom = f"configs/{source.config_name}.pbtxt"
        path = resolve_inside(source.path, custom, custom)
        if path.is_file():
            return path
    return resolve_inside(source.path, CONFIG_FILENAME, CONFIG_FILENAME)


# Versions are int64 in Triton's protocol and config.
_MAX_VERSION = 2**63 - 1


def parse_version(text: str) -> int | None:
    """The version a string names, or None when it names none.

    Only ASCII digits name a version. str.isdigit() also takes superscript two, which
    int() refuses, and the Arabic-Indic digit one, which int() reads as 1. A number past
    int64 names no version either (and int() refuses strings of over 4300 digits).
    """
    if not text or len(text) > 19 or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= _MAX_VERSION else None


def available_versions(model_dir: Path) -> list[int]:
    """Numbered version folders; names that are not numbers or start with '0' are skipped,
    and so are links that lead out of the model folder (where they point is not looked at).
    """
    versions = []
    for entry in model_dir.iterdir():
        name = entry.name
        version = parse_version(name)
        if version is None or name.startswith("0"):
            continue
        try:
            path = resolve_inside(model_dir, name, f"version folder '{name}'", kind="folder")
        except OutsideFolder as exc:
            log.warning("model folder '%s': %s; it is not served", model_dir, exc)
            continue
        if path.is_dir():
            versions.append(version)
    return sorted(versions)


def select_versions(config: model_config_pb2.ModelConfig, model_dir: Path) -> list[int]:
    """Apply the version policy as Triton does; the default is `latest { num_versions: 1 }`.

    A `specific` version with no folder is logged and skipped, and `latest` with
    `num_versions` 0 selects nothing: a repository that loads on Triton loads here, and one
    that fails there fails here, with Triton's message.
    """
    present = available_versions(model_dir)
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = present
    elif choice == "specific":
        chosen = []
        for version in sorted(set(policy.specific.versions)):
            if version in present:
                chosen.append(version)
            else:
                log.error(
                    "version %d is specified for model '%s', but the version directory is "
                    "not present",
                    version,
                    config.name,
                )
    else:
        count = policy.latest.num_versions if choice == "latest" else 1
        chosen = present[-count:] if count > 0 else []
    if not chosen:
        if present:
            why = f"the policy selects none of the version folders {present}"
        else:
            why = "no version folder to serve (a positive number, not starting with 0)"
        raise ServerError(
            ErrorCode.INVALID_ARG,
            "at least one version must be available under the version policy of model "
            f"'{config.name}': {why}",
        )
    return chosen


def label_file(model_dir: Path, output: model_config_pb2.ModelOutput) -> Path:
    """Where an output's `label_filename` is; OutsideFolder when it leaves the folder."""
    name = output.label_filename
    return resolve_inside(model_dir, name, f"label_filename {name!r} of output {output.name!r}")


def read_labels(config: model_config_pb2.ModelConfig, model_dir: Path) -> dict[str, list[str]]:
    """Labels files named by outputs' `label_filename`, one label a line."""
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if output.label_filename:
            try:
                path = label_file(model_dir, output)
            except OutsideFolder as exc:
                raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None
            if not path.is_file():
                raise ServerError(
                    ErrorCode.INVALID_ARG,
                    f"labels file '{output.label_filename}' for output '{output.name}' "
                    "does not exist",
                )
            # Triton's labels are bytes, returned as they are in classification results:
            # undecodable bytes are kept as lone surrogates, which classify() writes back.
            text = path.read_bytes().decode("utf-8", "surrogateescape")
            labels[output.name] = text.splitlines()
    return labels


# Top-level files up to this size are hashed, not just stat'ed, so an edit that keeps the
# size within one timestamp tick (coarse-mtime file systems) is still seen.
_HASH_LIMIT = 1024 * 1024


def fingerprint(model_dir: Path) -> str:
    """A digest of everything in a model folder that a reload would read.

    Every file's relative path, size and mtime, recursively, plus the content of small
    top-level files (`config.pbtxt`, labels, `configs/`). Folders and links whose names
    start with '.' count too: a Kubernetes ConfigMap mounts its files as links into a
    `..data` link that it swaps for one to a new `..<timestamp>` folder, and a load reads
    through such links. Hidden regular files do not: they are the temporary files of
    atomic writers and editors, and a reload for each would be wasted. A symbolic link
    counts by its target text and, where it resolves inside the folder, by what it
    resolves to, as a regular file or folder would; a link that leads out is never
    followed, so nothing outside the folder is looked at (a load refuses such links).
    Blocking: run it off the loop.
    """
    digest = hashlib.sha256()
    seen: set[tuple[int, int]] = set()
    with contextlib.suppress(OSError):
        root = os.stat(model_dir)
        seen.add((root.st_dev, root.st_ino))
    walk = _Walk(model_dir, digest.update, seen)
    walk.folder(str(model_dir), ".")
    return digest.hexdigest()


@dataclass(slots=True)
class _Walk:
    model_dir: Path
    update: Callable[[bytes], None]
    # Folders digested already, by (device, inode): a link back to one of them (a cycle,
    # or a second way to the same files) is counted by its text only.
    seen: set[tuple[int, int]]

    def folder(self, folder: str, rel_root: str) -> None:
        self.update(f"D {rel_root}\n".encode())
        try:
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError:
            return
        subfolders: list[tuple[str, str]] = []
        for entry in entries:
            rel = f"{rel_root}/{entry.name}"
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name.startswith(".") and stat.S_ISREG(info.st_mode):
                continue  # an atomic writer's or an editor's temporary file
            path = entry.path
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = os.readlink(path)
                except OSError:
                    target = ""
                self.update(f"L {rel} {target}\n".encode())
                resolved = self._resolve(rel)
                if resolved is None:
                    continue
                path = str(resolved)
                try:
                    info = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue  # dangling: its text is all there is
            if stat.S_ISDIR(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key not in self.seen:
                    self.seen.add(key)
                    subfolders.append((path, rel))
            elif stat.S_ISREG(info.st_mode):
                self.update(f"F {rel} {info.st_size} {info.st_mtime_ns}\n".encode())
                if rel_root == "." and info.st_size <= _HASH_LIMIT:
                    self._hash(path)
            else:
                # A device or pipe: never opened (a pipe would block), only noted.
                self.update(f"O {rel} {stat.S_IFMT(info.st_mode)}\n".encode())
        for path, rel in subfolders:
            self.folder(path, rel)

    def _resolve(self, rel: str) -> Path | None:
        """Where a link inside the folder leads, or None where it leads out (not followed,
        not even stat'ed) or cannot be read."""
        try:
            return resolve_inside(self.model_dir, rel[2:], rel)
        except (OutsideFolder, OSError):
            return None

    def _hash(self, path: str) -> None:
        try:
            # O_NOFOLLOW: a file swapped for a link since it was looked at is not read.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                self.update(hashlib.sha256(handle.read()).digest())
        except OSError:
            pass


def check_model_name(name: str) -> None:
    """A model name must be usable as one folder name, checked as Triton checks it (core
    model_repository_manager.cc ValidateModelName) on the name with the whitespace at its
    ends trimmed: empty, '..' or holding '/' is refused in its words. '.', a backslash or
    NUL, which Triton lets through to the file system, are refused here in the same words,
    so that every name stays one folder inside the repository."""
    trimmed = name.strip(_WHITESPACE)
    if not trimmed:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            "Model name cannot be empty. Please enter a valid name to deploy.",
        )
    if trimmed in (".", "..") or any(c in trimmed for c in "/\\\x00"):
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"invalid model name '{name}', model name must not contain path traversal characters",
        )


# What boost::trim_copy trims: std::isspace in the C locale.
_WHITESPACE: Final = " \t\n\v\f\r"


# Python 3.11's Path.mkdir(parents=True), os.walk and shutil.rmtree recurse once per
# folder level, and the interpreter stops at 1000 frames: deeper override folders could be
# neither written, read nor removed. No model folder needs anywhere near this depth.
MAX_OVERRIDE_DEPTH = 64


def override_target(root: Path, relative: str) -> Path:
    """Where a `file:<relative>` override goes under `root`, refusing any escape.

    Only plain paths of non-empty components are accepted: no '.', '..' or empty
    components, no backslashes or NUL bytes, and at most MAX_OVERRIDE_DEPTH components.
    A leading '/' is the model folder, as Triton joins `file:/1/model.py` under its
    folder (qa's model_control test loads with that key).
    """
    inside = relative.lstrip("/")
    parts = inside.split("/")
    if len(parts) > MAX_OVERRIDE_DEPTH:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"file override 'file:{relative}' has {len(parts)} path components; at most "
            f"{MAX_OVERRIDE_DEPTH} are allowed",
        )
    bad = (
        not inside
        or any(c in inside for c in "\\\x00")
        or any(part in ("", ".", "..") for part in parts)
    )
    if bad:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"file override 'file:{relative}' must be a relative path inside the model "
            "folder ('..', '.', empty components and backslashes are not allowed)",
        )
    return root.joinpath(*parts)


def write_overrides(root: Path, files: dict[str, bytes]) -> None:
    """Write override files under `root` (a fresh private folder), never outside it.

    Every name is checked before anything is written. Files are created with O_EXCL and
    O_NOFOLLOW, so a name can never be redirected through a symbolic link.
    """
    targets = {relative: override_target(root, relative) for relative in files}
    real_root = os.path.realpath(root)
    for relative, target in sorted(targets.items()):
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            real_parent = os.path.realpath(target.parent)
            if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
                raise ServerError(
                    ErrorCode.INVALID_ARG, f"file override 'file:{relative}' escapes the folder"
                )
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(target, flags, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(files[relative])
        except OSError as exc:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"file override 'file:{relative}' could not be written: {exc.strerror}",
            ) from None


class OverrideFolderText:
    """Rewrites a load failure's text so that it does not show the private folder that
    holds the `file:` overrides (a path under the server's temp folder, and deleted by
    the time anyone reads it): a file in it reads as the `file:` name the client gave,
    the folder itself as "the 'file:' overrides"."""

    def __init__(self, folder: Path | None) -> None:
        self._roots: list[str] = []
        if folder is not None:
            # Longest first, so that a resolved form that extends the other wins.
            forms = {str(folder), str(folder.resolve())}
            self._roots = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for root in self._roots:
            text = text.replace(root + os.sep, "file:").replace(root, "the 'file:' overrides")
        return text
