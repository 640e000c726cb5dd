"""service/internal_calls.py: a request whose tensors are numpy arrays already (ArrayTensors) decodes to the same
arrays (no copy), names its datatypes, counts its bytes like a client's, keys the response cache by content, and
refuses what is not a tensor by name."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.errors import InvalidRequest
from service.dataplane import output_bytes
from service.internal_calls import ArrayTensors


def test_decode_keeps_the_arrays_and_gives_their_signature():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"a", b"bc"], dtype=object)
    decoded = ArrayTensors({"X": x, "S": s}, ["Y"]).decode()
    assert decoded.inputs["X"] is x and decoded.inputs["S"] is s
    assert decoded.signature == {"X": ("FP32", (2, 3)), "S": ("BYTES", (2,))}
    assert decoded.outputs == ["Y"] and decoded.timeout_us == 0


def test_decoded_bytes_are_counted_as_the_dataplane_counts_outputs():
    inputs = {"X": np.zeros(10, np.float64), "S": np.array([b"x"] * 3, dtype=object)}
    assert ArrayTensors(inputs).decoded_bytes() == output_bytes(inputs) == 80 + output_bytes({"S": inputs["S"]})


def test_a_given_datatype_wins_over_the_dtype():
    decoded = ArrayTensors({"X": np.zeros(2, np.uint16)}, datatypes={"X": "FP16"}).decode()
    assert decoded.signature["X"][0] == "FP16"


def test_what_is_not_a_tensor_is_refused_by_name():
    with pytest.raises(InvalidRequest, match="input 'X' is a list, not a numpy array"):
        ArrayTensors({"X": [1, 2]}).decode()  # type: ignore[dict-item]
    with pytest.raises(InvalidRequest, match="input 'C' has numpy dtype complex64"):
        ArrayTensors({"C": np.zeros(2, np.complex64)}).decode()


def test_the_cache_key_follows_content_version_and_requested_outputs():
    def key(x, version="1", outputs=()):
        tensors = ArrayTensors({"X": x}, outputs)
        return tensors.answer_key(tensors.decode(), version)

    x = np.arange(4, dtype=np.float32)
    assert key(x) == key(x.copy())
    assert key(x) != key(x + 1) and key(x) != key(x, version="2") and key(x) != key(x, outputs=("Y",))
    assert key(x) != key(x.reshape(2, 2))
