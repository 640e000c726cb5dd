"""`python -m service check PATH`: what a model repository will do on slotserve, before serving it.

Reads every model with the server's own reader (ModelRepository.judge: the same parse, the same FIELDS table, the
same spec the server registers), computes slots with the registry's own rule (ModelRegistry.settings_for) under
the same flags, and compares an ONNX model's inputs and outputs, read from the file with `onnx` (no session), with
the configuration using the ONNX Runtime backend's own comparison (`_reconcile`), so each reason is the text the
server would give. `--load` also loads each model in a throwaway in-process server (explicit model control, port
0 on 127.0.0.1), sends one request of zeros made from its inputs (a failed request is reported; the verdict is the
load's) and reports load time and memory; only then does a model's code run. Warmup samples are read and checked;
they run at load once the server runs them.

Exit status: 0 when every model would serve, 1 when any would not, 2 when PATH is not a model repository.

`--format json` prints one object (its shape is `FORMAT_VERSION`; new keys may be added, none renamed):

    {"format": 1, "repository": PATH, "serves": bool, "models": [MODEL, ...]}
    MODEL = {"name", "serves": bool, "reason": str | null (the server's words, the model's name cut off),
             "backend", "model_file", "version_folders": [int], "versions": [int] (chosen by the policy),
             "slots", "max_batch_size", "batching": {...} | null, "warmup": [{"name", "batch_size", "count",
             "inputs"}], "warmup_runs": str, "startup": str, "not_run": str (a python model's code, not run
             without --load; "" otherwise), "refused": [{"field", "reason"}],
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from engine.errors import ModelConfigError
from engine.interface import ModelSpec, TensorSpec
from engine.repository import ModelReading, ModelRepository

FORMAT_VERSION = 1
WARMUP_RUNS = "runs on every slot at load, before the model is ready"  # service/core/warmup.py
# The server's flags the verdict depends on: copied from service/cli.py's parser, help and defaults included.
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
    batching: dict | None = None
    warmup: list[dict] = field(default_factory=list)
    warmup_runs: str = WARMUP_RUNS
    startup: str = ""
    not_run: str = ""  # a python model's model.py without --load: its code is not imported
    refused: list[dict] = field(default_factory=list)
    ignored: list[dict] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)
    load: dict | None = None

    def fail(self, message: str) -> None:
        self.serves = False
        self.reason = self.reason or server_reason(self.name, message)


def server_reason(name: str, message: str) -> str:
    """`message` as the server lists a failed model's reason: its "model 'NAME' (where): " opening cut to "where: "
    (as service/core/registry.py's _note_failure does)."""
    return re.sub(rf"^model '{re.escape(name)}'(?: \(([^)]*)\))?: ", r"\1: ", message).removeprefix(": ")


# ---- the command line -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from .cli import _Parser
    from .cli import build_parser as server_parser

    parser = _Parser(
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
    for action in server_parser()._actions:
        if action.dest in SHARED_FLAGS:
            parser._add_action(action)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _quiet_logs():  # the check reports what the server would log
        return _run(args)


@contextlib.contextmanager
def _quiet_logs():
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


def server_options(args: argparse.Namespace, **more):
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


# ---- the check --------------------------------------------------------------------------------------------------


def check_repository(args: argparse.Namespace) -> list[ModelVerdict]:
    repository = ModelRepository(args.repository, args.allowed_model_roots or ())
    verdicts = [check_model(repository, name, args) for name in repository.names()]
    if args.load:
        load_models(args, [v for v in verdicts if v.backend is not None])  # every model the server registers
    return verdicts


def check_model(repository: ModelRepository, name: str, args: argparse.Namespace) -> ModelVerdict:
    reading = repository.judge(name)
    verdict = ModelVerdict(name=name, serves=reading.error is None)
    describe_reading(verdict, reading)
    spec = reading.spec
    if spec is None:
        verdict.fail(str(reading.error))
        return verdict
    describe_spec(verdict, spec, repository)
    for step in (check_slots, check_backend, check_files):
        try:
            step(verdict, spec, repository, args)
        except Exception as error:  # ModelConfigError, UnsupportedSlotCount: what the server refuses with
            verdict.fail(str(error))
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
    verdict.warmup = [
        {
            "name": sample.name,
            "batch_size": sample.batch_size,
            "count": sample.count,
            "inputs": [f"{i.name} {i.datatype} {list(i.shape)} {i.data}" for i in sample.inputs],
        }
        for sample in spec.warmup
    ]


def check_slots(verdict: ModelVerdict, spec: ModelSpec, repository: ModelRepository, args) -> None:
    """The slot count the server's registry computes with these flags (its own rule, no model loaded)."""
    from .core.lifecycle import SharedRuntime  # noqa: F401 - named by the cast
    from .core.registry import ModelRegistry, Registration, RegistryPolicy

    policy = RegistryPolicy(parallel_jobs=args.parallel_jobs, admission_timeout=args.admission_timeout)
    # settings_for reads only the policy: a registry without a runtime computes what the server's computes.
    registry = ModelRegistry(repository, runtime=cast("SharedRuntime", None), policy=policy)
    verdict.slots = registry.settings_for(spec, Registration(name=spec.name)).slots
    if args.parallel_jobs is None and spec.instance_count not in (None, 1):
        reason = "without --parallel-jobs every model has one slot"  # the registry's warning
        verdict.ignored.append({"field": "instance_group[0].count", "reason": reason})


def check_backend(verdict: ModelVerdict, spec: ModelSpec, repository: ModelRepository, args) -> None:
    from .core.lifecycle import TEST_BACKENDS, backend_missing_message

    if spec.backend in TEST_BACKENDS and not args.enable_test_backends:
        verdict.fail(backend_missing_message(spec.name, spec.backend))
    if spec.backend == "python" and not args.load:
        verdict.not_run = (
            "model.py is imported (its code runs) only with --load; without it the configuration and the file's "
            "presence are checked"
        )


def check_files(verdict: ModelVerdict, spec: ModelSpec, repository: ModelRepository, args) -> None:
    """An ONNX model's inputs and outputs, read from the file without a session, against the configuration, by
    the ONNX Runtime backend's own comparison (the first mismatch, in the words the load would use)."""
    if spec.backend != "onnxruntime" or spec.model_file is None:
        return
    from engine.onnxruntime_backend import _reconcile

    origin = f"model '{spec.name}'"
    entry: dict[str, Any] = {"file": verdict.model_file, "inputs": [], "outputs": [], "problem": None}
    verdict.files.append(entry)
    try:
        inputs, outputs = onnx_tensors(spec.model_file, origin, entry["file"])
        entry["inputs"] = [shown_tensor(t) for t in inputs]
        entry["outputs"] = [shown_tensor(t) for t in outputs]
        _reconcile(spec.inputs, inputs, spec.max_batch_size, "input", origin)
        _reconcile(spec.outputs, outputs, spec.max_batch_size, "output", origin)
    except ModelConfigError as error:
        entry["problem"] = server_reason(spec.name, str(error))
        raise


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

    def tensor(value) -> TensorSpec:
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


def startup_line(name: str, args) -> str:
    mode = args.model_control_mode
    if mode != "explicit":
        return f"loaded at startup (--model-control-mode {mode})"
    if name in (args.load_models or ()) or "*" in (args.load_models or ()):
        return "loaded at startup (--model-control-mode explicit, --load-model)"
    return "registered, not loaded at startup (--model-control-mode explicit: load it with RepositoryModelLoad)"


# ---- --load -----------------------------------------------------------------------------------------------------


def load_models(args, verdicts: list[ModelVerdict]) -> None:
    """Load each model in one throwaway in-process server (explicit control: one at a time, timed), send one
    request of zeros, unload it. The load decides the verdict: one that fails does not serve, with the server's
    words (they replace the check's own, e.g. onnx's for a file ONNX Runtime cannot load either); a request of
    zeros that fails is reported and changes no verdict. Blocks for as long as the loads take (no timeout: a
    backend that hangs in its load hangs the check, as it would hang the server's startup)."""
    from .testing import serve

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


def load_one(running, verdict: ModelVerdict) -> None:
    registry = running.server.registry
    rss_before = _resident_bytes()
    started = time.monotonic()
    try:
        registry.load(verdict.name)
    except Exception as error:
        verdict.serves, verdict.reason = False, server_reason(verdict.name, str(error))
        return
    verdict.serves, verdict.reason = True, None
    seconds = time.monotonic() - started
    status = registry.get(verdict.name).status()
    verdict.load = {
        "seconds": round(seconds, 3),
        "memory_bytes": status.memory_bytes,
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
        registry.unload(verdict.name)


def zeros_request(metadata) -> dict:
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


def as_json(repository: Path, verdicts: list[ModelVerdict]) -> dict:
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
