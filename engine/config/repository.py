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

import hashlib
import logging
import math
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from google.protobuf import json_format, text_format

from generated import model_config_pb2

from . import datatypes
from .ensemble_graph import ensembles_after_their_steps, read_steps
from .errors import ModelConfigError
from .interface import BatchingSpec, ModelSpec, TensorSpec, VersionPolicy, WarmupInput, WarmupSample
from .python.environments import archive_stamp
from .sequence_config import oldest_batching, read_sequence_spec

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


def _what_it_is(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))
    kind = next((word for test, word in kinds if test(mode)), "a block device" if stat.S_ISBLK(mode) else "special")
    return f"{kind}, not a regular file"


def check_regular_file(path: Path, origin: str, roots: ModelRoots | None) -> os.stat_result:
    """`path`'s status (symbolic links followed) when it is a regular file. Opens nothing: a FIFO would block the
    open until a writer comes, a device may do anything when opened. Raises ModelConfigError naming the file
    (relative to the repository) when it is missing, cannot be looked at, or is a folder, a FIFO, a socket or a
    device."""
    shown = shown_path(path, roots)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ModelConfigError(f"{origin}: {shown} not found") from None
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot read {shown}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ModelConfigError(f"{origin}: {shown} is {_what_it_is(info.st_mode)}")
    return info


def read_regular_file(path: Path, origin: str, roots: ModelRoots | None) -> bytes:
    """The bytes of `path`, opened only if it is a regular file (check_regular_file), and without blocking should it
    have been swapped for a FIFO since (O_NONBLOCK; what was opened is checked again). Raises ModelConfigError naming
    the file as check_regular_file does, or when reading fails (permission, I/O)."""
    check_regular_file(path, origin, roots)
    shown = shown_path(path, roots)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot read {shown}: {error.strerror}") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise ModelConfigError(f"{origin}: {shown} is {_what_it_is(mode)}")
        chunks = []
        while chunk := os.read(descriptor, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot read {shown}: {error.strerror}") from None
    finally:
        os.close(descriptor)


def read_regular_text(path: Path, origin: str, roots: ModelRoots | None) -> str:
    """read_regular_file as UTF-8 text; bytes that are not UTF-8 raise ModelConfigError naming the file and where."""
    data = read_regular_file(path, origin, roots)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ModelConfigError(
            f"{origin}: {shown_path(path, roots)} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None


HASHED_FILE_BYTES = 1 << 20  # files up to this size are stamped by content too (model.py and its neighbours)
SKIPPED_FOLDERS = frozenset({"__pycache__"})  # written by the python worker's imports: never what a model reads


def files_stamp(
    version_dir: Path | None,
    model_file: Path | None,
    *,
    origin: str,
    roots: ModelRoots | None = None,
    skip: Iterable[Path] = (),
) -> str:
    """A digest of the files an engine reads for one version: every file under `version_dir` (a python model.py
    imports its neighbours; ONNX Runtime reads external data beside the model; TensorRT a plan or the ONNX it builds
    from), `__pycache__` folders and the folders in `skip` left out, plus `model_file` when it lies elsewhere
    (`default_model_filename`). Each file counts with its relative path, size, modification and change times
    (nanoseconds), inode and device, and for files up to HASHED_FILE_BYTES their content (SHA-256), so a rewrite
    in place within a coarse timestamp is seen too; a symbolic link to a folder counts by its target's name.
    Two reads give the same stamp only if no file was changed, added, removed or replaced in between: a reload
    compares them to decide whether the engine can stay (ModelSpec.session_key).

    Opens only regular files, without blocking. Raises ModelConfigError naming the first file that is a FIFO, a
    socket or a device (the engine would hang or worse on it), that cannot be looked at, or, with `roots`, that a
    symbolic link takes outside the repository and the allowed roots. Blocks for the stat calls and the hashing
    (about 1 ms for a typical python model)."""
    entries: list[tuple[object, ...]] = []
    skipped = frozenset(path.resolve() for path in skip)
    if version_dir is not None:
        _stamp_folder(version_dir, version_dir, skipped, entries, origin, roots)
    if model_file is not None and (version_dir is None or version_dir.resolve() not in model_file.resolve().parents):
        entries.append(_file_entry(model_file, model_file.name, origin, roots))
    return hashlib.sha256(repr(sorted(entries, key=repr)).encode()).hexdigest()


def _stamp_folder(
    top: Path,
    folder: Path,
    skipped: frozenset[Path],
    entries: list[tuple[object, ...]],
    origin: str,
    roots: ModelRoots | None,
) -> None:
    try:
        with os.scandir(folder) as listing:
            children = sorted(listing, key=lambda entry: entry.name)
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot list {shown_path(folder, roots)}: {error.strerror}") from None
    for child in children:
        path = Path(child.path)
        relative = path.relative_to(top).as_posix()
        if roots is not None:
            roots.resolve(path, "file", origin=origin)  # a link that leads outside is refused by its own name
        if child.is_symlink() and not os.path.exists(path):
            entries.append((relative, "dangling link", os.readlink(path)))  # nothing to read; seen if it changes
            continue
        try:
            is_folder = child.is_dir(follow_symlinks=True)
        except OSError:
            is_folder = False  # a dangling link: stamped (and refused) as a file below
        if is_folder:
            if child.name in SKIPPED_FOLDERS or path.resolve() in skipped:
                continue
            if child.is_symlink():  # counted by where it points; never followed (a loop would never end)
                entries.append((relative, "link", os.readlink(path)))
                continue
            _stamp_folder(top, path, skipped, entries, origin, roots)
        else:
            entries.append(_file_entry(path, relative, origin, roots))


def _file_entry(path: Path, relative: str, origin: str, roots: ModelRoots | None) -> tuple[object, ...]:
    info = check_regular_file(path, origin, roots)
    digest = ""
    if info.st_size <= HASHED_FILE_BYTES:
        digest = hashlib.sha256(read_regular_file(path, origin, roots)).hexdigest()
    return (relative, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev, digest)


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


class Treatment(StrEnum):
    """What slotserve does with a field of config.pbtxt that is set."""

    APPLIED = "applied"
    REFUSED = "refused"  # the model is not loaded: ModelConfigError names every refused field
    IGNORED = "ignored"  # the model loads; one warning names every ignored field


@dataclass(frozen=True)
class FieldRule:
    treatment: Treatment
    reason: str  # for the docs table and the refusal or warning: what happens, and why


def _applied(reason: str) -> FieldRule:
    return FieldRule(Treatment.APPLIED, reason)


def _refused(reason: str) -> FieldRule:
    return FieldRule(Treatment.REFUSED, reason)


def _ignored(reason: str) -> FieldRule:
    return FieldRule(Treatment.IGNORED, reason)


_RAGGED = "not supported: ragged batching is not implemented; requests batch only when their shapes stack"
_SHAPE_AS_IS = "tensors travel in the model's own shape and layout"
_ROUTING = "slots run where the backend runs them (TensorRT takes its device from the trt_device parameter)"

# Every field of ModelConfig, by path (repeated fields without an index, maps as a whole). A path with entries
# below it is a branch: its set subfields are judged one by one, and each must have an entry. A path without
# entries below it judges its whole subtree. docs/model-repository.md's table is generated from this one
# (`make docs`; tests/docs fails when they differ), and tests/unit checks that it covers the whole message.
FIELDS: dict[str, FieldRule] = {
    "name": _applied("must be the folder's name, or left out"),
    "platform": _applied("selects the backend: onnxruntime_onnx, tensorrt_plan or ensemble (docs/ensembles.md)"),
    "backend": _applied("onnxruntime, tensorrt, python (docs/python-models.md) or fixture (test backend)"),
    "runtime": _ignored("the backend chooses its own runtime library"),
    "version_policy": _applied(
        "latest (num_versions), all or specific: each selected version folder is served as its own pool; "
        "a policy that selects none of the folders is refused"
    ),
    "max_batch_size": _applied("0: no batch dimension; N > 0: a leading batch dimension of 1..N rows"),
    "input": _applied("declared inputs are checked against the model at load"),
    "input.name": _applied("the input's name"),
    "input.data_type": _applied("a TYPE_* other than TYPE_INVALID"),
    "input.dims": _applied("positive, or -1 for a variable dimension"),
    "input.optional": _applied("the request may leave the input out"),
    "input.allow_ragged_batch": _refused(_RAGGED),
    "input.format": _ignored(_SHAPE_AS_IS),
    "input.reshape": _ignored(_SHAPE_AS_IS),
    "input.is_shape_tensor": _ignored("shape tensors are passed as ordinary inputs"),
    "input.is_non_linear_format_io": _ignored(_SHAPE_AS_IS),
    "output": _applied("declared outputs are checked against the model at load"),
    "output.name": _applied("the output's name"),
    "output.data_type": _applied("a TYPE_* other than TYPE_INVALID"),
    "output.dims": _applied("positive, or -1 for a variable dimension"),
    "output.reshape": _ignored(_SHAPE_AS_IS),
    "output.label_filename": _ignored(
        "classification outputs are not produced (a request asking for `classification` is refused)"
    ),
    "output.is_shape_tensor": _ignored("shape tensors are returned as ordinary outputs"),
    "output.is_non_linear_format_io": _ignored(_SHAPE_AS_IS),
    "batch_input": _refused(_RAGGED),
    "batch_output": _refused(_RAGGED),
    "optimization": _ignored(
        "backend optimization settings (graph level, priority, CUDA graphs, execution accelerators, pinned "
        "memory, gather kernel, eager batching) are not applied; ONNX Runtime and TensorRT take theirs from "
        "`parameters`"
    ),
    "dynamic_batching": _applied(
        "queued requests that stack run as one engine call (ignored when max_batch_size is 0)"
    ),
    "dynamic_batching.preferred_batch_size": _applied("a delayed batch goes once it reaches one of these sizes"),
    "dynamic_batching.max_queue_delay_microseconds": _applied("how long a free slot waits for its batch to grow"),
    "dynamic_batching.preserve_ordering": _applied("every request gets its own response, in order"),
    "dynamic_batching.priority_levels": _refused("not supported: requests are served in arrival order, one level"),
    "dynamic_batching.default_priority_level": _refused(
        "not supported: requests are served in arrival order, one level"
    ),
    "dynamic_batching.priority_queue_policy": _refused(
        "not supported: requests are served in arrival order, one level"
    ),
    "dynamic_batching.default_queue_policy": _applied("the model's queue limit and admission timeout"),
    "dynamic_batching.default_queue_policy.max_queue_size": _applied("this model's queue limit"),
    "dynamic_batching.default_queue_policy.default_timeout_microseconds": _applied("this model's admission timeout"),
    "dynamic_batching.default_queue_policy.allow_timeout_override": _applied(
        "whether a request's `timeout` may shorten it"
    ),
    "dynamic_batching.default_queue_policy.timeout_action": _refused(
        "not supported: timeout_action DELAY; a request whose admission timeout passes is refused (REJECT)"
    ),
    "sequence_batching": _applied(
        "stateful sequences: every request of a sequence on one slot, in order (docs/sequences.md)"
    ),
    "sequence_batching.max_sequence_idle_microseconds": _applied(
        "an open sequence with no request for this long is ended and its slot freed (default 1 s)"
    ),
    "sequence_batching.control_input": _applied("inputs the server fills on each request of a sequence"),
    "sequence_batching.control_input.name": _applied("the model input the server fills"),
    "sequence_batching.control_input.control": _applied("exactly one control per input"),
    "sequence_batching.control_input.control.kind": _applied(
        "CONTROL_SEQUENCE_START, _END, _READY (flags) or _CORRID (the sequence id)"
    ),
    "sequence_batching.control_input.control.int32_false_true": _applied("a flag as INT32: the false and true values"),
    "sequence_batching.control_input.control.fp32_false_true": _applied("a flag as FP32: the false and true values"),
    "sequence_batching.control_input.control.bool_false_true": _applied("a flag as BOOL: the false and true values"),
    "sequence_batching.control_input.control.data_type": _applied(
        "CORRID's type: TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
    ),
    "sequence_batching.direct": _applied(
        "max(1, max_batch_size) sequences per slot, each pinned to its slot, each request run alone"
    ),
    "sequence_batching.direct.max_queue_delay_microseconds": _ignored(
        "a sequence's request runs alone on its slot: there is no batch to wait for"
    ),
    "sequence_batching.direct.minimum_slot_utilization": _ignored(
        "a sequence's request runs alone on its slot: there is no batch to fill"
    ),
    "sequence_batching.oldest": _applied(
        "up to max_candidate_sequences open sequences; their next requests that wait together run as one batch"
    ),
    "sequence_batching.oldest.max_candidate_sequences": _applied("how many sequences may be open at once"),
    "sequence_batching.oldest.preferred_batch_size": _applied("a delayed batch goes once it reaches one of these"),
    "sequence_batching.oldest.max_queue_delay_microseconds": _applied(
        "how long a free slot waits for more sequences' requests to join its batch"
    ),
    "sequence_batching.oldest.preserve_ordering": _applied("every request gets its own response, in order"),
    "sequence_batching.state": _applied(
        "implicit state: the output comes back as the input on the sequence's next request, kept on the server"
    ),
    "sequence_batching.state.input_name": _applied("the model input that gets the state"),
    "sequence_batching.state.output_name": _applied("the model output that becomes the next state"),
    "sequence_batching.state.data_type": _applied("a fixed-size TYPE_* (not TYPE_STRING)"),
    "sequence_batching.state.dims": _applied("the state's dims without the batch dimension; -1 needs an initial_state"),
    "sequence_batching.state.initial_state": _applied("the state a sequence starts with (default: zeros of dims)"),
    "sequence_batching.state.initial_state.data_type": _applied("the state's data_type"),
    "sequence_batching.state.initial_state.dims": _applied("fixed dims that fit the state's"),
    "sequence_batching.state.initial_state.zero_data": _applied("start from zeros"),
    "sequence_batching.state.initial_state.data_file": _applied(
        "start from this file's raw bytes, in the model's initial_state/ folder"
    ),
    "sequence_batching.state.initial_state.name": _ignored("the initial state is named by its state"),
    "sequence_batching.state.use_same_buffer_for_input_output": _ignored(
        "states are arrays kept per sequence on the server; there is no device buffer to share"
    ),
    "sequence_batching.state.use_growable_memory": _ignored(
        "states are arrays kept per sequence on the server, as large as the model returns them"
    ),
    "sequence_batching.iterative_sequence": _applied(
        "a request without a sequence id gets one; a python model may reschedule a request, which runs again"
    ),
    "ensemble_scheduling": _applied("the steps of an ensemble, run as a data flow (docs/ensembles.md)"),
    "ensemble_scheduling.step": _applied("one step: a model run through its own admission"),
    "ensemble_scheduling.step.model_name": _applied("the step's model, registered on this server"),
    "ensemble_scheduling.step.model_version": _applied("-1: the served version; a number must be that version"),
    "ensemble_scheduling.step.input_map": _applied("the step model's input -> the ensemble tensor feeding it"),
    "ensemble_scheduling.step.output_map": _applied("the step model's output -> the ensemble tensor it produces"),
    "ensemble_scheduling.step.model_namespace": _refused("not supported: model namespaces are not implemented"),
    "instance_group": _applied("the first group's count is the slot count"),
    "instance_group.count": _applied(
        "the model's slot count (1..16, with --parallel-jobs); a later group's count is ignored"
    ),
    "instance_group.name": _ignored("slots are named by their model"),
    "instance_group.kind": _ignored(_ROUTING),
    "instance_group.gpus": _ignored(_ROUTING),
    "instance_group.host_policy": _ignored(_ROUTING),
    "instance_group.profile": _ignored("TensorRT profiles come from the trt_* parameters"),
    "instance_group.rate_limiter": _refused("not supported: slots are not rate limited by resources"),
    "instance_group.secondary_devices": _refused("not supported: slots use no secondary devices"),
    "instance_group.passive": _refused("not supported: every slot takes requests"),
    "default_model_filename": _applied("the model file's name in the version folder"),
    "cc_model_filenames": _ignored("one model file serves every device"),
    "metric_tags": _ignored("metrics are labelled by model only"),
    "parameters": _applied("backend settings, `string_value` each"),
    "model_warmup": _applied(
        "every sample runs `count` times on every slot before the model is ready; a failure fails the load"
    ),
    "model_operations": _refused("not supported: custom operation libraries are not loaded"),
    "model_transaction_policy": _applied("decoupled: python models, and ensembles (set from their steps)"),
    "model_transaction_policy.decoupled": _applied(
        "python models: the model answers through response senders, over ModelStreamInfer "
        "(docs/python-models.md); an ensemble's is set when it loads, true exactly when a step is decoupled "
        "(docs/ensembles.md); refused for other backends"
    ),
    "model_repository_agents": _refused("not supported: repository agents are not run"),
    "response_cache": _applied(
        "with --response-cache-bytes > 0, ModelInfer answers are kept by request content and served again without a "
        "slot (docs/operations.md, Response cache); with no cache memory nothing is cached"
    ),
}


@dataclass(frozen=True)
class Classified:
    """The set fields of one configuration that were refused or ignored, each as (path, reason)."""

    refused: tuple[tuple[str, str], ...]
    ignored: tuple[tuple[str, str], ...]


def _is_map(field) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _is_branch(path: str) -> bool:
    prefix = path + "."
    return any(key.startswith(prefix) for key in FIELDS)


def rule_for(path: str) -> FieldRule | None:
    """The rule of `path` (no indices): its own entry, or that of the nearest ancestor that is not a branch."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        rule = FIELDS.get(key)
        if rule is not None:
            return rule if end == len(parts) or not _is_branch(key) else None
    return None


def classify_fields(config: model_config_pb2.ModelConfig) -> Classified:
    """Judge every set field of `config` by FIELDS: the refused and ignored ones with their paths
    (`instance_group[0].rate_limiter`). Pure; never raises."""
    refused: list[tuple[str, str]] = []
    ignored: list[tuple[str, str]] = []

    def visit(message, path: str, shown: str) -> None:
        for field, value in message.ListFields():
            key = f"{path}.{field.name}" if path else field.name
            label = f"{shown}.{field.name}" if shown else field.name
            rule = rule_for(key)
            if rule is None:  # a field the table has no word for: never applied silently
                ignored.append((label, "slotserve does not know this field"))
                continue
            if key == "instance_group.count" and not label.startswith("instance_group[0]."):
                ignored.append((label, "only the first instance group sets the slot count"))
                continue
            if rule.treatment is Treatment.REFUSED:
                refused.append((label, rule.reason))
            elif rule.treatment is Treatment.IGNORED:
                ignored.append((label, rule.reason))
            elif _is_branch(key) and not _is_map(field):
                if field.is_repeated:
                    for index, item in enumerate(value):
                        visit(item, key, f"{label}[{index}]")
                else:
                    visit(value, key, label)

    visit(config, "", "")
    return Classified(tuple(refused), tuple(ignored))


def judge_config(config: model_config_pb2.ModelConfig, more_refused: Iterable[tuple[str, str]] = ()) -> Classified:
    """Every refused and ignored field of `config` (classify_fields), with the refusals found elsewhere
    (`more_refused`: a backend not run yet, a version policy) and dynamic_batching ignored without a batch
    dimension. Pure; never raises. The server (through `_judge_fields`) and `python -m service check` both use it."""
    judged = classify_fields(config)
    ignored = judged.ignored
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        ignored = (*ignored, ("dynamic_batching", "max_batch_size is 0, so there is no batch dimension"))
    return Classified((*judged.refused, *more_refused), ignored)


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
    return BatchingSpec(
        max_queue_delay_us=int(block.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(preferred),
        preserve_ordering=block.preserve_ordering,
        max_queue_size=int(policy.max_queue_size),
        default_timeout_us=int(policy.default_timeout_microseconds),
        # Without a policy block a request's `timeout` shortens the admission timeout, as on every other model.
        allow_timeout_override=policy.allow_timeout_override if has_policy else True,
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
    ensemble's flag is Triton's to set: decoupled exactly when a step is (service/ensemble.py), whatever it says."""
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
    if backend == "python" and "EXECUTION_ENV_PATH" in config.parameters:  # a changed archive: a changed model
        files += archive_stamp(config.parameters["EXECUTION_ENV_PATH"].string_value, directory)
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
        warmup=_warmup_samples(config, inputs, directory, roots, origin),
        response_cache=config.response_cache.enable,
        sequence=sequence,
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
    (engine/ensemble_graph.py read_steps); raises ModelConfigError naming the problem."""
    if config.platform != "ensemble" and config.backend != "ensemble" and backend != "ensemble":
        raise ModelConfigError(f'{origin}: ensemble_scheduling needs platform: "ensemble"')
    if backend and backend != "ensemble":
        raise ModelConfigError(f"{origin}: an ensemble runs on the ensemble backend, not '{backend}'")
    read_steps(config, origin)


WARMUP_FOLDER = "warmup"  # a model's warmup input files, as in Triton


def _warmup_samples(
    config: model_config_pb2.ModelConfig,
    inputs: tuple[TensorSpec, ...],
    directory: Path | None,
    roots: ModelRoots,
    origin: str,
) -> tuple[WarmupSample, ...]:
    """config.pbtxt's `model_warmup`, checked: batch size within the model's, every input named, typed and shaped
    as the declared inputs (when the configuration declares them; otherwise the load checks), every required
    declared input given, each data file inside the model's warmup/ folder with the size its shape needs.
    Raises ModelConfigError naming the sample and the input."""
    samples = []
    for index, block in enumerate(config.model_warmup):
        where = f"{origin}: model_warmup[{index}]"
        if not block.name:
            raise ModelConfigError(f"{where} has no name")
        where = f"{where} '{block.name}'"
        batch = int(block.batch_size)
        limit = config.max_batch_size if config.max_batch_size > 0 else 1
        if not 1 <= batch <= limit:
            raise ModelConfigError(f"{where}: batch_size must be 1..{limit} (max_batch_size {config.max_batch_size})")
        if not block.inputs:
            raise ModelConfigError(f"{where} has no inputs")
        given = tuple(
            _warmup_input(key, block.inputs[key], inputs, directory, roots, f"{where}: input '{key}'")
            for key in sorted(block.inputs)
        )
        missing = [t.name for t in inputs if not t.optional and t.name not in block.inputs]
        if missing:
            raise ModelConfigError(f"{where}: no data for the model's inputs {missing}")
        samples.append(WarmupSample(block.name, batch, max(1, int(block.count)), given))
    return tuple(samples)


def _warmup_input(
    name: str, block, declared: tuple[TensorSpec, ...], directory: Path | None, roots: ModelRoots, where: str
) -> WarmupInput:
    config_name = model_config_pb2.DataType.Name(block.data_type)
    datatype = datatypes.BY_CONFIG_NAME.get(config_name)
    if datatype is None:
        raise ModelConfigError(f"{where} has no valid data_type ({config_name})")
    shape = tuple(int(d) for d in block.dims)
    if any(d < 0 for d in shape):
        raise ModelConfigError(f"{where}: dims {list(shape)} must all be given (>= 0)")
    if declared:
        spec = next((t for t in declared if t.name == name), None)
        if spec is None:
            raise ModelConfigError(f"{where}: the model has no such input; it takes {[t.name for t in declared]}")
        if spec.datatype != datatype.name:
            raise ModelConfigError(f"{where} has data_type {config_name}; the input is {spec.datatype}")
        if len(spec.shape) != len(shape) or any(
            want not in (-1, got) for got, want in zip(shape, spec.shape, strict=True)
        ):
            raise ModelConfigError(f"{where} has dims {list(shape)}; the input's dims are {list(spec.shape)}")
    choice = block.WhichOneof("input_data_type")
    if choice is None:
        raise ModelConfigError(f"{where}: set one of zero_data, random_data, input_data_file")
    if choice != "input_data_file":
        return WarmupInput(name, datatype.name, shape, "zero" if choice == "zero_data" else "random")
    if directory is None:
        raise ModelConfigError(f"{where}: input_data_file needs a model directory")
    folder = (directory / WARMUP_FOLDER).resolve()
    path = roots.resolve(block.input_data_file, "input_data_file", origin=where, base=folder)
    if folder not in path.parents:
        raise ModelConfigError(f"{where}: input_data_file '{block.input_data_file}' must be inside {WARMUP_FOLDER}/")
    data = read_regular_file(path, where, roots)  # not found, a folder, a FIFO: named
    _check_warmup_file(data, datatype, shape, f"{where}: input_data_file {roots.shown(path)}")
    return WarmupInput(name, datatype.name, shape, "file", path)


def _check_warmup_file(data: bytes, datatype: datatypes.DataType, shape: tuple[int, ...], where: str) -> None:
    """Raise ModelConfigError unless `data` holds exactly one tensor of `shape`: elements x itemsize bytes, or for
    BYTES that many 4-byte little-endian lengths each followed by its bytes."""
    elements = math.prod(shape)
    if datatype.itemsize:
        if len(data) != elements * datatype.itemsize:
            raise ModelConfigError(
                f"{where} has {len(data)} bytes; {list(shape)} {datatype.name} takes {elements * datatype.itemsize}"
            )
        return
    offset = 0
    for _ in range(elements):
        if offset + 4 > len(data):
            raise ModelConfigError(f"{where} ends before its {elements} BYTES elements do")
        offset += 4 + int.from_bytes(data[offset : offset + 4], "little")
    if offset != len(data):
        raise ModelConfigError(f"{where} does not hold exactly {elements} BYTES elements ({len(data)} bytes)")


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
