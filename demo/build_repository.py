"""Build the demo model repository: `python -m demo.build_repository --output DIR [--cache DIR] [--measure]`.

Layout (docs/model-repository.md): `DIR/<name>/config.pbtxt` (text format of inference.ModelConfig) and
`DIR/<name>/1/model.onnx`. Seven models are made here with the onnx helper API; the eighth is the published Silero
VAD checkpoint, taken from its wheel; the ninth is a python model (`DIR/byte_tokenizer/1/model.py`). No ONNX
config sets instance_group: the server decides slot counts. The python model asks for one slot: each slot is a
worker process that starts with the server (see docs/python-models.md), and one keeps start-up short.

    simple           INT32 INPUT0, INPUT1 [16], max_batch_size 8 -> OUTPUT0 = sum, OUTPUT1 = difference
                     (Triton's classic example model, which stock tritonclient examples call)
    simple_string    BYTES INPUT0, INPUT1 [16], max_batch_size 8, each element a decimal integer as text ->
                     BYTES OUTPUT0 = sum, OUTPUT1 = difference, as decimal text (Triton's example of the same
                     name and signature; tritonclient's string examples call it). ONNX Cast parses each element
                     to INT64 as C's strtoll does: optional leading white space and sign, then digits; whatever
                     follows the digits is ignored ("12abc" is 12), and an element with no digits, or beyond the
                     INT64 range, fails the request. Sum and difference wrap at the INT64 range.
    simple_int8      INT8 INPUT0, INPUT1 [16], max_batch_size 8 -> OUTPUT0 = sum, OUTPUT1 = difference, wrapping
                     at the INT8 range as two's complement does (Triton's example of the same name and signature;
                     tritonclient's explicit int8 example calls it)
    simple_identity  BYTES INPUT0 [-1] -> OUTPUT0, max_batch_size 8 (ONNX Identity on a string tensor)
    identity_fp32    FP32 INPUT0 [-1] -> OUTPUT0, max_batch_size 8 (large payloads, e.g. [1, 4194304] = 16 MiB)
    matmul_chain     FP32 INPUT0 [384, 64] -> OUTPUT0 [384, 64], max_batch_size 0: a 64x512 MatMul widens the
                     input, eight 512x512 MatMuls follow, a 512x64 MatMul narrows it back; a Tanh after each.
                     Compute-heavy with small I/O (96 KiB each way), so slot scaling measures the engine, not
                     the transport. Measured with onnxruntime 1.32, intra_op_num_threads=1, on one core of an
                     AVX-512 Xeon (the 2-core build machine): median about 10.5 ms per call (1.66 GFLOP per
                     call, 8.6 MB of weights). `--measure` prints the figure for the machine at hand.
    silero_vad       silero-vad 6.2.3's silero_vad.onnx, unchanged (sha256 pinned below): input FP32 [-1, -1],
                     state FP32 [2, -1, 128], sr INT64 scalar -> output FP32 [-1, 1], stateN FP32 [2, -1, 128]
    silero_vad_stream  the same checkpoint as a sequence model (`sequence_batching`, implicit state): the server
                     keeps each stream's `state` (zeros at its start), so clients send `input` and `sr` only
    mlp              FP32 INPUT0 [1024] -> OUTPUT0 [1024], max_batch_size 16, `dynamic_batching { }`: a
                     1024 -> 4096 -> 4096 -> 1024 multilayer perceptron with ReLU (25.2 M FP32 weights, 101 MB, from
                     a fixed seed). Weight-bound: every call reads all the weights, so rows per call are nearly
                     free (onnxruntime, one thread, this machine: about 98 rows/s one at a time, 750 rows/s in
                     calls of 16). The model dynamic batching exists for.
    byte_tokenizer   python model (backend "python"): BYTES TEXT [-1] (one UTF-8 text per element) -> INT64
                     INPUT_IDS, ATTENTION_MASK [-1, -1]: ByT5's byte-level tokenization (id = byte + 3, then the
                     end-of-sequence id 1; pad id 0 and mask 0 after a text's end), rows padded to the longest text,
                     each text cut to `max_tokens` ids (parameter, default 1024) with its end id kept. The
                     pre-processing a byte-level model (ByT5, CANINE-style) needs in front of it.

The build is deterministic (fixed seeds, deterministic serialization) and idempotent: every file is written
atomically, so rebuilding over an existing repository, or while a server reads it, is safe. The silero wheel is
downloaded once with pip (without installing it or its dependencies) into the cache folder, by default `.cache`
beside the output folder.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from generated import model_config_pb2

OPSET = 17
# The lowest IR version that can carry opset 17 (8): every onnxruntime release since 1.12 reads it.
IR_VERSION = helper.find_min_ir_version_for([helper.make_opsetid("", OPSET)])
PRODUCER = "slotserve-demo"

MATMUL_ROWS = 384  # rows of the input: the "batch" of one call
MATMUL_WIDTH = 512  # the inner weight matrices are WIDTH x WIDTH
MATMUL_LAYERS = 8  # inner layers; an input and an output projection surround them
MATMUL_IO_WIDTH = 64  # columns of the input and the output
MATMUL_SEED = 20261129

SILERO_VERSION = "6.2.3"
SILERO_WHEEL = f"silero_vad-{SILERO_VERSION}-py3-none-any.whl"
SILERO_MEMBER = "silero_vad/data/silero_vad.onnx"
# sha256 of SILERO_MEMBER in the 6.2.3 wheel (it matches the wheel's own RECORD entry).
SILERO_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"

MLP_WIDTHS = (1024, 4096, 4096, 1024)  # input, two hidden layers, output
MLP_MAX_BATCH_SIZE = 16
MLP_SEED = 20261201

MODEL_NAMES = (
    "simple",
    "simple_string",
    "simple_int8",
    "simple_identity",
    "identity_fp32",
    "matmul_chain",
    "silero_vad",
    "silero_vad_stream",
    "mlp",
    "byte_tokenizer",
)
PYTHON_MODEL_NAMES = ("byte_tokenizer",)  # backend "python": a model.py instead of a model.onnx

_CONFIG_HEADER = "# Written by demo/build_repository.py (make models); edits are lost on the next build.\n"
_CONFIG_TYPE: dict[int, int] = {
    TensorProto.INT8: model_config_pb2.TYPE_INT8,
    TensorProto.INT32: model_config_pb2.TYPE_INT32,
    TensorProto.INT64: model_config_pb2.TYPE_INT64,
    TensorProto.FLOAT: model_config_pb2.TYPE_FP32,
    TensorProto.STRING: model_config_pb2.TYPE_STRING,
}


class BuildError(Exception):
    """The repository could not be built (download failed, checkpoint differs from the pinned one)."""


@dataclass(frozen=True)
class Tensor:
    """One input or output as config.pbtxt states it: dims exclude the batch dimension of a batching model."""

    name: str
    elem_type: int  # onnx TensorProto data type
    dims: tuple[int, ...]


@dataclass(frozen=True)
class BuiltModel:
    """What goes into one model directory."""

    name: str
    max_batch_size: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    onnx_bytes: bytes
    config_extra: str = ""  # config.pbtxt lines after the tensors (e.g. a dynamic_batching block)


# ---------------------------------------------------------------------------------------------------- helpers


def _value_info(tensor: Tensor, max_batch_size: int) -> onnx.ValueInfoProto:
    """The graph's view of a tensor: a symbolic leading "batch" dimension for batching models, and a symbolic
    dimension for each -1, so onnxruntime reports them as variable."""
    dims: list[int | str] = ["batch"] if max_batch_size > 0 else []
    dims += [f"{tensor.name}_dim{i}" if d == -1 else d for i, d in enumerate(tensor.dims)]
    return helper.make_tensor_value_info(tensor.name, tensor.elem_type, dims)


def _serialize(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name=PRODUCER
    )
    onnx.checker.check_model(model, full_check=True)
    # deterministic=True keeps rebuilds byte-identical.
    return model.SerializeToString(deterministic=True)


def _graph(name: str, nodes, inputs, outputs, max_batch_size: int, initializers=()) -> onnx.GraphProto:
    return helper.make_graph(
        nodes,
        name,
        [_value_info(t, max_batch_size) for t in inputs],
        [_value_info(t, max_batch_size) for t in outputs],
        list(initializers),
    )


def config_text(model: BuiltModel) -> str:
    """config.pbtxt for `model`. The tensors are printed from a ModelConfig message so that every field name is
    checked; a zero-dimension (scalar) tensor simply has no `dims` lines. The header fields are written by hand
    because text format leaves out proto3 defaults, and `max_batch_size: 0` should be stated, not implied."""
    tensors = model_config_pb2.ModelConfig()
    for tensor in model.inputs:
        tensors.input.add(name=tensor.name, data_type=_CONFIG_TYPE[tensor.elem_type], dims=tensor.dims)
    for tensor in model.outputs:
        tensors.output.add(name=tensor.name, data_type=_CONFIG_TYPE[tensor.elem_type], dims=tensor.dims)
    header = f'name: "{model.name}"\nbackend: "onnxruntime"\nmax_batch_size: {model.max_batch_size}\n'
    return _CONFIG_HEADER + header + text_format.MessageToString(tensors) + model.config_extra


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` in one step: a reader (or a concurrent build) never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(data)
    # NamedTemporaryFile creates the file 0600; a server running as another user must be able to read it.
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, path)


def write_model(root: Path, model: BuiltModel) -> Path:
    """Write `model` into `root/<name>/` and return that directory."""
    directory = root / model.name
    _write_atomic(directory / "1" / "model.onnx", model.onnx_bytes)
    _write_atomic(directory / "config.pbtxt", config_text(model).encode("utf-8"))
    return directory


def write_python_model(root: Path, name: str, config: str, source: str) -> Path:
    """Write a python model (config.pbtxt and 1/model.py) into `root/<name>/` and return that directory."""
    directory = root / name
    _write_atomic(directory / "1" / "model.py", source.encode("utf-8"))
    _write_atomic(directory / "config.pbtxt", (_CONFIG_HEADER + config).encode("utf-8"))
    return directory


# ----------------------------------------------------------------------------------------------- the models


def _sum_and_difference(elem_type: int) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The signature of Triton's `simple` family: INPUT0, INPUT1 [16] -> OUTPUT0, OUTPUT1 [16]."""
    inputs = (Tensor("INPUT0", elem_type, (16,)), Tensor("INPUT1", elem_type, (16,)))
    outputs = (Tensor("OUTPUT0", elem_type, (16,)), Tensor("OUTPUT1", elem_type, (16,)))
    return inputs, outputs


def _build_add_sub(name: str, elem_type: int) -> BuiltModel:
    inputs, outputs = _sum_and_difference(elem_type)
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    graph = _graph(name, nodes, inputs, outputs, max_batch_size=8)
    return BuiltModel(name, 8, inputs, outputs, _serialize(graph))


def build_simple() -> BuiltModel:
    return _build_add_sub("simple", TensorProto.INT32)


def build_simple_int8() -> BuiltModel:
    return _build_add_sub("simple_int8", TensorProto.INT8)


def build_simple_string() -> BuiltModel:
    """Text in, text out: Cast parses the strings to INT64, Add and Sub, Cast formats the results."""
    inputs, outputs = _sum_and_difference(TensorProto.STRING)
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT64),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT64),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    graph = _graph("simple_string", nodes, inputs, outputs, max_batch_size=8)
    return BuiltModel("simple_string", 8, inputs, outputs, _serialize(graph))


def _build_identity(name: str, elem_type: int) -> BuiltModel:
    inputs = (Tensor("INPUT0", elem_type, (-1,)),)
    outputs = (Tensor("OUTPUT0", elem_type, (-1,)),)
    nodes = [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])]
    graph = _graph(name, nodes, inputs, outputs, max_batch_size=8)
    return BuiltModel(name, 8, inputs, outputs, _serialize(graph))


def build_simple_identity() -> BuiltModel:
    return _build_identity("simple_identity", TensorProto.STRING)


def build_identity_fp32() -> BuiltModel:
    return _build_identity("identity_fp32", TensorProto.FLOAT)


def matmul_chain_weights() -> list[np.ndarray]:
    """The chain's weight matrices, first to last: IO_WIDTH x WIDTH, LAYERS x (WIDTH x WIDTH), WIDTH x IO_WIDTH.
    Each is scaled by 1/sqrt(its input width) so activations keep unit-order magnitude through the Tanh layers
    (neither saturating nor vanishing), which keeps the output a meaningful check."""
    rng = np.random.default_rng(MATMUL_SEED)
    shapes = (
        [(MATMUL_IO_WIDTH, MATMUL_WIDTH)]
        + [(MATMUL_WIDTH, MATMUL_WIDTH)] * MATMUL_LAYERS
        + [(MATMUL_WIDTH, MATMUL_IO_WIDTH)]
    )
    return [(rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32) for shape in shapes]


def build_matmul_chain() -> BuiltModel:
    shape = (MATMUL_ROWS, MATMUL_IO_WIDTH)
    inputs = (Tensor("INPUT0", TensorProto.FLOAT, shape),)
    outputs = (Tensor("OUTPUT0", TensorProto.FLOAT, shape),)
    nodes, initializers, current = [], [], "INPUT0"
    weights = matmul_chain_weights()
    for layer, weight in enumerate(weights):
        initializers.append(numpy_helper.from_array(weight, f"weight{layer}"))
        result = "OUTPUT0" if layer == len(weights) - 1 else f"activation{layer}"
        # Tanh between the MatMuls stops any optimizer from multiplying the weights together ahead of time.
        nodes.append(helper.make_node("MatMul", [current, f"weight{layer}"], [f"product{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"product{layer}"], [result]))
        current = result
    graph = _graph("matmul_chain", nodes, inputs, outputs, max_batch_size=0, initializers=initializers)
    return BuiltModel("matmul_chain", 0, inputs, outputs, _serialize(graph))


def mlp_weights() -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight, bias) per layer of the MLP, first to last; weights scaled by 1/sqrt(fan-in) (He-like for ReLU)
    so activations keep unit-order magnitude and the outputs are a meaningful check."""
    rng = np.random.default_rng(MLP_SEED)
    layers = []
    for fan_in, fan_out in zip(MLP_WIDTHS, MLP_WIDTHS[1:], strict=False):
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        layers.append((weight, (rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.01))))
    return layers


def build_mlp() -> BuiltModel:
    inputs = (Tensor("INPUT0", TensorProto.FLOAT, (MLP_WIDTHS[0],)),)
    outputs = (Tensor("OUTPUT0", TensorProto.FLOAT, (MLP_WIDTHS[-1],)),)
    nodes, initializers, current = [], [], "INPUT0"
    layers = mlp_weights()
    for index, (weight, bias) in enumerate(layers):
        initializers += [
            numpy_helper.from_array(weight, f"weight{index}"),
            numpy_helper.from_array(bias, f"bias{index}"),
        ]
        last = index == len(layers) - 1
        nodes.append(helper.make_node("MatMul", [current, f"weight{index}"], [f"product{index}"]))
        nodes.append(
            helper.make_node("Add", [f"product{index}", f"bias{index}"], ["OUTPUT0" if last else f"linear{index}"])
        )
        if not last:
            nodes.append(helper.make_node("Relu", [f"linear{index}"], [f"activation{index}"]))
            current = f"activation{index}"
    graph = _graph("mlp", nodes, inputs, outputs, max_batch_size=MLP_MAX_BATCH_SIZE, initializers=initializers)
    return BuiltModel(
        "mlp", MLP_MAX_BATCH_SIZE, inputs, outputs, _serialize(graph), config_extra="dynamic_batching { }\n"
    )


def mlp_reference(rows: np.ndarray) -> np.ndarray:
    """The MLP computed with numpy (float64 accumulation), to check what a server returns."""
    activation = rows.astype(np.float64)
    layers = mlp_weights()
    for index, (weight, bias) in enumerate(layers):
        activation = activation @ weight.astype(np.float64) + bias
        if index < len(layers) - 1:
            activation = np.maximum(activation, 0.0)
    return activation


# Declared rather than auto-completed: the model reports stateN as fully dynamic, but it is the next `state`,
# [2, batch, 128]; `sr` (the sample rate, 16000 or 8000) is a scalar, hence no dims.
SILERO_INPUTS = (
    Tensor("input", TensorProto.FLOAT, (-1, -1)),
    Tensor("state", TensorProto.FLOAT, (2, -1, 128)),
    Tensor("sr", TensorProto.INT64, ()),
)
SILERO_OUTPUTS = (
    Tensor("output", TensorProto.FLOAT, (-1, 1)),
    Tensor("stateN", TensorProto.FLOAT, (2, -1, 128)),
)


def download_silero_wheel(cache: Path) -> Path:
    """The silero-vad wheel in `cache`, downloaded with pip on first use (no install, no dependencies)."""
    wheel = cache / SILERO_WHEEL
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    # Download into a private folder, then move: concurrent builds sharing the cache never see a partial wheel.
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            f"silero-vad=={SILERO_VERSION}",
            "-d",
            scratch,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        downloaded = Path(scratch) / SILERO_WHEEL
        if result.returncode != 0 or not downloaded.is_file():
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise BuildError(
                f"could not download silero-vad=={SILERO_VERSION} with pip (exit {result.returncode}):\n{detail}"
            )
        os.replace(downloaded, wheel)
    return wheel


def extract_silero(wheel: Path) -> bytes:
    """silero_vad.onnx from the wheel, checked against the pinned sha256."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(SILERO_MEMBER)
    except (zipfile.BadZipFile, KeyError) as error:
        raise BuildError(f"{wheel} is not a usable silero-vad wheel ({error}); delete it to download again") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != SILERO_SHA256:
        raise BuildError(
            f"{SILERO_MEMBER} in {wheel} has sha256 {digest}, expected {SILERO_SHA256}: this is not "
            f"the published silero-vad {SILERO_VERSION} checkpoint (delete the wheel to download again)"
        )
    return data


def build_silero_vad(cache: Path) -> BuiltModel:
    data = extract_silero(download_silero_wheel(cache))
    return BuiltModel("silero_vad", 0, SILERO_INPUTS, SILERO_OUTPUTS, data)


# The same checkpoint as a sequence model: the server keeps each audio stream's recurrent state (implicit state,
# docs/sequences.md), so a client sends only its chunks and `sr`, with sequence_id / sequence_start / sequence_end.
SILERO_STREAM_CONFIG = """sequence_batching {
  max_sequence_idle_microseconds: 10000000
  direct { }
  state [ { input_name: "state" output_name: "stateN" data_type: TYPE_FP32 dims: [ 2, 1, 128 ]
            initial_state { data_type: TYPE_FP32 dims: [ 2, 1, 128 ] zero_data: true } } ]
}
"""


def build_silero_vad_stream(cache: Path) -> BuiltModel:
    data = extract_silero(download_silero_wheel(cache))
    inputs = tuple(t for t in SILERO_INPUTS if t.name != "state")
    outputs = tuple(t for t in SILERO_OUTPUTS if t.name != "stateN")
    return BuiltModel("silero_vad_stream", 0, inputs, outputs, data, config_extra=SILERO_STREAM_CONFIG)


# ------------------------------------------------------------------------------------------------ entry point


BYTE_TOKENIZER_CONFIG = """name: "byte_tokenizer"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "INPUT_IDS" data_type: TYPE_INT64 dims: [ -1, -1 ] },
  { name: "ATTENTION_MASK" data_type: TYPE_INT64 dims: [ -1, -1 ] }
]
instance_group [ { count: 1 } ]
parameters { key: "max_tokens" value: { string_value: "1024" } }
"""

BYTE_TOKENIZER_SOURCE = '''"""ByT5's byte-level tokenizer as a Triton python model (demo/build_repository.py wrote it).

TEXT (BYTES [-1], one UTF-8 text per element) -> INPUT_IDS, ATTENTION_MASK (INT64 [texts, longest + 1]): each
byte becomes id byte + 3 (0 is padding, 1 the end of a sequence, 2 unknown), the end id follows the text, rows
are padded with 0 (mask 0) to the longest; a text is cut to `max_tokens` ids, its end id kept.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

PAD, EOS, OFFSET = 0, 1, 3


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.max_tokens = int(parameters.get("max_tokens", {}).get("string_value", "1024"))
        if self.max_tokens < 1:
            raise pb_utils.TritonModelException(f"max_tokens must be at least 1, got {self.max_tokens}")

    def execute(self, requests):
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request):
        texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
        rows = [np.frombuffer(text, np.uint8)[: self.max_tokens - 1] for text in texts]
        width = max((len(row) for row in rows), default=0) + 1
        ids = np.full((len(rows), width), PAD, np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = row.astype(np.int64) + OFFSET
            ids[index, len(row)] = EOS
            mask[index, : len(row) + 1] = 1
        outputs = [pb_utils.Tensor("INPUT_IDS", ids), pb_utils.Tensor("ATTENTION_MASK", mask)]
        return pb_utils.InferenceResponse(output_tensors=outputs)
'''


def byte_tokenizer_reference(texts: list[bytes], max_tokens: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """What byte_tokenizer answers, computed here, to check what a server returns."""
    rows = [list(text[: max_tokens - 1]) for text in texts]
    width = max((len(row) for row in rows), default=0) + 1
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row) + 1] = [byte + 3 for byte in row] + [1]
        mask[index, : len(row) + 1] = 1
    return ids, mask


def default_cache(output: Path) -> Path:
    """`.cache` beside the output folder: outside the repository, so the server never sees it."""
    return Path(output).resolve().parent / ".cache"


def build_repository(output: Path | str, cache: Path | str | None = None) -> list[Path]:
    """Build every demo model into `output` and return the model directories, in MODEL_NAMES order."""
    output = Path(output)
    cache = Path(cache) if cache is not None else default_cache(output)
    output.mkdir(parents=True, exist_ok=True)
    builders = (
        build_simple,
        build_simple_string,
        build_simple_int8,
        build_simple_identity,
        build_identity_fp32,
        build_matmul_chain,
        lambda: build_silero_vad(cache),
        lambda: build_silero_vad_stream(cache),
        build_mlp,
    )
    built = [write_model(output, build()) for build in builders]
    return [*built, write_python_model(output, "byte_tokenizer", BYTE_TOKENIZER_CONFIG, BYTE_TOKENIZER_SOURCE)]


def measure_matmul_chain(model_file: Path, runs: int = 50) -> float:
    """Median milliseconds per matmul_chain call on one thread (how the docstring's figure was taken)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    feed = {"INPUT0": np.random.default_rng(0).standard_normal((MATMUL_ROWS, MATMUL_IO_WIDTH)).astype(np.float32)}
    for _ in range(5):  # warm-up: first runs allocate the arena
        session.run(None, feed)
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        timings.append(time.perf_counter() - start)
    return 1000.0 * float(np.median(timings))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.build_repository", description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path, help="repository folder to (re)build")
    parser.add_argument(
        "--cache", type=Path, default=None, help="where the silero-vad wheel is kept (default: .cache beside --output)"
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="also print matmul_chain's median ms per call with one onnxruntime thread",
    )
    args = parser.parse_args(argv)
    try:
        directories = build_repository(args.output, args.cache)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for directory in directories:
        model_file = next(iter(sorted((directory / "1").glob("model.*"))))
        print(f"{directory}: {model_file.name} {model_file.stat().st_size / 1e6:.1f} MB")
    if args.measure:
        median = measure_matmul_chain(args.output / "matmul_chain" / "1" / "model.onnx")
        print(f"matmul_chain: median {median:.2f} ms per call (intra_op_num_threads=1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
