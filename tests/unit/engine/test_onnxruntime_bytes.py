"""BYTES tensors through ONNX Runtime (engine/onnxruntime_backend.py): elements go in as a numpy unicode array when
they are short enough for one (16 MiB for 2 million 2-byte strings, where str objects took 144 MiB), else as str
objects, and come back as bytes converted in place (issue 33, item 13). Whatever the path, every element comes
back exactly: non-ASCII text, empty strings, trailing NUL characters (which numpy's fixed-width strings would
drop), one long element among short ones, any shape; an element that is not UTF-8 is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine.config.specs import ModelSpec
from engine.errors import InvalidInputError
from engine.interface import CancelToken
from engine.onnxruntime_backend import OnnxRuntimeBackend, _from_ort_output, _to_ort_input


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    """An ONNX Identity on a string tensor of any shape, loaded, and one slot of it."""
    folder: Path = tmp_path_factory.mktemp("identity") / "1"
    folder.mkdir()
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "identity",
        [helper.make_tensor_value_info("X", TensorProto.STRING, None)],
        [helper.make_tensor_value_info("Y", TensorProto.STRING, None)],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), folder / "model.onnx"
    )
    model = OnnxRuntimeBackend().load(ModelSpec("identity", "onnxruntime", model_file=folder / "model.onnx"))
    yield model.create_context()
    model.close()


def _objects(*elements: bytes) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = list(elements)
    return array


CASES = {
    "ascii": _objects(b"ab", b"cd", b""),
    "utf-8": _objects("é".encode(), "中文".encode(), b"a"),
    "trailing NUL": _objects(b"a\x00", b"\x00", b"b"),
    "inner NUL": _objects(b"he\x00llo", b"ab", b"\x00x"),  # a unicode array reached ONNX Runtime as "he", "", ...
    "one long among short": _objects(b"x" * 10_000, *[b"y"] * 50),
    "empty": _objects(),
}


@pytest.mark.parametrize("case", CASES)
def test_every_element_comes_back_exactly(identity, case):
    sent = CASES[case]
    received = identity.execute({"X": sent}, ["Y"], CancelToken())["Y"]
    assert received.dtype == object and received.shape == sent.shape
    assert [type(e) for e in received] == [bytes] * len(sent)
    assert list(received) == list(sent)


def test_a_shape_is_kept(identity):
    sent = _objects(*[f"{i}".encode() for i in range(12)]).reshape(2, 3, 2)
    received = identity.execute({"X": sent}, ["Y"], CancelToken())["Y"]
    assert received.shape == (2, 3, 2) and received.tolist() == sent.tolist()


def test_short_elements_go_as_a_unicode_array_and_others_as_str_objects():
    short = _to_ort_input("X", _objects(b"ab", "é".encode()))
    assert short.dtype == np.dtype("U2") and short.tolist() == ["ab", "é"]
    assert _to_ort_input("X", _objects(b"a\x00")).dtype == object  # NUL kept: str objects
    mixed = _to_ort_input("X", _objects(b"x" * 10_000, *[b"y"] * 50))
    assert mixed.dtype == object and mixed[0] == "x" * 10_000  # 51 x 10 000 wide would be 2 MB: str objects
    fixed = _to_ort_input("X", np.array([b"ab", b"c"], dtype="S2"))  # numpy bytes arrays are text too
    assert fixed.dtype.kind == "U" and fixed.tolist() == ["ab", "c"]


@pytest.mark.parametrize("elements", [(b"ab", b"\xff\xfe"), (b"x" * 10_000, *[b"y"] * 50, b"\xc3")])
def test_an_element_that_is_not_utf8_is_refused_by_name(identity, elements):
    with pytest.raises(InvalidInputError) as refused:
        identity.execute({"X": _objects(*elements)}, ["Y"], CancelToken())
    assert "input 'X'" in str(refused.value) and "not valid UTF-8" in str(refused.value)


def test_outputs_are_converted_in_place():
    produced = np.array(["ab", "é"], dtype=object)
    converted = _from_ort_output(produced)
    assert converted is produced and converted.tolist() == [b"ab", "é".encode()]
