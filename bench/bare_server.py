"""The bench's ceiling: a bare grpcio sync server for the KServe v2 / Triton protocol.

`python bench/bare_server.py [--port 0] [--model-repository demo/model_repository] [--models simple,identity_fp32]`

It serves the same model files as slotserve (one onnxruntime InferenceSession per model, intra_op_num_threads=1,
inter_op_num_threads=1, shared by every handler thread) from a grpc.server with a ThreadPoolExecutor(16), and
does nothing else: no admission, no queue, no deadlines or cancellation, no request checks (a malformed request
fails however onnxruntime or numpy fails), no timing. It answers just what perf_analyzer needs besides
ModelInfer: ServerMetadata, ModelMetadata, ModelConfig (config.pbtxt as written) and ModelStatistics, whose
counts grow with each inference (perf_analyzer insists on a growing `queue.count` for numeric version "1";
the counters are bumped without a lock, so a rare lost update is possible and harmless). Times are all zero.

Decoding is `np.frombuffer` over raw_input_contents; encoding is `ndarray.tobytes()` into raw_output_contents.
It prints `bare listening on 127.0.0.1:PORT` on stdout once serving.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from google.protobuf import text_format  # noqa: E402

from generated import grpc_service_pb2 as pb  # noqa: E402
from generated import grpc_service_pb2_grpc as pb_grpc  # noqa: E402
from generated import model_config_pb2  # noqa: E402

VERSION = "1"
_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def _datatype(config_type: int) -> str:
    name = model_config_pb2.DataType.Name(config_type)[len("TYPE_") :]
    return "BYTES" if name == "STRING" else name


class BareModel:
    def __init__(self, directory: Path) -> None:
        self.config = model_config_pb2.ModelConfig()
        text_format.Parse((directory / "config.pbtxt").read_text(), self.config)
        self.name = self.config.name or directory.name
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            str(directory / VERSION / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.dtypes = {t.name: _NUMPY[_datatype(t.data_type)] for t in self.config.input}
        self.output_types = {t.name: _datatype(t.data_type) for t in self.config.output}
        self.output_names = [t.name for t in self.config.output]
        batch = self.config.max_batch_size > 0
        self.metadata = pb.ModelMetadataResponse(name=self.name, versions=[VERSION], platform="onnxruntime_onnx")
        for tensors, target in ((self.config.input, self.metadata.inputs), (self.config.output, self.metadata.outputs)):
            for tensor in tensors:
                target.add(
                    name=tensor.name,
                    datatype=_datatype(tensor.data_type),
                    shape=([-1] if batch else []) + list(tensor.dims),
                )
        self.count = 0


class BareServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, models: dict[str, BareModel]) -> None:
        self.models = models

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name in self.models)

    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="bare", version="0", extensions=["statistics", "model_configuration"])

    def _model(self, name: str, context) -> BareModel:
        model = self.models.get(name)
        if model is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return model  # type: ignore[return-value]  # abort raises

    def ModelMetadata(self, request, context):
        return self._model(request.name, context).metadata

    def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=self._model(request.name, context).config)

    def ModelStatistics(self, request, context):
        response = pb.ModelStatisticsResponse()
        names = [request.name] if request.name else sorted(self.models)
        for name in names:
            model = self._model(name, context)
            stats = response.model_stats.add(
                name=model.name, version=VERSION, inference_count=model.count, execution_count=model.count
            )
            for field in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
                getattr(stats.inference_stats, field).count = model.count
        return response

    def ModelInfer(self, request, context):
        model = self.models[request.model_name]
        raw = request.raw_input_contents
        feed = {
            tensor.name: np.frombuffer(raw[i], dtype=model.dtypes[tensor.name]).reshape(tensor.shape)
            for i, tensor in enumerate(request.inputs)
        }
        names = [o.name for o in request.outputs] or model.output_names
        results = model.session.run(names, feed)
        response = pb.ModelInferResponse(model_name=model.name, model_version=VERSION, id=request.id)
        for name, array in zip(names, results, strict=True):
            response.outputs.add(name=name, datatype=model.output_types[name], shape=array.shape)
            response.raw_output_contents.append(array.tobytes())
        model.count += 1
        return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "demo" / "model_repository")
    parser.add_argument("--models", default="simple,identity_fp32", help="comma-separated model directories")
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args(argv)
    models = {}
    for name in args.models.split(","):
        model = BareModel(args.model_repository / name)
        models[model.name] = model
    limit = 1 << 30
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(BareServicer(models), server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"bare listening on {args.host}:{port}", flush=True)
    stop.wait()
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
