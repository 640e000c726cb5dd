"""Protocol messages to and from the core's records, for the servicers (MLServer's grpc/converters.py is the model).

An RPC decodes its request with these, calls one core operation and encodes its answer with these. Nothing here
calls a core operation, takes a lock or holds state: each function reads the records it is given (a model's
`ModelView` or `ModelStatus`, statistics snapshots, shared-memory regions) and builds a message, or reads a
request's fields into the values the core takes. ModelInfer's tensors are not here: `service/tensors.py` decodes
and encodes them, and `service/wire.py` (de)serializes ModelInfer itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine import datatypes
from engine.config.specs import ModelSpec
from generated import grpc_service_pb2 as pb
from generated import management_pb2 as management_pb
from generated import model_config_pb2

from ..core.errors import InvalidRequest, ModelNotLoadedYet
from ..core.lifecycle import ModelEntry, ModelState, ModelStatus, ModelView
from ..core.registry import Registration
from ..dataplane import InferenceResponse
from ..options import seconds_problem
from ..shared_memory import RegionInfo
from ..tensors import FINAL_RESPONSE, as_message, empty_final_response

# ---- inference.GRPCInferenceService ---------------------------------------------------------------------------

# RepositoryIndex speaks the protocol users' state names.
INDEX_STATE = {
    ModelState.READY: "READY",
    ModelState.LOADING: "LOADING",
    ModelState.RECONFIGURING: "LOADING",
    ModelState.UNLOADING: "UNLOADING",
    ModelState.UNLOADED: "UNAVAILABLE",
}


def model_metadata(name: str, view: ModelView, ready_versions: list[str]) -> pb.ModelMetadataResponse:
    """ModelMetadata's answer from one reading of the model (never a new version with the old inputs): the
    published metadata, else the configuration's tensors. `ready_versions` are the model's ready versions when the
    request named none (read before `view`), else empty. As Triton, the answer lists the version asked for, or (none
    asked) every ready version; the one described is always among them: a reload that replaced it since the
    versions were read lists it alone. Raises ModelNotLoadedYet when neither the engine nor the configuration
    declares the inputs."""
    metadata, spec = view.metadata, view.spec
    if metadata is None and not spec.inputs:
        raise ModelNotLoadedYet(f"model '{name}' has not been loaded yet and its configuration declares no inputs")
    versions = ready_versions if spec.version in ready_versions else [spec.version]
    response = pb.ModelMetadataResponse(name=name, versions=versions, platform=spec.platform)
    if metadata is not None:
        inputs, outputs, batch = metadata.inputs, metadata.outputs, metadata.max_batch_size
    else:
        inputs, outputs, batch = spec.inputs, spec.outputs, spec.max_batch_size
    for tensors, target in ((inputs, response.inputs), (outputs, response.outputs)):
        for tensor in tensors:
            shape = ((-1,) + tensor.shape) if batch > 0 else tensor.shape
            target.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
    return response


def model_config(name: str, view: ModelView) -> model_config_pb2.ModelConfig:
    """ModelConfig's answer: the committed configuration, completed with what the engine reported and the slot
    count, all from one reading of the model (`view`: never a new configuration with the old slot count)."""
    spec, metadata = view.spec, view.metadata
    config = model_config_pb2.ModelConfig()
    if spec.config is not None:
        assert isinstance(spec.config, model_config_pb2.ModelConfig)  # engine.config.repository parses it into one
        config.CopyFrom(spec.config)
    config.name = name
    if metadata is not None:
        config.max_batch_size = config.max_batch_size or metadata.max_batch_size  # a python model's auto_complete
        if not config.input:
            for tensor in metadata.inputs:
                config.input.add(name=tensor.name, data_type=_config_type(tensor.datatype), dims=tensor.shape)
        if not config.output:
            for tensor in metadata.outputs:
                config.output.add(name=tensor.name, data_type=_config_type(tensor.datatype), dims=tensor.shape)
    # Triton's names: the model's for the group it adds itself, <model>_<index> for a declared one without a name.
    group_name = (config.instance_group[0].name or f"{name}_0") if config.instance_group else name
    del config.instance_group[:]
    kind = (
        model_config_pb2.ModelInstanceGroup.KIND_GPU
        if spec.backend == "tensorrt"
        else model_config_pb2.ModelInstanceGroup.KIND_CPU
    )
    config.instance_group.add(name=group_name, count=view.status.slots, kind=kind)
    _fill_tritons_defaults(config, spec)
    return config


def _fill_tritons_defaults(config: model_config_pb2.ModelConfig, spec: ModelSpec) -> None:
    """The defaults Triton writes into its ModelConfig answer where config.pbtxt leaves them out, where they are
    what slotserve does too: the version policy (the latest version) and the model file's name. Triton's
    `optimization` (pinned input and output memory) is not filled: slotserve does not apply it."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.default_model_filename and spec.model_file is not None:
        # The file a model is read from when config.pbtxt names none; TensorRT falls back to model.onnx.
        onnx = spec.backend == "onnxruntime" or spec.model_file.suffix == ".onnx"
        config.default_model_filename = "model.onnx" if onnx else "model.plan"


def _config_type(datatype: str) -> int:
    return model_config_pb2.DataType.Value(datatypes.BY_NAME[datatype].config_name)


# A model's statistics as Triton's InferStatistics fields, each a count and nanoseconds.
_DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


def model_statistics(entries: Iterable[ModelEntry]) -> pb.ModelStatisticsResponse:
    """ModelStatistics' answer: each model's counters (one snapshot each), batch sizes and memory."""
    response = pb.ModelStatisticsResponse()
    for entry in entries:
        _add_statistics(response.model_stats.add(), entry)
    return response


def _add_statistics(target: pb.ModelStatistics, entry: ModelEntry) -> None:
    snapshot = entry.statistics.snapshot()
    target.name = entry.name
    target.version = entry.spec.version
    target.last_inference = snapshot.last_inference_ms
    target.inference_count = snapshot.inference_count
    target.execution_count = snapshot.execution_count
    stats = target.inference_stats
    for field in _DURATIONS:
        duration = getattr(snapshot, field)
        getattr(stats, field).count = duration.count
        getattr(stats, field).ns = duration.ns
    _add_memory_usage(target, entry.status())
    for batch in snapshot.batch_stats:
        added = target.batch_stats.add(batch_size=batch.batch_size)
        for duration, ns in (
            (added.compute_input, batch.compute_input_ns),
            (added.compute_infer, batch.compute_infer_ns),
            (added.compute_output, batch.compute_output_ns),
        ):
            duration.count, duration.ns = batch.count, ns


def _add_memory_usage(target: pb.ModelStatistics, status: ModelStatus) -> None:
    """What the loaded pool reports (the figure GetModel's memory_bytes shows), as Triton's MemoryUsage: on the
    GPU (device 0) for TensorRT, in host memory for the other backends. Nothing while not loaded, as Triton."""
    if status.memory_bytes:
        kind = "GPU" if status.backend == "tensorrt" else "CPU"
        target.memory_usage.add(type=kind, id=0, byte_size=status.memory_bytes)


def repository_index(
    models: Iterable[tuple[str, ModelStatus]], unregistered: Iterable[tuple[str, str]], *, ready_only: bool
) -> pb.RepositoryIndexResponse:
    """RepositoryIndex's answer: the registered `models` (name, status), only the READY ones with `ready_only`,
    then the repository's folders that are not registered (name, why: listed UNAVAILABLE)."""
    response = pb.RepositoryIndexResponse()
    for name, status in models:
        if ready_only and status.state is not ModelState.READY:
            continue
        reason = ""
        if status.state is ModelState.UNLOADED:
            reason = status.last_error or "unloaded"
        response.models.add(name=name, version=status.version, state=INDEX_STATE[status.state], reason=reason)
    for name, reason in unregistered:
        response.models.add(name=name, state="UNAVAILABLE", reason=reason)
    return response


def load_parameters(request: pb.RepositoryModelLoadRequest) -> dict[str, object]:
    """RepositoryModelLoad's parameters as model control takes them: "config" as its string, each "file:<path>" as
    its bytes (None when sent as another type, which the load refuses naming it); any other key is left out."""
    parameters: dict[str, object] = {}
    for key, value in request.parameters.items():
        if key == "config":
            parameters[key] = value.string_param
        elif key.startswith("file:"):
            parameters[key] = value.bytes_param if value.WhichOneof("parameter_choice") == "bytes_param" else None
    return parameters


def shared_memory_status(regions: Iterable[RegionInfo]) -> pb.SystemSharedMemoryStatusResponse:
    """SystemSharedMemoryStatus' answer: each region by its name."""
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region.name].CopyFrom(
            pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
            )
        )
    return response


def stream_answer(response: InferenceResponse) -> pb.ModelStreamInferResponse:
    """An answer as the stream carries it."""
    return pb.ModelStreamInferResponse(infer_response=as_message(response))


def stream_error(request: pb.ModelInferRequest, text: str) -> pb.ModelStreamInferResponse:
    """A failed stream request's one answer: `text` as its error_message, with the request's model, version and id,
    and final (a failed request ends there, as on Triton)."""
    failed = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    failed.parameters[FINAL_RESPONSE].bool_param = True
    return pb.ModelStreamInferResponse(error_message=text, infer_response=failed)


def stream_empty_final(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """The empty final answer that ends a streaming request whose last answer was not final
    (`triton_enable_empty_final_response`)."""
    return pb.ModelStreamInferResponse(infer_response=empty_final_response(request))


def is_final(answer: pb.ModelStreamInferResponse) -> bool:
    """Whether a stream answer is its request's last (`triton_final_response`)."""
    return answer.infer_response.parameters[FINAL_RESPONSE].bool_param


# ---- slotserve.management.v1.ModelManagement ------------------------------------------------------------------

_MANAGEMENT_STATE = {
    ModelState.UNLOADED: management_pb.MODEL_STATE_UNLOADED,
    ModelState.LOADING: management_pb.MODEL_STATE_LOADING,
    ModelState.READY: management_pb.MODEL_STATE_READY,
    ModelState.RECONFIGURING: management_pb.MODEL_STATE_RECONFIGURING,
    ModelState.UNLOADING: management_pb.MODEL_STATE_UNLOADING,
}


def registration(request: management_pb.RegisterModelRequest) -> Registration:
    """RegisterModel's request as the registry takes it. Raises InvalidRequest for a bad admission timeout."""
    return Registration(
        name=request.model_id,
        source=request.source,
        backend=request.backend,
        options=dict(request.options),
        slots=request.slots if request.HasField("slots") else None,
        admission_timeout=_admission_timeout(request),
        config_json=request.config_json,
    )


def _admission_timeout(request: management_pb.RegisterModelRequest) -> float | None:
    """The request's admission timeout (None when absent). Raises InvalidRequest naming the field for NaN,
    infinities, negatives and more than a year: `min(nan, ceiling)` is NaN, so a NaN used to escape the
    server's --admission-timeout ceiling and wait without limit."""
    if not request.HasField("admission_timeout_seconds"):
        return None
    value = request.admission_timeout_seconds
    problem = seconds_problem(
        "admission_timeout_seconds", value, zero="waits without limit, capped by the server's --admission-timeout"
    )
    if problem is not None:
        raise InvalidRequest(problem)
    return value


def model_status(status: ModelStatus) -> management_pb.ModelStatus:
    """A model's status as the management protocol's ModelStatus."""
    message = management_pb.ModelStatus(
        model_id=status.name,
        loaded=status.loaded,
        state=_MANAGEMENT_STATE[status.state],
        slots=status.slots,
        active_slots=status.active_slots,
        queued_requests=status.queued_requests,
        backend=status.backend,
        last_error=status.last_error,
        source=status.source,
        admission_timeout_seconds=status.admission_timeout,
        version=status.version,
    )
    if status.max_parallel_slots is not None:
        message.max_parallel_slots = status.max_parallel_slots
    if status.memory_bytes is not None:
        message.memory_bytes = status.memory_bytes
    times = status.load_times
    if times is not None:
        message.load_times.CopyFrom(
            management_pb.LoadTimes(
                load_seconds=times.load_seconds, warmup_seconds=times.warmup_seconds, warmup_runs=times.warmup_runs
            )
        )
    batching = status.batching
    if batching is not None:
        message.batching.CopyFrom(
            management_pb.DynamicBatching(
                max_batch_size=status.max_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_us,
                preferred_batch_sizes=batching.preferred_batch_sizes,
                max_queue_size=batching.max_queue_size,
                allow_timeout_override=batching.allow_timeout_override,
            )
        )
    return message


def model_statuses(statuses: Iterable[ModelStatus]) -> management_pb.ListModelsResponse:
    """ListModels' answer."""
    return management_pb.ListModelsResponse(models=[model_status(status) for status in statuses])


def unloaded_models(unloaded: Iterable[str], not_found: Iterable[str]) -> management_pb.UnloadModelsResponse:
    """UnloadModels' answer."""
    return management_pb.UnloadModelsResponse(unloaded=unloaded, not_found=not_found)
