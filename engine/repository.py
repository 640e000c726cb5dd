"""The model repository: `<root>/<model>/config.pbtxt` plus `<root>/<model>/<version>/model.onnx|model.plan`.

Reads a model directory into a ModelSpec. config.pbtxt is the protobuf text format of inference.ModelConfig
(the subset in proto/model_config.proto); fields of Triton's full message that slotserve does not know are
skipped with a warning, so configurations written for Triton load. A JSON override (RepositoryModelLoad's
`config` parameter) replaces config.pbtxt as a whole, as in Triton.

Where model files may be (ModelRoots): every path a model names (its directory, a management request's `source`,
config.pbtxt, the model file, `default_model_filename`, a backend's file parameter such as TensorRT's
`trt_cache_dir`) is resolved, symbolic links followed, and must land inside the repository or inside a root the
operator allowed (--allow-model-root); anything else is refused with ModelConfigError naming the field, before
the file is opened. Messages for clients show paths relative to the repository (`shown`, `hide_paths`), never the
server's absolute paths.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format, text_format

from generated import model_config_pb2

from . import datatypes
from .errors import ModelConfigError
from .interface import BatchingSpec, ModelSpec, TensorSpec

_LOG = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

# platform strings of Triton and the backend each one selects
_PLATFORM_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
}
_BACKEND_PLATFORM = {
    "onnxruntime": "onnxruntime_onnx",
    "tensorrt": "tensorrt_plan",
    "fixture": "fixture",
    "python": "python",
}
_DEFAULT_FILE = {"onnxruntime": "model.onnx", "tensorrt": "model.plan", "python": "model.py"}
KNOWN_BACKENDS = ("onnxruntime", "tensorrt", "python", "fixture")
ALLOW_ROOT_FLAG = "--allow-model-root"
# The folder part of an absolute path in free text ("/srv/models/" in "/srv/models/m/1/model.onnx"), not preceded
# by a character that would make it the tail of a relative path ("1/model.onnx") or of a word.
_ABSOLUTE_FOLDERS = re.compile(r"(?<![\w.~-])/(?:[^\s/'\"]+/)+")


@dataclass(frozen=True)
class ModelRoots:
    """Where a model's files may be: inside the repository, or inside a root the operator allowed with
    --allow-model-root. Both are kept resolved (symbolic links followed), so a check compares real places."""

    repository: Path
    allowed: tuple[Path, ...] = ()

    @classmethod
    def of(cls, repository: Path | str, allowed: Iterable[Path | str] = ()) -> ModelRoots:
        return cls(Path(repository).resolve(), tuple(Path(root).resolve() for root in allowed))

    def resolve(self, path: Path | str, field: str, *, origin: str, base: Path | None = None) -> Path:
        """The real path of `path` (relative ones are taken from `base`, default the repository), symbolic links
        followed. Does not block beyond the file system calls; does not need the file to exist (the caller says
        "not found" by name), so an outside path is refused whether or not it exists.

        Raises ModelConfigError naming `field` (with `origin`, "model 'x'") unless the real path is inside the
        repository or an allowed root: an absolute path, `..` steps or a symbolic link that lead elsewhere.
        """
        given = Path(path)
        candidate = given if given.is_absolute() else (base or self.repository) / given
        real = candidate.resolve()  # as the OS will open it: `..` after a link goes up from the link's target
        if self._root_of(real) is not None:
            return real
        lexical = Path(os.path.normpath(candidate))
        if self._root_of(lexical) is not None:
            # Inside by its name, outside in fact: say which link to look at, never where it leads.
            what = f"{field} '{self.shown(lexical)}' leads outside through a symbolic link: it"
        else:
            what = f"{field} '{given.as_posix()}'"  # the caller's own words (a request's, or config.pbtxt's)
        raise ModelConfigError(
            f"{origin}: {what} must be inside the model repository or a root allowed with {ALLOW_ROOT_FLAG}"
        )

    def shown(self, path: Path) -> str:
        """`path` as a client may read it: relative to the repository ("m/1/model.onnx"), or to an allowed root,
        named by its last folder ("shared/m/1/model.onnx"); elsewhere only its name. Never an absolute path."""
        root = self._root_of(path)
        if root is None:
            return path.name
        relative = path.relative_to(root).as_posix()
        if root == self.repository:
            return relative
        return root.name if relative == "." else f"{root.name}/{relative}"

    def hide(self, text: str) -> str:
        """`text` (an error from a library: ONNX Runtime, TensorRT, the OS) with the roots written relative as in
        `shown`, and the folders of any other absolute path removed (its name stays)."""
        for root in sorted((self.repository, *self.allowed), key=lambda r: len(str(r)), reverse=True):
            label = "" if root == self.repository else f"{root.name}/"
            text = text.replace(f"{root}{os.sep}", label)
        return hide_paths(text)

    def _root_of(self, path: Path) -> Path | None:
        for root in (self.repository, *self.allowed):
            if path == root or root in path.parents:
                return root
        return None


def hide_paths(text: str, roots: ModelRoots | None = None) -> str:
    """`text` without the folders of absolute paths: relative to the repository where `roots` knows it, the bare
    file name otherwise. For messages that quote a library's error to a client."""
    if roots is not None:
        return roots.hide(text)
    return _ABSOLUTE_FOLDERS.sub("", text)


def shown_path(path: Path, roots: ModelRoots | None) -> str:
    """`path` relative to the repository (ModelRoots.shown); its name alone for a spec read from no repository."""
    return roots.shown(path) if roots is not None else path.name


def check_model_name(name: str) -> None:
    """Raise ModelConfigError unless `name` is a usable model id (letters, digits, `_.-`; no path parts)."""
    if not _MODEL_NAME.match(name or ""):
        raise ModelConfigError(
            f"invalid model name {name!r}: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )


def parse_config_text(text: str, origin: str) -> model_config_pb2.ModelConfig:
    """Parse config.pbtxt text. Unknown fields are skipped with a warning; other errors raise ModelConfigError."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
        return config
    except text_format.ParseError as strict_error:
        if "has no field named" not in str(strict_error):
            raise ModelConfigError(f"{origin}: {strict_error}") from None
        unknown = str(strict_error)
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config, allow_unknown_field=True)
    except text_format.ParseError as error:
        raise ModelConfigError(f"{origin}: {error}") from None
    _LOG.warning("%s: settings slotserve does not support were ignored (first: %s)", origin, unknown)
    return config


def parse_config_json(text: str, origin: str) -> model_config_pb2.ModelConfig:
    """Parse a JSON ModelConfig override. Unknown fields and bad values raise ModelConfigError."""
    config = model_config_pb2.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError) as error:
        raise ModelConfigError(f"{origin}: invalid JSON model configuration: {error}") from None
    return config


def _tensor_specs(entries, kind: str, origin: str) -> tuple[TensorSpec, ...]:
    enum = model_config_pb2.DataType
    specs = []
    for entry in entries:
        if not entry.name:
            raise ModelConfigError(f"{origin}: an {kind} has no name")
        config_name = enum.Name(entry.data_type)
        datatype = datatypes.BY_CONFIG_NAME.get(config_name)
        if datatype is None:
            raise ModelConfigError(f"{origin}: {kind} '{entry.name}' has no valid data_type ({config_name})")
        dims = tuple(int(d) for d in entry.dims)
        if any(d < -1 or d == 0 for d in dims):
            raise ModelConfigError(f"{origin}: {kind} '{entry.name}' has invalid dims {list(dims)}")
        specs.append(TensorSpec(entry.name, datatype.name, dims, bool(getattr(entry, "optional", False))))
    return tuple(specs)


def _refuse_unsupported_scheduling(config: model_config_pb2.ModelConfig, origin: str) -> None:
    """Scheduling settings slotserve does not implement are refused by name, never skipped: a model that asks
    for them would otherwise run with a behaviour it did not ask for."""

    def refuse(field: str, why: str) -> None:
        raise ModelConfigError(f"{origin}: {field} is not supported by slotserve ({why})")

    if config.HasField("sequence_batching"):
        refuse("sequence_batching", "stateful sequences are not implemented; use dynamic_batching or none")
    if config.model_transaction_policy.decoupled:
        refuse(
            "model_transaction_policy.decoupled",
            "every request gets one response, or a stream of them from a model that streams (ModelStreamInfer)",
        )
    if config.HasField("ensemble_scheduling"):
        refuse("ensemble_scheduling", "ensembles are not implemented; call the models one after the other")
    for tensor in config.input:
        if tensor.allow_ragged_batch:
            refuse(f"input '{tensor.name}' allow_ragged_batch", "ragged batching is not implemented")
    if not config.HasField("dynamic_batching"):
        return
    batching = config.dynamic_batching
    if batching.priority_levels or batching.default_priority_level:
        refuse("dynamic_batching.priority_levels", "requests are served in arrival order, one level")
    if batching.priority_queue_policy:
        refuse("dynamic_batching.priority_queue_policy", "requests are served in arrival order, one level")
    if batching.default_queue_policy.timeout_action != model_config_pb2.ModelQueuePolicy.REJECT:
        refuse(
            "dynamic_batching.default_queue_policy.timeout_action DELAY",
            "a request whose admission timeout passes is refused (REJECT)",
        )


MAX_QUEUE_DELAY_US = 60_000_000  # dynamic_batching.max_queue_delay_microseconds: more is a unit mistake


def _batching_spec(config: model_config_pb2.ModelConfig, origin: str) -> BatchingSpec | None:
    """The dynamic batching settings of a model, or None when it runs one request per engine call. Raises
    ModelConfigError for values that cannot work (a preferred size outside 1..max_batch_size)."""
    if not config.HasField("dynamic_batching"):
        return None
    if config.max_batch_size == 0:
        _LOG.warning(
            "%s: dynamic_batching ignored: max_batch_size is 0, so requests have no batch dimension to stack along",
            origin,
        )
        return None
    block = config.dynamic_batching
    preferred = sorted(set(int(size) for size in block.preferred_batch_size))
    for size in preferred:
        if not 1 <= size <= config.max_batch_size:
            raise ModelConfigError(
                f"{origin}: dynamic_batching.preferred_batch_size {size} is outside 1..{config.max_batch_size} "
                "(max_batch_size)"
            )
    if block.max_queue_delay_microseconds > MAX_QUEUE_DELAY_US:
        # A batch waits for members until its earliest deadline; without one it would wait this long.
        raise ModelConfigError(
            f"{origin}: dynamic_batching.max_queue_delay_microseconds must be 0..{MAX_QUEUE_DELAY_US} (a minute), "
            f"got {block.max_queue_delay_microseconds}"
        )
    has_policy = block.HasField("default_queue_policy")
    policy = block.default_queue_policy
    return BatchingSpec(
        max_queue_delay_us=int(block.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(preferred),
        preserve_ordering=block.preserve_ordering,
        max_queue_size=int(policy.max_queue_size),
        default_timeout_us=int(policy.default_timeout_microseconds),
        # Without a policy block a request's `timeout` shortens the admission timeout, as on every other model.
        allow_timeout_override=policy.allow_timeout_override if has_policy else True,
    )


def _select_backend(config: model_config_pb2.ModelConfig, version_dir: Path | None, origin: str) -> str:
    if config.backend:
        if config.backend not in KNOWN_BACKENDS:
            raise ModelConfigError(
                f"{origin}: unknown backend '{config.backend}'; slotserve has {', '.join(KNOWN_BACKENDS)}"
            )
        return config.backend
    if config.platform:
        backend = _PLATFORM_BACKEND.get(config.platform)
        if backend is None:
            raise ModelConfigError(
                f"{origin}: unsupported platform '{config.platform}'; use one of {sorted(_PLATFORM_BACKEND)}"
            )
        return backend
    if version_dir is not None:
        if (version_dir / "model.onnx").exists():
            return "onnxruntime"
        if (version_dir / "model.plan").exists():
            return "tensorrt"
    raise ModelConfigError(f"{origin}: no backend or platform set and no model.onnx or model.plan found")


def _latest_version(directory: Path) -> tuple[str, Path | None]:
    versions = sorted((int(p.name), p) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        return "1", None
    number, path = versions[-1]
    return str(number), path


def spec_from_config(
    name: str,
    directory: Path | None,
    config: model_config_pb2.ModelConfig,
    backend: str | None = None,
    *,
    roots: ModelRoots,
) -> ModelSpec:
    """Build a ModelSpec from a parsed config. `backend` (a management request's choice) overrides the
    config's; the model file must resolve inside `roots`. Raises ModelConfigError naming the problem."""
    origin = f"model '{name}'"
    check_model_name(name)
    if config.name and config.name != name:
        raise ModelConfigError(f"{origin}: config.pbtxt names the model '{config.name}'")
    if config.max_batch_size < 0:
        raise ModelConfigError(f"{origin}: max_batch_size must be >= 0, got {config.max_batch_size}")
    _refuse_unsupported_scheduling(config, origin)
    batching = _batching_spec(config, origin)
    version, version_dir = _latest_version(directory) if directory is not None else ("1", None)
    if backend:
        if backend not in KNOWN_BACKENDS:
            raise ModelConfigError(f"{origin}: unknown backend '{backend}'; slotserve has {', '.join(KNOWN_BACKENDS)}")
    else:
        backend = _select_backend(config, version_dir, origin)
    model_file = None
    if backend in _DEFAULT_FILE:
        if version_dir is None:
            raise ModelConfigError(f"{origin}: no numeric version directory (e.g. 1/) with a model file")
        model_file = _model_file(config, backend, version_dir, roots, origin)
    instance_count = None
    if config.instance_group:
        count = config.instance_group[0].count
        if count < 0:
            raise ModelConfigError(f"{origin}: instance_group count must be positive, got {count}")
        instance_count = count or None
    final = model_config_pb2.ModelConfig()
    final.CopyFrom(config)
    final.name = name
    final.backend = backend
    final.platform = config.platform or _BACKEND_PLATFORM[backend]
    return ModelSpec(
        name=name,
        backend=backend,
        version=version,
        directory=directory,
        model_file=model_file,
        platform=final.platform,
        max_batch_size=int(config.max_batch_size),
        inputs=_tensor_specs(config.input, "input", origin),
        outputs=_tensor_specs(config.output, "output", origin),
        instance_count=instance_count,
        parameters={key: value.string_value for key, value in config.parameters.items()},
        batching=batching,
        config=final,
        roots=roots,
    )


def _model_file(
    config: model_config_pb2.ModelConfig, backend: str, version_dir: Path, roots: ModelRoots, origin: str
) -> Path:
    """The model file's real path, checked inside `roots` before anything looks at it. Raises
    ModelConfigError for a file outside them or a missing one (named relative to the repository)."""
    field = "default_model_filename" if config.default_model_filename else "model file"
    filename = config.default_model_filename or _DEFAULT_FILE[backend]
    candidates = [filename]
    if backend == "tensorrt" and not config.default_model_filename:
        candidates.append("model.onnx")  # without a plan TensorRT builds (and caches) an engine from ONNX
    for candidate in candidates:
        model_file = roots.resolve(
            candidate, field if candidate == filename else "model file", origin=origin, base=version_dir
        )
        if model_file.exists():
            return model_file
    raise ModelConfigError(f"{origin}: model file {roots.shown(version_dir / filename)} not found")


class ModelRepository:
    """A folder of model directories. Reading is stateless: every call looks at the files again.

    `allowed_roots` (--allow-model-root) are further folders a model's files may be in; see ModelRoots."""

    def __init__(self, root: Path | str, allowed_roots: Iterable[Path | str] = ()) -> None:
        self.roots = ModelRoots.of(root, allowed_roots)
        self.root = self.roots.repository

    def names(self) -> list[str]:
        """Model directory names, sorted. A directory counts if it holds config.pbtxt or a version folder."""
        if not self.root.is_dir():
            return []
        found = []
        for path in sorted(self.root.iterdir()):
            if not path.is_dir() or not _MODEL_NAME.match(path.name):
                continue
            if (path / CONFIG_FILE).exists() or any(p.is_dir() and p.name.isdigit() for p in path.iterdir()):
                found.append(path.name)
        return found

    def resolve_source(self, source: str, origin: str) -> Path:
        """A management request's `source`: relative to the repository root, or absolute; its real path must
        be inside the repository or an allowed root (ModelRoots.resolve raises ModelConfigError otherwise)."""
        return self.roots.resolve(source, "source", origin=origin)

    def read(self, name: str, *, source: str = "", config_json: str = "", backend: str = "") -> ModelSpec:
        """Read model `name` from `source` (default: its directory in the repository).

        `config_json` replaces config.pbtxt. Raises ModelConfigError when the directory, the configuration or
        the model file is missing, invalid, or outside the repository and the allowed roots.
        """
        check_model_name(name)
        origin = f"model '{name}'"
        if source:
            directory = self.resolve_source(source, origin)
        else:
            directory = self.roots.resolve(name, "model directory", origin=origin)
        if not directory.is_dir():
            raise ModelConfigError(f"{origin}: no model directory at '{self.roots.shown(directory)}'")
        if config_json:
            config = parse_config_json(config_json, origin)
        else:
            config_path = self.roots.resolve(directory / CONFIG_FILE, CONFIG_FILE, origin=origin)
            if config_path.exists():
                config = parse_config_text(config_path.read_text(), f"{origin} ({CONFIG_FILE})")
            else:
                config = model_config_pb2.ModelConfig()
        return spec_from_config(name, directory, config, backend or None, roots=self.roots)
