"""tritonclient's own gRPC example flows for Triton's classic example models (`simple_string`, `simple_int8`, built
by `make models`), run from a separate process (clients/triton_examples.py) against the demo repository. The
client checks what the examples check; this side checks the answers again with numpy."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.interop

SCRIPT = "triton_examples.py"


@pytest.fixture
def server(slotserve, demo_repository):
    return slotserve(demo_repository, parallel_jobs=2)


def _decimal(texts: list[str]) -> np.ndarray:
    assert all(text == str(int(text)) for text in texts), texts  # plain decimal text: no padding, sign or ".0"
    return np.array([int(text) for text in texts], dtype=np.int64)


def test_simple_grpc_string_infer_client_flow(server, run_client):
    result = run_client(SCRIPT, server.address, "string")
    a, b = np.asarray(result["INPUT0"]).reshape(-1), np.asarray(result["INPUT1"]).reshape(-1)
    np.testing.assert_array_equal(_decimal(result["OUTPUT0"]), a + b)
    np.testing.assert_array_equal(_decimal(result["OUTPUT1"]), a - b)
    assert result["identity_nul"] == ["he\x00llo"] * 16
    assert result["identity_binary"] == ["\x00\x01\x02\x03"] * 16


def test_grpc_explicit_int8_content_client_flow(server, run_client):
    result = run_client(SCRIPT, server.address, "explicit_int8")
    for label in ("example", "extremes"):
        entry = result[label]
        a, b = np.asarray(entry["INPUT0"], np.int8), np.asarray(entry["INPUT1"], np.int8)
        np.testing.assert_array_equal(np.asarray(entry["OUTPUT0"]).reshape(-1), a + b)  # int8: wraps
        np.testing.assert_array_equal(np.asarray(entry["OUTPUT1"]).reshape(-1), a - b)
    assert result["extremes"]["OUTPUT0"][0][0] == -128  # 127 + 1 wrapped
    assert result["wrong_version"]["code"] == "INVALID_ARGUMENT"
    assert "wrong_specification" in result["wrong_version"]["details"]


def test_grpc_explicit_int8_content_client_prints_its_pass_line(server, run_client):
    """The example prints its PASS line only when the refusal of version 'wrong_specification' has Triton's
    wording."""
    details = run_client(SCRIPT, server.address, "explicit_int8")["wrong_version"]["details"]
    assert "failed to get model version from specified version string 'wrong_specification'" in details


def test_grpc_explicit_byte_content_client_flow(server, run_client):
    result = run_client(SCRIPT, server.address, "explicit_byte")
    a, b = _decimal(result["INPUT0"]), _decimal(result["INPUT1"])
    np.testing.assert_array_equal(_decimal(result["OUTPUT0"]), a + b)
    np.testing.assert_array_equal(_decimal(result["OUTPUT1"]), a - b)
