"""`python -m service check PATH`: what a model repository will do on slotserve, before serving it.

The verdict is the server's own loading decision, not a second opinion: the server's registry (ModelRegistry, as
service/process/server.py builds it for the same flags) registers and loads the repository as a server's startup does
(`register_repository`: the load order that puts an ensemble after its steps, the repository's read, the slot
rule, ModelEntry's load path with its warmup checks, the server's EnsembleBackend checking each ensemble against
its step models as registered), and each model's verdict is then what RepositoryIndex and ModelReady would say
of it (`registry_verdict`). Only the backends differ, so that nothing runs: a reader stands in for each backend
whose load would run the model's code or build its engine (`reading_backends`):

* ONNX Runtime: no session; the graph's tensors are read with `onnx` and go through the backend's own functions
  (session_options for the parameters, served_metadata: a sequence model's control and state inputs are the
  server's, the declared tensors against the graph's; parallel_slots);
* python: the backend's checks up to the import of model.py (unstarted_model), and the metadata of the
  configuration as written (metadata_from_config); auto_complete_config and initialize are the model's code;
* TensorRT: the configuration; the plan is deserialized on the GPU only with --load.

So a refusal anyone adds to the server's load path (the repository's read, the registry, the lifecycle, the
ensemble load) is the check's too, in the server's words. `--load` loads each model in a throwaway in-process
server (explicit model control, port 0 on 127.0.0.1; an ensemble after its step models), sends one request of
zeros made from its inputs (a failed request is reported; the verdict is the load's) and reports load time and
memory; only then does a model's code run. Warmup samples are checked against the inputs at load; they run only
with --load.

Exit status: 0 when every model would serve, 1 when any would not, 2 when PATH is not a model repository.

`--format json` prints one object (its shape is `FORMAT_VERSION`; new keys may be added, none renamed):

    {"format": 1, "repository": PATH, "serves": bool, "models": [MODEL, ...]}
    MODEL = {"name", "serves": bool, "reason": str | null (the server's words, the model's name cut off),
             "backend", "model_file", "version_folders": [int], "versions": [int] (chosen by the policy),
             "slots", "max_batch_size", "batching": {...} | null, "sequence": {"strategy", "max_idle_us",
             "filled_inputs", "state_outputs"} | null, "rate_limiter": {"resources": [{"name", "count",
             "shared"}], "priority"} | null, "warmup": [{"name", "batch_size", "count",
             "inputs"}], "warmup_runs": str, "startup": str, "not_run": str (what runs only with --load: a python
             model's code, a TensorRT plan; "" otherwise), "refused": [{"field", "reason"}],
             "ignored": [{"field", "reason"}], "files": [{"file", "inputs", "outputs", "problem"}],
             "load": null | {"seconds", "memory_bytes", "rss_delta_bytes", "request"}}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config.files import shown_path
from engine.config.repository import ModelReading, ModelRepository
from engine.config.specs import ModelSpec, TensorSpec
from engine.errors import ModelConfigError
from engine.interface import Backend, Context, LoadedModel, ModelMetadata

from ..core.events import Events
from .flags import CommandLineParser, add_server_flags

if TYPE_CHECKING:  # the server's modules load when the check reaches them (a bad command line needs none)
    import numpy as np

    from client.inference import ModelMetadata as ServedMetadata
    from engine.interface import CancelToken, Outputs

    from ..core.lifecycle import ModelEntry
    from ..core.registry import ModelRegistry
    from ..testing import RunningServer
    from .options import ServerOptions

Json = dict[str, Any]  # a block of the JSON verdict

FORMAT_VERSION = 1
WARMUP_RUNS = "runs on every slot at load, before the model is ready"  # service/core/warmup.py
# The server's flags the verdict depends on: service/process/flags.py's, help and defaults included.
SHARED_FLAGS = (
    "allowed_model_roots",
    "parallel_jobs",
    "admission_timeout",
    "model_control_mode",
    "load_models",
    "enable_test_backends",
)


@dataclass
class ModelVerdict:
    """What the check found for one model (the JSON shape of a MODEL)."""

    name: str
    serves: bool
    reason: str | None = None
    backend: str | None = None
    model_file: str | None = None
    version_folders: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    slots: int | None = None
    max_batch_size: int | None = None
    batching: Json | None = None
    sequence: Json | None = None  # sequence_batching: the strategy and the inputs the server fills
    rate_limiter: Json | None = None  # instance_group[0].rate_limiter: {"resources": [...], "priority"}
    warmup: list[Json] = field(default_factory=list)
    warmup_runs: str = WARMUP_RUNS
    startup: str = ""
    not_run: str = ""  # a python model's model.py without --load: its code is not imported
    refused: list[Json] = field(default_factory=list)
    ignored: list[Json] = field(default_factory=list)
    files: list[Json] = field(default_factory=list)
    load: Json | None = None

    def fail(self, message: str) -> None:
        self.serves = False
        self.reason = self.reason or server_reason(self.name, message)


def server_reason(name: str, message: str) -> str:
    """`message` as the server lists a failed model's reason: its "model 'NAME' (where): " opening cut to "where: "
    (as service/core/registry.py's _note_failure does)."""
    return re.sub(rf"^model '{re.escape(name)}'(?: \(([^)]*)\))?: ", r"\1: ", message).removeprefix(": ")


# ---- the command line -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog="slotserve check",
        description="Tell what a model repository will do on slotserve, without serving it: per model, what is "
        "served, every refused and ignored field, every missing or mismatched file.",
    )
    parser.add_argument("repository", type=Path, metavar="PATH", help="the model repository to check")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="text, or one JSON object")
    parser.add_argument(
        "--load",
        action="store_true",
        help="also load each model in a throwaway in-process server, send one request of zeros, report load time "
        "and memory (a model's own code runs only with this)",
    )
    add_server_flags(parser, only=SHARED_FLAGS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _quiet_logs():  # the check reports what the server would log
        return _run(args)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Logging off (below CRITICAL) while the check runs, as it was afterwards (main may run inside a test)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    try:
        server_options(args)  # the server's own validation of the shared flags
    except ValueError as error:
        print(f"slotserve check: {error}", file=sys.stderr)
        return 2
    problem = not_a_repository(args.repository)
    if problem:
        print(f"slotserve check: {args.repository} is not a model repository: {problem}", file=sys.stderr)
        return 2
    verdicts = check_repository(args)
    if args.format == "json":
        print(json.dumps(as_json(args.repository, verdicts), indent=2))
    else:
        print(as_text(verdicts), end="")
    return 0 if all(v.serves for v in verdicts) else 1


def server_options(args: argparse.Namespace, **more: Any) -> ServerOptions:
    """The ServerOptions a server started with these flags would have. Raises ValueError as the server does for a
    value out of range or flags that do not go together (--load-model without explicit mode)."""
    from .options import ServerOptions

    return ServerOptions(
        model_repository=args.repository,
        allowed_model_roots=tuple(args.allowed_model_roots or ()),
        parallel_jobs=args.parallel_jobs,
        admission_timeout=args.admission_timeout,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models or ()),
        enable_test_backends=bool(args.enable_test_backends),
        **more,
    )


def not_a_repository(path: Path) -> str:
    """Why `path` is not a model repository ("" when it is one)."""
    if not path.exists():
        return "no such folder"
    if not path.is_dir():
        return "not a folder"
    if not ModelRepository(path).names():
        return "it holds no model folder (a folder with config.pbtxt or a numbered version folder)"
    return ""


# ---- the check: the server's own load, with backends that read instead of run --------------------------------


def check_repository(args: argparse.Namespace) -> list[ModelVerdict]:
    """Every model's verdict: the repository registered and loaded by the server's own registry (its load order,
    registration, slot rule, load path and ensemble checks; the failures it lists), on backends that read the model
    files instead of running them (`--load` then loads each model in a throwaway server)."""
    options = server_options(args)
    files: dict[str, list[Json]] = {}
    registry = reading_registry(options, files)
    registry.register_repository(load=True)  # as the server's startup: every model, an ensemble after its steps
    repository = registry.repository
    verdicts = [check_model(repository, registry, files, name, args) for name in repository.names()]
    if args.load:
        load_models(args, [v for v in verdicts if v.backend is not None])  # every model the server registers
    return verdicts


def reading_registry(options: ServerOptions, files: dict[str, list[Json]]) -> ModelRegistry:
    """A ModelRegistry as the server builds one for `options` (ServerOptions), whose backends read instead of run:
    `reading_backends`, and the server's own EnsembleBackend, which checks each ensemble against its step models as
    registered here. Loads nothing yet. `files` collects what the ONNX reader read, by model name."""
    from ..core.lifecycle import SharedRuntime
    from ..core.registry import ModelRegistry, RegistryPolicy
    from ..request_path.dataplane import Dataplane
    from ..request_path.ensemble import EnsembleBackend

    backends = reading_backends(options.enable_test_backends, files)
    ensembles = EnsembleBackend()
    backends["ensemble"] = EnsembleReader(ensembles)
    registry = ModelRegistry(
        ModelRepository(options.model_repository, allowed_roots=options.allowed_model_roots),
        SharedRuntime(backends=backends, events=OnePass()),
        RegistryPolicy(parallel_jobs=options.parallel_jobs, admission_timeout=options.admission_timeout),
    )
    ensembles.bind(Dataplane(registry))
    return registry


class OnePass(Events):
    """The check's lifecycle events: counted and logged as the server's are, with no listener. The server's
    EnsembleBackend subscribes a StepWatcher that loads an ensemble again when one of its step models loads later;
    the check loads every model once, the steps before their ensembles (ModelRepository.load_order), so there is
    nothing to load again, and a watcher thread loading behind the check would race its reading."""

    def subscribe(self, listener: Callable[[str, str, Mapping[str, object]], None]) -> None:
        return


def reading_backends(test_backends: bool, files: dict[str, list[Json]]) -> dict[str, Backend]:
    """The server's backends (service.process.server.default_backends), each replaced by its reader where running it
    would run the model's code or build its engine: ONNX Runtime, python, TensorRT. Any other (the test backends) is the
    server's own."""
    from .server import default_backends

    readers: dict[str, Backend] = {
        "onnxruntime": OnnxReader(files),
        "python": PythonReader(),
        "tensorrt": TensorRTReader(),
    }
    return {name: readers.get(name, backend) for name, backend in default_backends(test_backends=test_backends).items()}


class NotRun(Context):
    """A slot of a model read, not loaded: it runs nothing. A warmup sample is checked against the inputs (by the
    server's warmup code, as at load) and not run."""

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs:
        return {}


class ReadModel(LoadedModel):
    """What a reader makes of a model: the metadata it would serve and the most slots it would take."""

    def __init__(self, metadata: ModelMetadata, max_parallel_slots: int) -> None:
        self.metadata = metadata
        self.max_parallel_slots = max_parallel_slots

    def create_context(self) -> Context:
        return NotRun()


class OnnxReader(Backend):
    """ONNX Runtime's load without a session: the session's parameters checked (session_options), the graph's
    tensors read from the file with `onnx`, the served metadata and the slot capacity computed by the backend's own
    functions (served_metadata: a sequence model's control and state inputs are the server's; parallel_slots)."""

    name = "onnxruntime"

    def __init__(self, files: dict[str, list[Json]]) -> None:
        self.files = files

    def load(self, spec: ModelSpec) -> LoadedModel:
        from engine.onnxruntime_backend import parallel_slots, served_metadata, session_options

        if spec.model_file is None or not spec.model_file.exists():  # the load's own refusal (the read found it)
            raise ModelConfigError(f"model '{spec.name}': model file not found")
        session_options(spec)
        shown = shown_path(spec.model_file, spec.roots)
        entry: dict[str, Any] = {"file": shown, "inputs": [], "outputs": [], "problem": None}
        self.files.setdefault(spec.name, []).append(entry)
        try:
            inputs, outputs = onnx_tensors(spec.model_file, f"model '{spec.name}'", shown)
            entry["inputs"] = [shown_tensor(t) for t in inputs]
            entry["outputs"] = [shown_tensor(t) for t in outputs]
            metadata = served_metadata(spec, inputs, outputs)
        except ModelConfigError as error:
            entry["problem"] = server_reason(spec.name, str(error))
            raise
        return ReadModel(metadata, parallel_slots(spec))


class PythonReader(Backend):
    """The python backend's load up to the model's code: model.py, the execution environment and the parameters
    checked (unstarted_model), the metadata of the configuration as written (metadata_from_config; a model's
    auto_complete_config is its code, run only with --load)."""

    name = "python"

    def load(self, spec: ModelSpec) -> LoadedModel:
        from engine.python.backend import metadata_from_config, triton_config, unstarted_model

        model = unstarted_model(spec)
        return ReadModel(metadata_from_config(triton_config(spec), spec), model.max_parallel_slots)


class TensorRTReader(Backend):
    """A TensorRT plan is deserialized on the GPU, only with --load: without it the configuration is the metadata."""

    name = "tensorrt"

    def load(self, spec: ModelSpec) -> LoadedModel:
        from ..core.registry import MAX_SLOTS

        metadata = ModelMetadata(spec.inputs, spec.outputs, spec.max_batch_size, platform=spec.platform)
        return ReadModel(metadata, MAX_SLOTS)


class EnsembleReader(Backend):
    """The server's EnsembleBackend load (the graph, its steps against their models as registered), and a model
    read from it: like the others it runs nothing (a warmup sample of the ensemble is checked, not sent through the
    steps)."""

    name = "ensemble"

    def __init__(self, ensembles: Backend) -> None:
        self.ensembles = ensembles

    def load(self, spec: ModelSpec) -> LoadedModel:
        loaded = self.ensembles.load(spec)
        return ReadModel(loaded.metadata, loaded.max_parallel_slots)


NOT_RUN = {
    "python": "model.py is imported (its code runs) only with --load; without it the configuration and the file's "
    "presence are checked",
    "tensorrt": "the plan is deserialized (on the GPU) only with --load; without it the configuration and the "
    "file's presence are checked",
}


def registry_verdict(registry: ModelRegistry, name: str) -> tuple[bool, str | None]:
    """(serves, reason) of model `name` as the registry lists it (what RepositoryIndex and ModelReady answer): it
    serves when every version the policy serves is READY; otherwise the reason is the first other version's error,
    or why the name has no entry, the model's name cut off as `server_reason` does."""
    from ..core.lifecycle import ModelState

    entries = registered_entries(registry, name)
    if not entries:  # its configuration failed (the reason noted), or no such model
        return False, registry.unregistered_reason(name).removeprefix("failed to load: ")
    for entry in entries:
        status = entry.status()
        if status.state is not ModelState.READY:
            return False, server_reason(name, status.last_error or status.state.value)
    return True, None


def registered_entries(registry: ModelRegistry, name: str) -> list[ModelEntry]:
    """The entries of model `name`'s versions, lowest first ([] when the registry has none)."""
    from ..core.errors import ServiceError

    try:
        return registry.versions(name).entries()
    except ServiceError:  # ModelConfigFailed or ModelNotFound
        return []


def check_model(
    repository: ModelRepository,
    registry: ModelRegistry,
    files: dict[str, list[Json]],
    name: str,
    args: argparse.Namespace,
) -> ModelVerdict:
    """One model's block: the registry's verdict, the reading's refused and ignored fields and versions, the
    registered spec (the highest version's), the slots it was given, the files read."""
    serves, reason = registry_verdict(registry, name)
    verdict = ModelVerdict(name=name, serves=serves, reason=reason)
    reading = repository.judge(name)
    describe_reading(verdict, reading)
    entries = registered_entries(registry, name)
    spec = entries[-1].spec if entries else reading.spec
    if spec is None:
        return verdict
    describe_spec(verdict, spec, repository)
    if entries:
        verdict.slots = entries[-1].status().slots
    if args.parallel_jobs is None and spec.instance_count not in (None, 1):
        why = "without --parallel-jobs every model has one slot"  # the registry's warning
        verdict.ignored.append({"field": "instance_group[0].count", "reason": why})
    if not args.load:
        verdict.not_run = NOT_RUN.get(spec.backend, "")
    verdict.files = files.get(name, [])
    verdict.startup = startup_line(name, args)
    return verdict


def describe_reading(verdict: ModelVerdict, reading: ModelReading) -> None:
    verdict.refused = [{"field": path, "reason": reason} for path, reason in reading.refused]
    verdict.ignored = [{"field": path, "reason": reason} for path, reason in reading.ignored]
    verdict.version_folders = list(reading.version_folders)
    verdict.versions = list(reading.chosen_versions)


def describe_spec(verdict: ModelVerdict, spec: ModelSpec, repository: ModelRepository) -> None:
    verdict.backend = spec.backend
    verdict.model_file = repository.roots.shown(spec.model_file) if spec.model_file else None
    verdict.max_batch_size = spec.max_batch_size
    verdict.batching = asdict(spec.batching) if spec.batching is not None else None
    verdict.rate_limiter = asdict(spec.rate_limiter) if spec.rate_limiter is not None else None
    if spec.sequence is not None:
        verdict.sequence = {
            "strategy": spec.sequence.strategy,
            "max_idle_us": spec.sequence.max_idle_us,
            "filled_inputs": sorted(spec.sequence.provided_inputs()),
            "state_outputs": list(spec.sequence.state_outputs()),
        }
    verdict.warmup = [
        {
            "name": sample.name,
            "batch_size": sample.batch_size,
            "count": sample.count,
            "inputs": [f"{i.name} {i.datatype} {list(i.shape)} {i.data}" for i in sample.inputs],
        }
        for sample in spec.warmup
    ]


def onnx_tensors(path: Path, origin: str, shown: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The graph's inputs (initializers left out) and outputs as the backend names them. Raises
    ModelConfigError for a file onnx cannot read or a type slotserve has no datatype for."""
    import onnx

    from engine import datatypes

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:
        first_line = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise ModelConfigError(
            f"{origin}: model file {shown} is not an ONNX model onnx can read: {first_line}"
        ) from None
    graph = model.graph
    initializers = {i.name for i in graph.initializer}

    def tensor(value: onnx.ValueInfoProto) -> TensorSpec:
        kind = value.type.tensor_type
        ort_type = f"tensor({onnx.TensorProto.DataType.Name(kind.elem_type).lower()})"
        datatype = datatypes.ORT_TYPE_STRING.get(ort_type)
        if datatype is None:
            raise ModelConfigError(f"{origin}: tensor '{value.name}' has unsupported type {ort_type}")
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim)
        return TensorSpec(value.name, datatype, dims)

    inputs = [tensor(v) for v in graph.input if v.name not in initializers]
    return inputs, [tensor(v) for v in graph.output]


def shown_tensor(tensor: TensorSpec) -> str:
    return f"{tensor.name} {tensor.datatype} {list(tensor.shape)}"


def startup_line(name: str, args: argparse.Namespace) -> str:
    mode = args.model_control_mode
    if mode != "explicit":
        return f"loaded at startup (--model-control-mode {mode})"
    if name in (args.load_models or ()) or "*" in (args.load_models or ()):
        return "loaded at startup (--model-control-mode explicit, --load-model)"
    return "registered, not loaded at startup (--model-control-mode explicit: load it with RepositoryModelLoad)"


# ---- --load -----------------------------------------------------------------------------------------------------


def load_models(args: argparse.Namespace, verdicts: list[ModelVerdict]) -> None:
    """Load each model in one throwaway in-process server (explicit control: one at a time, timed), an ensemble's
    step models first, send one request of zeros, unload what was loaded. The load decides the verdict, read from
    that server's registry as without --load (its words replace the reader's, e.g. ONNX Runtime's for a file onnx
    cannot read either); a request of zeros that fails is reported and changes no verdict. Blocks for as long as
    the loads take (no timeout: a backend that hangs in its load hangs the check, as it would hang the server's
    startup)."""
    from ..testing import serve

    options = dict(
        model_control_mode="explicit",  # nothing loads at startup: each load below is timed alone
        allow_management=True,
        parallel_jobs=args.parallel_jobs,
        admission_timeout=args.admission_timeout,
        allowed_model_roots=tuple(args.allowed_model_roots or ()),
        enable_test_backends=bool(args.enable_test_backends),
    )
    with serve(args.repository, **options) as running:
        for verdict in verdicts:
            load_one(running, verdict)


def load_one(running: RunningServer, verdict: ModelVerdict) -> None:
    """Load one model (its steps first when it is an ensemble, untimed), measure it, send zeros, unload it and
    the steps loaded for it."""
    registry = running.server.registry
    steps = load_steps(registry, verdict.name, {verdict.name})
    try:
        rss_before = _resident_bytes()
        started = time.monotonic()
        with contextlib.suppress(Exception):  # the registry lists why, read below
            registry.load(verdict.name)
        seconds = time.monotonic() - started
        verdict.serves, verdict.reason = registry_verdict(registry, verdict.name)
        if not verdict.serves:
            return
        verdict.load = {
            "seconds": round(seconds, 3),
            "memory_bytes": registry.get(verdict.name).status().memory_bytes,
            "rss_delta_bytes": _resident_bytes() - rss_before,
            "request": "not sent",
        }
        try:
            running.client.infer(verdict.name, zeros_request(running.client.model_metadata(verdict.name)))
            verdict.load["request"] = "ok"
        except Exception as error:
            # The model loaded and serves; zeros may simply not be data it accepts (a sample rate of 0, say).
            verdict.load["request"] = f"failed (the model may need real data): {error}"
    finally:
        for name in [verdict.name, *reversed(steps)]:
            with contextlib.suppress(Exception):  # a name the registry does not have, or a model not loaded
                registry.unload(name)


def load_steps(registry: ModelRegistry, name: str, seen: set[str], depth: int = 1) -> list[str]:
    """Load the models ensemble `name`'s steps run (an inner ensemble's own steps before it), as the server's
    startup loads them before the ensemble (ModelRepository.load_order). Returns the names loaded or tried here, in
    order; a step that fails to load is left to the ensemble's load, which names it as the server's does. Past
    MAX_NESTING (`depth` is `name`'s place in the chain) it descends no further: the chain is refused by name."""
    from engine.config.ensemble_graph import MAX_NESTING
    from generated.model_config_pb2 import ModelConfig

    if depth > MAX_NESTING:
        return []
    entries = registered_entries(registry, name)
    config = entries[-1].spec.config if entries else None
    if config is None or entries[-1].spec.backend != "ensemble":
        return []
    assert isinstance(config, ModelConfig)  # engine.config.repository parses it into one
    tried: list[str] = []
    for step in dict.fromkeys(block.model_name for block in config.ensemble_scheduling.step):
        if step in seen:
            continue  # a cycle, or a step shared with another: loaded once
        seen.add(step)
        tried += load_steps(registry, step, seen, depth + 1)
        with contextlib.suppress(Exception):  # listed by the registry; the ensemble's load names it
            registry.load(step)
        tried.append(step)
    return tried


def zeros_request(metadata: ServedMetadata) -> dict[str, np.ndarray]:
    """Zeros of each input's shape as the server's metadata gives it (a batching model's leading batch dimension
    included, as -1), every variable dimension as 1: batch 1."""
    import numpy as np

    from engine import datatypes

    request = {}
    for tensor in metadata.inputs:
        shape = tuple(1 if d < 0 else d for d in tensor.shape)
        if tensor.datatype == "BYTES":
            request[tensor.name] = np.full(shape, b"0", dtype=object)  # "0": a zero for models that parse numbers
        else:
            request[tensor.name] = np.zeros(shape, dtype=datatypes.numpy_dtype(tensor.datatype))
    return request


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


# ---- output -----------------------------------------------------------------------------------------------------


def as_json(repository: Path, verdicts: list[ModelVerdict]) -> Json:
    return {
        "format": FORMAT_VERSION,
        "repository": str(repository),
        "serves": all(v.serves for v in verdicts),
        "models": [asdict(v) for v in verdicts],
    }


def as_text(verdicts: list[ModelVerdict]) -> str:
    blocks = ["\n".join(text_block(v)) + "\n" for v in verdicts]
    serving = sum(v.serves for v in verdicts)
    summary = f"{serving} of {len(verdicts)} models would serve\n"
    return "\n".join([*blocks, summary])


def text_block(v: ModelVerdict) -> list[str]:
    versions = f" version {', '.join(map(str, v.versions))}" if v.versions else ""
    lines = [f"model '{v.name}'{versions}: {'serves' if v.serves else 'does not serve'}"]
    if v.serves or v.backend:
        if v.backend:
            lines.append(f"  backend: {v.backend}" + (f" ({v.model_file})" if v.model_file else ""))
        if v.version_folders:
            lines.append(f"  version folders: {v.version_folders}; the policy serves {v.versions}")
        if v.slots is not None:
            lines.append(f"  slots: {v.slots}")
        lines.append(f"  batching: {batching_line(v)}")
        if v.sequence is not None:
            lines.append(f"  sequence batching: {sequence_line(v.sequence)}")
        if v.rate_limiter is not None:
            lines.append(f"  rate limiter: {rate_limiter_line(v.rate_limiter)}")
        for sample in v.warmup:
            lines.append(
                f"  warmup '{sample['name']}': batch {sample['batch_size']}, {sample['count']} run(s), "
                f"{'; '.join(sample['inputs'])} ({v.warmup_runs})"
            )
        if v.startup:
            lines.append(f"  startup: {v.startup}")
        if v.not_run:
            lines.append(f"  not run: {v.not_run}")
    for entry in v.files:
        lines.append(f"  file {entry['file']}: inputs {entry['inputs']}, outputs {entry['outputs']}")
        if entry["problem"]:
            lines.append(f"    mismatch: {entry['problem']}")
    lines += [f"  refused: {f['field']}: {f['reason']}" for f in v.refused]
    lines += [f"  ignored: {f['field']}: {f['reason']}" for f in v.ignored]
    if v.load is not None:
        lines.append(
            f"  load: {v.load['seconds']} s, engine memory {v.load['memory_bytes']} bytes, RSS grew "
            f"{v.load['rss_delta_bytes']} bytes; one request of zeros: {v.load['request']}"
        )
    if not v.serves:
        refusal = v.refused and v.reason and v.reason.startswith("configuration refused: ")
        lines.append("  reason: configuration refused (the fields above)" if refusal else f"  reason: {v.reason}")
    return lines


def rate_limiter_line(block: Json) -> str:
    """What each slot needs to run (applied with --rate-limit execution_count; docs/lifecycle.md)."""
    needs = [
        f"{need['name']} x{need['count']}" + (" (global)" if need["shared"] else "") for need in block["resources"]
    ]
    return (
        f"each slot needs {', '.join(needs) or 'nothing'}, priority {block['priority']} "
        "(applied with --rate-limit execution_count)"
    )


def batching_line(v: ModelVerdict) -> str:
    if not v.max_batch_size:
        return "none (max_batch_size 0)"
    if v.batching is None:
        return f"max_batch_size {v.max_batch_size}, one request per engine call"
    b = v.batching
    return (
        f"max_batch_size {v.max_batch_size}, dynamic batching (max queue delay {b['max_queue_delay_us']} us"
        + (f", preferred sizes {list(b['preferred_batch_sizes'])}" if b["preferred_batch_sizes"] else "")
        + ")"
    )


def sequence_line(sequence: Json) -> str:
    filled = ", ".join(sequence["filled_inputs"]) or "nothing"
    kept = f"; it keeps {', '.join(sequence['state_outputs'])} between requests" if sequence["state_outputs"] else ""
    return f"{sequence['strategy']}; the server fills the inputs {filled}{kept}"
