"""The demo model repository: built by demo.build_repository, read by engine.config.repository, served by the ONNX
Runtime backend (the python model by the python backend, in a worker process). Every model's metadata is checked
and one real inference per model is compared with an independent computation (numpy, or a direct onnxruntime
session for the Silero checkpoint).

The silero-vad wheel is downloaded once into demo/.cache and reused by later runs.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

from demo import build_repository as builder
from engine.config.repository import ModelRepository
from engine.errors import ExecutionError
from engine.interface import CancelToken
from engine.onnxruntime_backend import OnnxRuntimeBackend, session_options
from engine.python.backend import PythonBackend

PROJECT = Path(__file__).resolve().parents[3]
CACHE = PROJECT / "demo" / ".cache"


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo") / "model_repository"
    assert builder.main(["--output", str(root), "--cache", str(CACHE)]) == 0
    return root


@pytest.fixture
def load(repository):
    """load(name) -> (spec, loaded model, context); everything is closed after the test."""
    opened = []

    def _load(name: str):
        spec = ModelRepository(repository).read(name)
        loaded = (PythonBackend() if spec.backend == "python" else OnnxRuntimeBackend()).load(spec)
        context = loaded.create_context()
        opened.append((loaded, context))
        return spec, loaded, context

    yield _load
    for loaded, context in opened:
        context.close()
        loaded.close()


def _signature(tensors) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(t.name, t.datatype, t.shape) for t in tensors]


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_layout_and_configs(repository):
    assert ModelRepository(repository).names() == sorted(builder.MODEL_NAMES)
    for name in builder.PYTHON_MODEL_NAMES:
        text = (repository / name / "config.pbtxt").read_text()
        assert (repository / name / "1" / "model.py").is_file()
        # a python model's slot is a worker process that starts with the server: one keeps start-up short
        assert f'name: "{name}"' in text and 'backend: "python"' in text
        spec = ModelRepository(repository).read(name)
        assert (spec.backend, spec.version, spec.instance_count) == ("python", "1", 1)
    for name in (name for name in builder.MODEL_NAMES if name not in builder.PYTHON_MODEL_NAMES):
        text = (repository / name / "config.pbtxt").read_text()
        assert (repository / name / "1" / "model.onnx").is_file()
        # name, backend and max_batch_size are always stated; slot counts are the server's to decide.
        assert f'name: "{name}"' in text and 'backend: "onnxruntime"' in text and "max_batch_size:" in text
        assert "instance_group" not in text
        spec = ModelRepository(repository).read(name)
        assert (spec.backend, spec.version, spec.instance_count) == ("onnxruntime", "1", None)


def test_rebuild_over_existing_repository_is_byte_identical(repository):
    before = _digests(repository)
    builder.build_repository(repository, CACHE)
    assert _digests(repository) == before


def test_simple_adds_and_subtracts(load):
    _, loaded, context = load("simple")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 8
    assert _signature(metadata.inputs) == [("INPUT0", "INT32", (16,)), ("INPUT1", "INT32", (16,))]
    assert _signature(metadata.outputs) == [("OUTPUT0", "INT32", (16,)), ("OUTPUT1", "INT32", (16,))]
    assert metadata.wire_shape(metadata.inputs[0]) == (-1, 16)
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    result = context.execute({"INPUT0": a, "INPUT1": b}, [], CancelToken())
    np.testing.assert_array_equal(result["OUTPUT0"], a + b)
    np.testing.assert_array_equal(result["OUTPUT1"], a - b)
    assert result["OUTPUT0"].dtype == np.int32


def test_simple_string_adds_and_subtracts_decimal_text(load):
    _, loaded, context = load("simple_string")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 8
    assert _signature(metadata.inputs) == [("INPUT0", "BYTES", (16,)), ("INPUT1", "BYTES", (16,))]
    assert _signature(metadata.outputs) == [("OUTPUT0", "BYTES", (16,)), ("OUTPUT1", "BYTES", (16,))]
    rng = np.random.default_rng(5)
    a = rng.integers(-(2**40), 2**40, size=(3, 16), dtype=np.int64)
    b = rng.integers(-(2**40), 2**40, size=(3, 16), dtype=np.int64)
    a[0, :3] = [0, -7, 2**62]  # zero, a sign, a value beyond INT32

    def text(array):
        return np.array([str(value).encode() for value in array.reshape(-1)], dtype=object).reshape(array.shape)

    result = context.execute({"INPUT0": text(a), "INPUT1": text(b)}, [], CancelToken())
    # the outputs are exactly the decimal text of the sum and the difference (no padding, no "+", no ".0")
    assert result["OUTPUT0"].shape == (3, 16)
    assert result["OUTPUT0"].tolist() == text(a + b).tolist()
    assert result["OUTPUT1"].tolist() == text(a - b).tolist()


def test_simple_string_refuses_an_element_that_is_not_a_number(load):
    _, _, context = load("simple_string")
    data = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    bad = data.copy()
    bad[0, 5] = b"five"
    with pytest.raises(ExecutionError) as failure:
        context.execute({"INPUT0": bad, "INPUT1": data}, [], CancelToken())
    assert "Cast" in str(failure.value.__cause__)  # onnxruntime's parse failure (the server logs it)
    # and the context still serves the next request
    result = context.execute({"INPUT0": data, "INPUT1": data}, [], CancelToken())
    assert result["OUTPUT0"].tolist() == [[str(2 * i).encode() for i in range(16)]]


def test_simple_string_parses_like_strtoll_and_wraps_at_the_int64_range(load):
    # what the builder's docstring promises for text that is not plain decimal
    _, _, context = load("simple_string")
    first = np.array([[b" -3", b"12abc", b"+7", str(2**63 - 1).encode()] + [b"0"] * 12], dtype=object)
    ones = np.array([[b"1"] * 16], dtype=object)
    result = context.execute({"INPUT0": first, "INPUT1": ones}, [], CancelToken())
    assert result["OUTPUT0"][0, :4].tolist() == [b"-2", b"13", b"8", str(-(2**63)).encode()]
    with pytest.raises(ExecutionError):  # beyond the INT64 range
        context.execute(
            {"INPUT0": np.array([[str(2**63).encode()] * 16], dtype=object), "INPUT1": ones}, [], CancelToken()
        )


def test_simple_int8_adds_and_subtracts_wrapping_like_twos_complement(load):
    _, loaded, context = load("simple_int8")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 8
    assert _signature(metadata.inputs) == [("INPUT0", "INT8", (16,)), ("INPUT1", "INT8", (16,))]
    assert _signature(metadata.outputs) == [("OUTPUT0", "INT8", (16,)), ("OUTPUT1", "INT8", (16,))]
    rng = np.random.default_rng(6)
    a = rng.integers(-128, 128, size=(8, 16), dtype=np.int8)
    b = rng.integers(-128, 128, size=(8, 16), dtype=np.int8)
    a[0, :2], b[0, :2] = [127, -128], [1, 1]  # both ends of the range wrap
    result = context.execute({"INPUT0": a, "INPUT1": b}, [], CancelToken())
    assert result["OUTPUT0"].dtype == np.int8 and result["OUTPUT1"].dtype == np.int8
    np.testing.assert_array_equal(result["OUTPUT0"], a + b)  # numpy's int8 arithmetic wraps the same way
    np.testing.assert_array_equal(result["OUTPUT1"], a - b)
    assert result["OUTPUT0"][0, 0] == -128 and result["OUTPUT1"][0, 1] == 127


def test_simple_identity_round_trips_bytes(load):
    _, loaded, context = load("simple_identity")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 8
    assert _signature(metadata.inputs) == [("INPUT0", "BYTES", (-1,))]
    assert _signature(metadata.outputs) == [("OUTPUT0", "BYTES", (-1,))]
    assert metadata.wire_shape(metadata.outputs[0]) == (-1, -1)
    data = np.array([[b"hello", b"", "gr\u00fc\u00dfe".encode()], [b"a", b"bb", b"ccc"]], dtype=object)
    result = context.execute({"INPUT0": data}, ["OUTPUT0"], CancelToken())
    assert result["OUTPUT0"].shape == (2, 3)
    assert result["OUTPUT0"].tolist() == data.tolist()


def test_identity_fp32_round_trips_16_mib(load):
    _, loaded, context = load("identity_fp32")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 8
    assert _signature(metadata.inputs) == [("INPUT0", "FP32", (-1,))]
    assert _signature(metadata.outputs) == [("OUTPUT0", "FP32", (-1,))]
    data = np.random.default_rng(2).standard_normal((1, 4194304)).astype(np.float32)
    metadata.check_request({"INPUT0": ("FP32", data.shape)}, [])
    result = context.execute({"INPUT0": data}, [], CancelToken())
    np.testing.assert_array_equal(result["OUTPUT0"], data)


def test_mlp_is_a_batching_model_and_matches_numpy_for_one_row_and_for_sixteen(load):
    spec, loaded, context = load("mlp")
    assert spec.max_batch_size == builder.MLP_MAX_BATCH_SIZE and spec.batching is not None
    assert spec.batching.max_queue_delay_us == 0 and spec.batching.preferred_batch_sizes == ()
    assert _signature(loaded.metadata.inputs) == [("INPUT0", "FP32", (1024,))]
    model = onnx.load(str(spec.model_file))
    weights = sum(numpy_helper.to_array(init).size for init in model.graph.initializer)
    assert weights == sum(a * b + b for a, b in zip(builder.MLP_WIDTHS, builder.MLP_WIDTHS[1:], strict=False))  # 25.2 M
    rows = np.random.default_rng(5).standard_normal((16, 1024)).astype(np.float32)
    expected = builder.mlp_reference(rows)
    assert 0.1 < float(np.std(expected)) < 100.0  # a meaningful comparison, neither vanishing nor exploding
    np.testing.assert_allclose(
        context.execute({"INPUT0": rows}, [], CancelToken())["OUTPUT0"], expected, rtol=1e-3, atol=1e-3
    )
    np.testing.assert_allclose(
        context.execute({"INPUT0": rows[:1]}, [], CancelToken())["OUTPUT0"], expected[:1], rtol=1e-3, atol=1e-3
    )


def test_matmul_chain_matches_numpy(load):
    spec, loaded, context = load("matmul_chain")
    metadata = loaded.metadata
    shape = (builder.MATMUL_ROWS, builder.MATMUL_IO_WIDTH)
    assert metadata.max_batch_size == 0
    assert _signature(metadata.inputs) == [("INPUT0", "FP32", shape)]
    assert _signature(metadata.outputs) == [("OUTPUT0", "FP32", shape)]
    model = onnx.load(str(spec.model_file))
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Tanh"] * (builder.MATMUL_LAYERS + 2)
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    assert sum(w.nbytes for w in weights.values()) < 20 * 1024 * 1024
    data = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    result = context.execute({"INPUT0": data}, [], CancelToken())
    expected = data.astype(np.float64)
    for node in model.graph.node:
        if node.op_type == "MatMul":
            expected = expected @ weights[node.input[1]].astype(np.float64)
        else:
            expected = np.tanh(expected)
    # The scaled weights keep activations away from Tanh saturation, so this compares real numbers.
    assert 0.1 < float(np.std(expected)) < 0.99
    np.testing.assert_allclose(result["OUTPUT0"], expected, rtol=1e-4, atol=1e-4)


def test_silero_vad_matches_direct_onnxruntime(load):
    spec, loaded, context = load("silero_vad")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 0
    assert _signature(metadata.inputs) == [
        ("input", "FP32", (-1, -1)),
        ("state", "FP32", (2, -1, 128)),
        ("sr", "INT64", ()),
    ]
    assert _signature(metadata.outputs) == [("output", "FP32", (-1, 1)), ("stateN", "FP32", (2, -1, 128))]
    assert hashlib.sha256(spec.model_file.read_bytes()).hexdigest() == builder.SILERO_SHA256
    # 512 samples at 16 kHz plus the 64-sample context the silero wrapper prepends.
    inputs = {
        "input": np.random.default_rng(4).uniform(-0.5, 0.5, size=(1, 576)).astype(np.float32),
        "state": np.zeros((2, 1, 128), dtype=np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }
    # The scalar `sr` passes the server's request check with shape [].
    metadata.check_request({"input": ("FP32", (1, 576)), "state": ("FP32", (2, 1, 128)), "sr": ("INT64", ())}, [])
    result = context.execute(inputs, [], CancelToken())
    session = onnxruntime.InferenceSession(
        str(spec.model_file), session_options(spec), providers=["CPUExecutionProvider"]
    )
    probability, state = session.run(["output", "stateN"], inputs)
    np.testing.assert_allclose(result["output"], probability, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(result["stateN"], state, rtol=1e-6, atol=1e-7)
    assert result["output"].shape == (1, 1) and result["stateN"].shape == (2, 1, 128)
    assert 0.0 <= float(result["output"][0, 0]) <= 1.0


def test_cached_wheel_is_used_without_pip(tmp_path, monkeypatch):
    wheel = tmp_path / builder.SILERO_WHEEL
    wheel.write_bytes(b"placeholder")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the wheel is cached")

    monkeypatch.setattr(builder.subprocess, "run", no_pip)
    assert builder.download_silero_wheel(tmp_path) == wheel


def test_checkpoint_with_wrong_sha256_is_refused(tmp_path):
    wheel = tmp_path / builder.SILERO_WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(builder.SILERO_MEMBER, b"not the published checkpoint")
    with pytest.raises(builder.BuildError, match="sha256"):
        builder.extract_silero(wheel)


def test_broken_wheel_is_reported(tmp_path):
    wheel = tmp_path / builder.SILERO_WHEEL
    wheel.write_bytes(b"not a zip")
    with pytest.raises(builder.BuildError, match="delete it to download again"):
        builder.extract_silero(wheel)


def test_byte_tokenizer_gives_byt5_ids_padded_to_the_longest_text(load):
    _, loaded, context = load("byte_tokenizer")
    metadata = loaded.metadata
    assert metadata.max_batch_size == 0
    assert _signature(metadata.inputs) == [("TEXT", "BYTES", (-1,))]
    assert _signature(metadata.outputs) == [("INPUT_IDS", "INT64", (-1, -1)), ("ATTENTION_MASK", "INT64", (-1, -1))]
    texts = [b"hi", "grüße".encode(), b""]
    result = context.execute({"TEXT": np.array(texts, dtype=np.object_)}, [], CancelToken())
    ids, mask = builder.byte_tokenizer_reference(texts)
    np.testing.assert_array_equal(result["INPUT_IDS"], ids)
    np.testing.assert_array_equal(result["ATTENTION_MASK"], mask)
    # ByT5's ids, written out: byte + 3, then 1 (end), 0 (padding)
    assert result["INPUT_IDS"][0].tolist() == [ord("h") + 3, ord("i") + 3, 1, 0, 0, 0, 0, 0]
    assert result["INPUT_IDS"][2].tolist()[:2] == [1, 0] and result["ATTENTION_MASK"][2].tolist()[:2] == [1, 0]


def test_byte_tokenizer_cuts_a_long_text_to_max_tokens_keeping_its_end(load, repository):
    _, _, context = load("byte_tokenizer")
    text = b"x" * 5000
    result = context.execute({"TEXT": np.array([text], dtype=np.object_)}, [], CancelToken())
    assert result["INPUT_IDS"].shape == (1, 1024)
    assert result["INPUT_IDS"][0, -1] == 1 and result["INPUT_IDS"][0, 0] == ord("x") + 3
