"""The model repository: `<root>/<model>/config.pbtxt` plus `<root>/<model>/<version>/model.onnx|model.plan`.

Reads a model directory into a ModelSpec. config.pbtxt is the protobuf text format of inference.ModelConfig
(the subset in proto/model_config.proto); fields of Triton's full message that slotserve does not know are
skipped with a warning, so configurations written for Triton load. A JSON override (RepositoryModelLoad's
`config` parameter) replaces config.pbtxt as a whole, as in Triton.

Every path a model names must resolve inside the repository or a root the operator allowed (engine/config/files.py,
ModelRoots). What each field of config.pbtxt gets (applied, refused, ignored) is engine/config/fields.py's table;
the `sequence_batching`, `ensemble_scheduling` and `model_warmup` blocks are read by their own modules beside this
one.
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

from .. import datatypes
from ..errors import ModelConfigError
from .ensemble_graph import ensembles_after_their_steps, read_steps
from .fields import classify_fields, judge_config
from .files import (
    EXECUTION_ENV_PARAMETER,
    ModelRoots,
    archive_stamp,
    check_regular_file,
    files_stamp,
    read_regular_text,
)
from .rate_limiter import read_rate_limiter
from .sequence_batching import oldest_batching, read_sequence_spec
from .specs import BatchingSpec, ModelSpec, PrioritySpec, QueuePolicySpec, TensorSpec, VersionPolicy
from .warmup import read_warmup_samples

_LOG = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # matched whole (fullmatch): "m\n" is no name

# platform strings of Triton and the backend each one selects
_PLATFORM_BACKEND = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "ensemble": "ensemble",
}
_BACKEND_PLATFORM = {
    "onnxruntime": "onnxruntime_onnx",
    "tensorrt": "tensorrt_plan",
    "fixture": "fixture",
    "python": "python",
    "ensemble": "ensemble",
}
_DEFAULT_FILE = {"onnxruntime": "model.onnx", "tensorrt": "model.plan", "python": "model.py"}
KNOWN_BACKENDS = ("onnxruntime", "tensorrt", "python", "fixture", "ensemble")


def is_version_number(text: str) -> bool:
    """A version as a request names it: ASCII digits only. str.isdigit alone also takes "²" and other Unicode
    digits, which int() refuses (a request naming version "²" was an internal error)."""
    return text.isascii() and text.isdigit()


MAX_VERSION = (1 << 63) - 1  # Triton's versions are int64


def folder_version(name: str) -> int | None:
    """The version a folder's name gives, or None when the folder is not a version folder. As Triton 2.51: ASCII
    digits, without leading zeros ("01" and "007" are not versions; "0" is), within int64. Where Triton reads a
    number off the front ("1a", "-1", "+3", " 4" become 1, -1, 3, 4) and then never finishes loading that version,
    and where it stops on a number past int64, slotserve leaves the folder out: it is no version
    (tests/differential/test_version_folders.py)."""
    if not is_version_number(name) or (len(name) > 1 and name.startswith("0")):
        return None
    version = int(name)
    return version if version <= MAX_VERSION else None


def check_model_name(name: str) -> None:
    """Raise ModelConfigError unless `name` is a usable model id (letters, digits, `_.-`; no path parts): matched
    whole, so a name with a trailing newline, a `/` or 129 characters is refused before anything uses it."""
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise ModelConfigError(
            f"invalid model name {name!r}: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )


def parse_config_text(text: str, origin: str) -> model_config_pb2.ModelConfig:
    """Parse config.pbtxt text with Triton's whole ModelConfig message (proto/model_config.proto), so every valid
    Triton configuration parses, list syntax included. A syntax error, or a field Triton's message does not have,
    raises ModelConfigError with protobuf's line and column. What the fields ask for is judged afterwards
    (`classify_fields`)."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise ModelConfigError(f"{origin}: {error}") from None
    return config


def parse_config_json(text: str, origin: str) -> model_config_pb2.ModelConfig:
    """Parse a JSON ModelConfig override. Unknown fields and bad values raise ModelConfigError."""
    config = model_config_pb2.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError) as error:
        raise ModelConfigError(f"{origin}: invalid JSON model configuration: {error}") from None
    return config


def _tensor_specs(
    entries: Iterable[model_config_pb2.ModelInput] | Iterable[model_config_pb2.ModelOutput], kind: str, origin: str
) -> tuple[TensorSpec, ...]:
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


def _judge_fields(
    config: model_config_pb2.ModelConfig, origin: str, more_refused: Iterable[tuple[str, str]] = ()
) -> None:
    """Raise ModelConfigError naming every refused field of `config`; log one warning naming every ignored one.
    A model that asks for what slotserve does not do is refused rather than run with a behaviour it did not ask
    for; settings that only tune (or describe) are ignored, and said so."""
    judged = judge_config(config, more_refused)
    if judged.refused:
        listed = "; ".join(f"{path}: {reason}" for path, reason in judged.refused)
        raise ModelConfigError(f"{origin}: configuration refused: {listed}")
    if judged.ignored:
        _LOG.warning(
            "%s: settings ignored: %s",
            origin,
            "; ".join(f"{path} ignored: {reason}" for path, reason in judged.ignored),
        )


MAX_QUEUE_DELAY_US = 60_000_000  # dynamic_batching.max_queue_delay_microseconds: more is a unit mistake


def _batching_spec(config: model_config_pb2.ModelConfig, origin: str) -> BatchingSpec | None:
    """The dynamic batching settings of a model, or None when it runs one request per engine call. Raises
    ModelConfigError for values that cannot work (a preferred size outside 1..max_batch_size)."""
    if not config.HasField("dynamic_batching"):
        return None
    if config.max_batch_size == 0:
        return None  # _judge_fields warns: there is no batch dimension to stack along
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
    priorities = _priority_spec(block, config.name, origin)
    if priorities is not None:  # every limit depends on the request's level: the admission core applies them
        return BatchingSpec(
            max_queue_delay_us=int(block.max_queue_delay_microseconds),
            preferred_batch_sizes=tuple(preferred),
            preserve_ordering=block.preserve_ordering,
            priorities=priorities,
        )
    return BatchingSpec(
        max_queue_delay_us=int(block.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(preferred),
        preserve_ordering=block.preserve_ordering,
        max_queue_size=int(policy.max_queue_size),
        default_timeout_us=int(policy.default_timeout_microseconds),
        # Without a policy block a request's `timeout` shortens the admission timeout, as on every other model.
        allow_timeout_override=policy.allow_timeout_override if has_policy else True,
    )


def _priority_spec(block: model_config_pb2.ModelDynamicBatching, model: str, origin: str) -> PrioritySpec | None:
    """The priority levels and queue policies of a dynamic_batching block, or None when it has one level and
    refuses requests past their timeout (the plain settings of BatchingSpec then say it all). Raises
    ModelConfigError with Triton's words for a default level or a policy's level outside 1..priority_levels."""
    levels = int(block.priority_levels)
    delays = block.default_queue_policy.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY
    if levels == 0 and not delays:
        return None
    policies: tuple[tuple[int, QueuePolicySpec], ...] = ()
    if levels > 0:
        if not 1 <= block.default_priority_level <= levels:
            raise ModelConfigError(f"{origin}: default priority level must be in range [1, {levels}] for {model}")
        for level in sorted(block.priority_queue_policy):
            if not 1 <= level <= levels:
                raise ModelConfigError(
                    f"{origin}: priority queue policy must have priority level in range [1, {levels}] for {model}"
                )
        policies = tuple(
            (int(level), _queue_policy(block.priority_queue_policy[level], explicit=True))
            for level in sorted(block.priority_queue_policy)
        )
    return PrioritySpec(
        levels=levels,
        default_level=int(block.default_priority_level) if levels > 0 else 0,
        default_policy=_queue_policy(block.default_queue_policy, explicit=block.HasField("default_queue_policy")),
        policies=policies,
    )


def _queue_policy(policy: model_config_pb2.ModelQueuePolicy, *, explicit: bool) -> QueuePolicySpec:
    """One ModelQueuePolicy. Without a block (`explicit` False) a request's `timeout` may shorten the wait, as on a
    model without levels."""
    return QueuePolicySpec(
        max_queue_size=int(policy.max_queue_size),
        default_timeout_us=int(policy.default_timeout_microseconds),
        allow_timeout_override=policy.allow_timeout_override if explicit else True,
        delay=policy.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY,
    )


# Backends and platforms of Triton that slotserve will build, refused by name until then.
_NOT_YET: dict[str, dict[str, str]] = {}


def _not_yet(config: model_config_pb2.ModelConfig) -> list[tuple[str, str]]:
    """(field, reason) for a backend or platform of Triton's that slotserve does not run yet."""
    found = []
    for field, names in _NOT_YET.items():
        value = getattr(config, field)
        if value in names:
            found.append((f"{field} '{value}'", f"not supported yet: {names[value]}"))
    return found


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
    if config.default_model_filename == _DEFAULT_FILE["python"]:
        return "python"  # as Triton completes a configuration that names model.py
    if version_dir is not None:
        # As Triton 2.51 fills `backend` when the configuration (or its absence) leaves it out: by the file the
        # version folder holds. A folder with only 1/model.py is a python model (python_backend's auto_complete).
        for backend in ("onnxruntime", "tensorrt", "python"):
            if (version_dir / _DEFAULT_FILE[backend]).exists():
                return backend
    raise ModelConfigError(f"{origin}: no backend or platform set and no model.onnx, model.plan or model.py found")


def _version_folders(directory: Path | None, origin: str = "model") -> dict[int, Path]:
    """The numbered version folders of a model directory, by number (folder_version: "01" is not one). Raises
    ModelConfigError when the directory cannot be listed."""
    if directory is None:
        return {}
    try:
        children = list(directory.iterdir())
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot list its folder {directory.name}: {error.strerror}") from None
    found = {}
    for path in children:
        version = folder_version(path.name)
        if version is not None and path.is_dir():
            found[version] = path
    return found


def _version_policy(config: model_config_pb2.ModelConfig, origin: str) -> VersionPolicy:
    """config.pbtxt's `version_policy` (default: the latest one). Raises ModelConfigError for num_versions 0."""
    if not config.HasField("version_policy"):
        return VersionPolicy()
    block = config.version_policy
    choice = block.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(kind="all")
    if choice == "specific":
        return VersionPolicy(kind="specific", versions=tuple(sorted(set(int(v) for v in block.specific.versions))))
    count = block.latest.num_versions if choice == "latest" else 1
    if count < 1:
        raise ModelConfigError(f"{origin}: version_policy.latest.num_versions must be at least 1, got {count}")
    return VersionPolicy(kind="latest", num_versions=count)


def _version_refusals(policy: VersionPolicy, folders: dict[int, Path]) -> list[tuple[str, str]]:
    """A policy that selects none of the version folders serves nothing: refused by name (Triton fails the load)."""
    if folders and not policy.select(folders):
        return [("version_policy", f"selects none of the version folders {sorted(folders)}")]
    return []


def _other_refusals(
    config: model_config_pb2.ModelConfig, policy: VersionPolicy, folders: dict[int, Path], backend: str | None
) -> list[tuple[str, str]]:
    """Refusals that are not a field's own rule: a backend or platform not run yet, a version policy, a decoupled
    model of a backend other than python."""
    return [
        *_not_yet(config),
        *_version_refusals(policy, folders),
        *_decoupled_refusals(config, backend),
        *_sequence_refusals(config),
    ]


def _sequence_refusals(config: model_config_pb2.ModelConfig) -> list[tuple[str, str]]:
    """A decoupled or caching sequence model is refused by name: a sequence's requests answer once each, in
    order, from the state its earlier requests left."""
    if not config.HasField("sequence_batching"):
        return []
    found = []
    if config.model_transaction_policy.decoupled:
        found.extend(_decoupled_sequence_refusals(config))
    if config.response_cache.enable:
        found.append(("response_cache", "not with sequence_batching: a sequence's answers depend on its state"))
    return found


def _decoupled_sequence_refusals(config: model_config_pb2.ModelConfig) -> list[tuple[str, str]]:
    """A decoupled sequence model streams each request's responses from its sequence's slot (docs/sequences.md);
    refused where that cannot be: `oldest` batching the requests of several sequences, and implicit state (no
    response of a stream is the one whose state output is kept)."""
    block = config.sequence_batching
    found = []
    if block.WhichOneof("strategy_choice") == "oldest" and config.max_batch_size > 0:
        found.append(
            (
                "sequence_batching.oldest",
                "not supported for a decoupled model (model_transaction_policy) with max_batch_size > 0: its "
                "requests are batched, and a batch does not stream; use direct, or max_batch_size 0",
            )
        )
    if block.state:
        found.append(("sequence_batching.state", "not supported for a decoupled model (model_transaction_policy)"))
    return found


def _decoupled_refusals(config: model_config_pb2.ModelConfig, backend: str | None) -> list[tuple[str, str]]:
    """Only python models answer through response senders; another backend's decoupled model is refused. An
    ensemble's flag is Triton's to set: decoupled exactly when a step is (service/request_path/ensemble.py), whatever it
    says."""
    if not config.model_transaction_policy.decoupled or (backend or config.backend) == "python":
        return []
    if config.platform == "ensemble":
        return []
    return [
        (
            "model_transaction_policy.decoupled",
            "not supported for this backend: only python models are decoupled (docs/python-models.md); every "
            "other request gets one response, or a stream of them from a model that streams (ModelStreamInfer)",
        )
    ]


def served_versions(config: model_config_pb2.ModelConfig, directory: Path | None) -> tuple[int, ...]:
    """The version folders `config`'s version_policy serves in `directory`, highest first; (1,) for a model with
    no version folder (a backend that needs no file); possibly none. Raises ModelConfigError for a policy that cannot
    be read."""
    folders = _version_folders(directory)
    if not folders:
        return (1,)
    return _version_policy(config, "version_policy").select(folders)


def spec_from_config(
    name: str,
    directory: Path | None,
    config: model_config_pb2.ModelConfig,
    backend: str | None = None,
    *,
    roots: ModelRoots,
    version: int | None = None,
) -> ModelSpec:
    """Build a ModelSpec from a parsed config for one version folder: `version`, or by default the highest one
    the version policy selects (see `served_versions`). `backend` (a management request's choice) overrides the
    config's; the model file must resolve inside `roots`. Raises ModelConfigError naming the problem."""
    origin = f"model '{name}'"
    check_model_name(name)
    if config.name and config.name != name:
        raise ModelConfigError(f"{origin}: config.pbtxt names the model '{config.name}'")
    if config.max_batch_size < 0:
        raise ModelConfigError(f"{origin}: max_batch_size must be >= 0, got {config.max_batch_size}")
    folders = _version_folders(directory, origin)
    policy = _version_policy(config, origin)
    _judge_fields(config, origin, _other_refusals(config, policy, folders, backend))
    batching = _batching_spec(config, origin) or oldest_batching(config, origin)
    if config.platform == "ensemble" or config.backend == "ensemble" or config.HasField("ensemble_scheduling"):
        _check_ensemble(config, backend, origin)
    if version is None:
        version = policy.select(folders)[0] if folders else 1
    if folders and version not in folders:
        raise ModelConfigError(f"{origin}: no version folder {version}/ (the folders are {sorted(folders)})")
    version_dir = folders.get(version)
    if backend:
        if backend not in KNOWN_BACKENDS:
            raise ModelConfigError(f"{origin}: unknown backend '{backend}'; slotserve has {', '.join(KNOWN_BACKENDS)}")
    else:
        backend = _select_backend(config, version_dir, origin)
    model_file, file_name = None, ""
    if backend in _DEFAULT_FILE:
        if version_dir is None:
            raise ModelConfigError(f"{origin}: no numeric version directory (e.g. 1/) with a model file")
        model_file, file_name = _model_file(config, backend, version_dir, roots, origin)
    files = files_stamp(version_dir, model_file, origin=origin, roots=roots, skip=_cache_folders(config, roots))
    if backend == "python" and EXECUTION_ENV_PARAMETER in config.parameters:  # a changed archive: a changed model
        files += archive_stamp(config.parameters[EXECUTION_ENV_PARAMETER].string_value, directory)
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
    # As Triton completes it: the model file's name, so that the ModelConfig answer, sent back as a load's
    # `config`, finds the same file (a python model's answer said model.plan, and such a load failed).
    final.default_model_filename = config.default_model_filename or file_name
    inputs = _tensor_specs(config.input, "input", origin)
    sequence = read_sequence_spec(config, directory, roots, origin)
    return ModelSpec(
        name=name,
        backend=backend,
        version=str(version),
        directory=directory,
        model_file=model_file,
        files=files,
        platform=final.platform,
        max_batch_size=int(config.max_batch_size),
        inputs=inputs,
        outputs=_tensor_specs(config.output, "output", origin),
        instance_count=instance_count,
        parameters={key: value.string_value for key, value in config.parameters.items()},
        batching=batching,
        version_policy=policy,
        warmup=read_warmup_samples(config, inputs, directory, roots, origin),
        response_cache=config.response_cache.enable,
        sequence=sequence,
        rate_limiter=read_rate_limiter(config, origin),
        config=final,
        roots=roots,
    )


def _cache_folders(config: model_config_pb2.ModelConfig, roots: ModelRoots) -> tuple[Path, ...]:
    """Folders the engine writes itself, left out of the files stamp: TensorRT's plan cache (`trt_cache_dir`,
    relative to the repository) should it lie in a version folder."""
    cache = config.parameters["trt_cache_dir"].string_value if "trt_cache_dir" in config.parameters else ""
    return (roots.repository / cache,) if cache else ()


def _check_ensemble(config: model_config_pb2.ModelConfig, backend: str | None, origin: str) -> None:
    """An ensemble is `platform: "ensemble"` with `ensemble_scheduling` whose steps form a valid graph
    (engine/config/ensemble_graph.py read_steps); raises ModelConfigError naming the problem."""
    if config.platform != "ensemble" and config.backend != "ensemble" and backend != "ensemble":
        raise ModelConfigError(f'{origin}: ensemble_scheduling needs platform: "ensemble"')
    if backend and backend != "ensemble":
        raise ModelConfigError(f"{origin}: an ensemble runs on the ensemble backend, not '{backend}'")
    read_steps(config, origin)


def _model_file(
    config: model_config_pb2.ModelConfig, backend: str, version_dir: Path, roots: ModelRoots, origin: str
) -> tuple[Path, str]:
    """The model file's real path, checked inside `roots` before anything looks at it, and the name it was found
    by in the version folder (`default_model_filename`, or the backend's default). Raises ModelConfigError for a
    file outside them, a missing one (named relative to the repository) or one that is no regular file."""
    field = "default_model_filename" if config.default_model_filename else "model file"
    filename = config.default_model_filename or _DEFAULT_FILE[backend]
    candidates = [filename]
    if backend == "tensorrt" and not config.default_model_filename:
        candidates.append("model.onnx")  # without a plan TensorRT builds (and caches) an engine from ONNX
    for candidate in candidates:
        model_file = roots.resolve(
            candidate, field if candidate == filename else "model file", origin=origin, base=version_dir
        )
        if os.path.lexists(model_file):
            check_regular_file(model_file, origin, roots)  # a folder or a FIFO named model.onnx is named so
            return model_file, candidate
    raise ModelConfigError(f"{origin}: model file {roots.shown(version_dir / filename)} not found")


def _has_version_folder(path: Path) -> bool:
    try:
        return any(folder_version(p.name) is not None and p.is_dir() for p in path.iterdir())
    except OSError:
        return True  # cannot be listed: listed as a model, whose reading then names the problem


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
            if not path.is_dir() or not _MODEL_NAME.fullmatch(path.name):
                continue
            if os.path.lexists(path / CONFIG_FILE) or _has_version_folder(path):
                found.append(path.name)  # a config.pbtxt that is no regular file is listed, and fails by name
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
        return self.read_versions(name, source=source, config_json=config_json, backend=backend)[0]

    def judge(self, name: str, *, source: str = "", config_json: str = "", backend: str = "") -> ModelReading:
        """What `read` makes of model `name`, as a record instead of a raise: the spec or the error, and every
        refused and ignored field with its reason (judge_config). Loads nothing; never raises ModelConfigError.
        For `python -m service check`; the server calls `read`, which runs the same steps."""
        try:
            directory, config = self._config_of(name, source, config_json)
            folders = _version_folders(directory, f"model '{name}'")
        except ModelConfigError as error:
            return ModelReading(name, None, error, (), (), ())
        try:
            policy = _version_policy(config, f"model '{name}'")
            judged = judge_config(config, _other_refusals(config, policy, folders, backend))
            chosen = policy.select(folders) if folders else ()
        except ModelConfigError as error:
            return ModelReading(name, None, error, (), classify_fields(config).ignored, tuple(sorted(folders)))
        try:
            spec = spec_from_config(name, directory, config, backend or None, roots=self.roots)
        except ModelConfigError as error:
            return ModelReading(name, None, error, judged.refused, judged.ignored, tuple(sorted(folders)), chosen)
        return ModelReading(name, spec, None, judged.refused, judged.ignored, tuple(sorted(folders)), chosen)

    def load_order(self, names: Iterable[str]) -> list[str]:
        """`names` with every ensemble after the models its steps name (Triton loads an ensemble's steps first;
        an ensemble's load checks its steps against their registered specs). Otherwise in the given order; a
        configuration that cannot be read keeps its place (its refusal comes when it is registered)."""
        names = list(names)
        steps: dict[str, list[str]] = {}
        for name in names:
            try:
                _, config = self._config_of(name, "", "")
            except ModelConfigError:
                continue
            if config.platform == "ensemble":
                steps[name] = [step.model_name for step in config.ensemble_scheduling.step]
        return ensembles_after_their_steps(names, steps)  # iterative: a recursion here failed on a long chain

    def _config_of(self, name: str, source: str, config_json: str) -> tuple[Path, model_config_pb2.ModelConfig]:
        """Model `name`'s directory and parsed configuration (config.pbtxt, or `config_json` instead; an empty
        message without either). Raises ModelConfigError for a bad name, a missing or outside directory, or a
        configuration that does not parse."""
        check_model_name(name)
        origin = f"model '{name}'"
        if source:
            directory = self.resolve_source(source, origin)
        else:
            directory = self.roots.resolve(name, "model directory", origin=origin)
        if not directory.is_dir():
            raise ModelConfigError(f"{origin}: no model directory at '{self.roots.shown(directory)}'")
        if config_json:
            return directory, parse_config_json(config_json, origin)
        config_path = self.roots.resolve(directory / CONFIG_FILE, CONFIG_FILE, origin=origin)
        if os.path.lexists(config_path):  # read only if it is a regular file: a folder or a FIFO is this model's error
            text = read_regular_text(config_path, origin, self.roots)
            return directory, parse_config_text(text, f"{origin} ({CONFIG_FILE})")
        return directory, model_config_pb2.ModelConfig()

    def read_versions(
        self, name: str, *, source: str = "", config_json: str = "", backend: str = ""
    ) -> tuple[ModelSpec, ...]:
        """Every version of model `name` its version_policy serves, highest first, one ModelSpec each (read as
        `read` does, the configuration read once). Raises ModelConfigError as `read` does, for any version."""
        directory, config = self._config_of(name, source=source, config_json=config_json)
        highest = spec_from_config(name, directory, config, backend or None, roots=self.roots)  # judges the config
        others = served_versions(config, directory)[1:]
        return (highest,) + tuple(
            spec_from_config(name, directory, config, backend or None, roots=self.roots, version=version)
            for version in others
        )


@dataclass(frozen=True)
class ModelReading:
    """One model as the server would read it (ModelRepository.judge): `spec` when it would be registered,
    otherwise `error` (the ModelConfigError the server logs and lists); the refused and ignored fields (path,
    reason); the numbered version folders found and those the version policy chooses."""

    name: str
    spec: ModelSpec | None
    error: ModelConfigError | None
    refused: tuple[tuple[str, str], ...]
    ignored: tuple[tuple[str, str], ...]
    version_folders: tuple[int, ...]
    chosen_versions: tuple[int, ...] = ()
